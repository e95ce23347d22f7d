"""Plots of a study and of one trial's latencies, as PNG bytes (matplotlib, Agg; no display, no network).

Study plots are drawn from measured trials only: a trial that failed before measuring carries placeholder
objective values in Optuna (so the sampler learns to avoid it) that would distort every axis. Failed trials
appear only on the SLO-feasibility map, at their parameters, marked as failed.
"""

from __future__ import annotations

import io
import logging
import math
import threading
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display, safe in daemons and CI

import optuna  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from optuna.trial import FrozenTrial, TrialState  # noqa: E402

from tuner.measure.records import RequestRecord  # noqa: E402
from tuner.spec import AgentSpec  # noqa: E402

log = logging.getLogger(__name__)

# optuna.visualization.matplotlib draws through pyplot, whose figure registry is global
_PYPLOT_LOCK = threading.Lock()
DPI = 100


def measured(t: FrozenTrial) -> bool:
    """A completed trial whose values come from a measurement (not a failure's placeholders)."""
    return t.state == TrialState.COMPLETE and "cause" not in t.user_attrs and bool(t.values)


def failed(t: FrozenTrial) -> bool:
    return t.state == TrialState.FAIL or (t.state == TrialState.COMPLETE and "cause" in t.user_attrs)


def png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return buf.getvalue()


def _measured_study(trials: Sequence[FrozenTrial], spec: AgentSpec) -> optuna.Study:
    study = optuna.create_study(directions=[o.direction for o in spec.objectives])
    study.add_trials([t for t in trials if measured(t)])
    return study


def _pyplot_png(draw: Callable[[], Any]) -> bytes:
    """Run an optuna.visualization.matplotlib call and return its figure as PNG."""
    import matplotlib.pyplot as plt

    with _PYPLOT_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "experimental" and matplotlib's own notes on degenerate axes
        plt.close("all")
        try:
            ax = draw()
            fig = (ax.flat[0] if hasattr(ax, "flat") else ax).figure
            fig.set_size_inches(8, 5)
            return png(fig)
        finally:
            plt.close("all")


def study_plots(trials: Sequence[FrozenTrial], spec: AgentSpec) -> dict[str, bytes]:
    """Named PNGs: optimization_history, parallel_coordinates, param_importances, pareto_front (several
    objectives), slo_feasibility. A plot the trials cannot support yet (too few, one parameter) is left out
    and said at debug level."""
    from optuna.visualization import matplotlib as ovm

    study = _measured_study(trials, spec)
    obj0 = spec.objectives[0].metric
    names = [o.metric for o in spec.objectives]
    multi = len(spec.objectives) > 1
    first: Callable[[FrozenTrial], float] | None = (lambda t: t.values[0]) if multi else None
    out: dict[str, bytes] = {}
    makers: dict[str, Callable[[], Any]] = {
        "optimization_history": lambda: ovm.plot_optimization_history(study, target=first, target_name=obj0),
        "parallel_coordinates": lambda: ovm.plot_parallel_coordinate(study, target=first, target_name=obj0),
    }
    if multi:
        makers["pareto_front"] = lambda: ovm.plot_pareto_front(
            study, target_names=names, constraints_func=lambda t: list((t.constraints or {}).values()))
    n = len(study.trials)
    for name, draw in makers.items():
        if n < 2:
            break
        try:
            out[name] = _pyplot_png(draw)
        except Exception as exc:  # noqa: BLE001 - one plot the data cannot make must not lose the others
            log.debug("plot %s skipped: %s", name, exc)
    importances = _importances(study, first) if n >= 2 else {}
    if importances:
        out["param_importances"] = importance_bars(importances, obj0)
    fmap = feasibility_map(trials, spec, importances=list(importances))
    if fmap is not None:
        out["slo_feasibility"] = fmap
    return out


def _importances(study: optuna.Study, target: Callable[[FrozenTrial], float] | None) -> dict[str, float]:
    """Optuna's parameter importances (computed once: the bar chart and the feasibility map's axes use them)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return dict(optuna.importance.get_param_importances(study, target=target))
    except Exception:  # noqa: BLE001 - too few trials or a single distinct value
        return {}


def importance_bars(importances: dict[str, float], objective: str) -> bytes:
    fig = Figure(figsize=(8, 0.5 * len(importances) + 1.5))
    ax = fig.add_subplot()
    names = list(importances)[::-1]  # the most important on top
    vals = [importances[n] for n in names]
    ax.barh(names, vals, color="tab:blue")
    for i, v in enumerate(vals):
        ax.annotate(f"{v:.2f}", (v, i), xytext=(3, -3), textcoords="offset points", fontsize=8)
    ax.set_xlabel(f"importance for {objective}")
    ax.set_title("Parameter importance")
    ax.set_xlim(0, max(vals + [0.01]) * 1.15)
    return png(fig)


def feasibility_map(trials: Sequence[FrozenTrial], spec: AgentSpec, *, importances: Sequence[str] = ()) -> bytes | None:
    """The two most important parameters (else the first two), each trial marked feasible, breaking an SLO,
    or failed (with its cause). None when no trial has two numeric parameters."""
    done = [t for t in trials if measured(t) or failed(t)]
    numeric = _numeric_params(done)
    axes = [p for p in importances if p in numeric] + [p for p in numeric if p not in importances]
    if len(axes) < 1 or not done:
        return None
    xs, ys = axes[0], (axes[1] if len(axes) > 1 else None)
    fig = Figure(figsize=(8, 5))
    ax = fig.add_subplot()
    groups = {"feasible": ("o", "tab:green"), "breaks an SLO": ("^", "tab:orange"), "failed": ("x", "tab:red")}
    for label, (marker, colour) in groups.items():
        pts = [t for t in done if _group(t) == label and xs in t.params and (ys is None or ys in t.params)]
        if not pts:
            continue
        ax.scatter([_num(t.params[xs]) for t in pts], [_num(t.params[ys]) if ys else 0 for t in pts],
                   marker=marker, c=colour, s=60, label=f"{label} ({len(pts)})")
        for t in pts:
            ax.annotate(str(t.number), (_num(t.params[xs]), _num(t.params[ys]) if ys else 0), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel(xs)
    ax.set_ylabel(ys or "")
    if _log_scale(done, xs):
        ax.set_xscale("log")
    if ys and _log_scale(done, ys):
        ax.set_yscale("log")
    slos = ", ".join(s.key.split(":", 1)[1] for s in spec.slos) or "no SLOs"
    ax.set_title(f"SLO feasibility ({slos}); numbers are trials")
    ax.legend(loc="best", fontsize=8)
    return png(fig)


def _group(t: FrozenTrial) -> str:
    if failed(t):
        return "failed"
    return "feasible" if t.user_attrs.get("feasible") else "breaks an SLO"


def _numeric_params(trials: Iterable[FrozenTrial]) -> list[str]:
    names: dict[str, bool] = {}
    for t in trials:
        for k, v in t.params.items():
            ok = isinstance(v, int | float) and not isinstance(v, bool)
            names[k] = names.get(k, True) and ok
    return [k for k, ok in names.items() if ok]


def _num(v: Any) -> float:
    return float(v)


def _log_scale(trials: Iterable[FrozenTrial], name: str) -> bool:
    for t in trials:
        d = t.distributions.get(name)
        if d is not None:
            return bool(getattr(d, "log", False))
    return False


def latency_cdf(records: Sequence[RequestRecord], *, title: str = "") -> bytes | None:
    """TTFT and inter-token latency CDFs of the successful, non-warm-up requests; None when there are none."""
    ok = [r for r in records if r.ok and not r.warmup]
    ttft = sorted(v for r in ok if (v := r.ttft_ms) is not None and math.isfinite(v))
    itl = sorted(v for r in ok for v in r.itls_ms if math.isfinite(v))
    if not ttft and not itl:
        return None
    fig = Figure(figsize=(10, 4))
    for i, (name, vals) in enumerate((("TTFT (ms)", ttft), ("inter-token latency (ms)", itl))):
        ax = fig.add_subplot(1, 2, i + 1)
        if vals:
            n = len(vals)
            ax.step(vals, [(k + 1) / n for k in range(n)], where="post")
            for q, style in ((0.5, ":"), (0.99, "--")):
                v = vals[min(n - 1, math.ceil(q * n) - 1)]
                ax.axvline(v, linestyle=style, color="grey")
                ax.annotate(f"p{int(q * 100)} {v:.3g}", (v, q), fontsize=8, xytext=(4, -10),
                            textcoords="offset points")
        else:
            ax.text(0.5, 0.5, "no samples", ha="center", transform=ax.transAxes)
        ax.set_xlabel(name)
        ax.set_ylabel("fraction of requests" if i == 0 else "fraction of tokens")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    return png(fig)


def signal_plot(series: dict[str, tuple[list[float], list[float]]], *, event_time: float,
                baselines: dict[str, float | None] | None = None, onsets: dict[str, float | None] | None = None,
                title: str = "") -> bytes | None:
    """The monitored signals around a change: one panel per signal (value per window against seconds from the
    event), its baseline dashed, the located onset dotted, the event at 0. None without values."""
    named = [(n, t, v) for n, (t, v) in series.items() if v]
    if not named:
        return None
    fig = Figure(figsize=(8, 2.2 * len(named)))
    for i, (name, times, vals) in enumerate(named):
        ax = fig.add_subplot(len(named), 1, i + 1)
        ax.plot([t - event_time for t in times], vals, marker=".", linewidth=1)
        base = (baselines or {}).get(name)
        if base is not None:
            ax.axhline(base, linestyle="--", color="grey", label="baseline")
        onset = (onsets or {}).get(name)
        if onset is not None:
            ax.axvline(onset - event_time, linestyle=":", color="tab:orange", label="onset")
        ax.axvline(0.0, color="tab:red", label="event")
        ax.set_ylabel(name, fontsize=8)
        ax.grid(alpha=0.3)
        if i == 0:
            ax.legend(fontsize=7, loc="upper left")
    fig.axes[-1].set_xlabel("seconds from the event")
    if title:
        fig.suptitle(title, fontsize=9)
    return png(fig)
