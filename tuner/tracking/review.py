"""What makes the MLflow runs readable: run names that say what a trial is, key metrics, plots as artifacts.

The tracker (tuner.tracking.tracker) writes; this module decides what an operator sees first.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial

from tuner.measure.records import RequestRecord
from tuner.spec import AgentSpec
from tuner.study.objectives import FAILURE_CONSTRAINT, Evaluation
from tuner.tracking.tracker import Tracker

log = logging.getLogger(__name__)

# always among the key metrics when measured (the rest: the objectives and the SLO metrics)
ALWAYS_KEY = ("output_throughput", "request_throughput", "p99_ttft_ms", "p99_itl_ms", "error_rate")


def slo_metric_name(metric: str) -> str:
    """`ttft_ms.p99` -> `p99_ttft_ms`, the name the measurement's flat metrics use; others unchanged."""
    if "." in metric:
        base, stat = metric.split(".", 1)
        return f"{stat}_{base}"
    return metric


def broken_slos(ev: Evaluation) -> list[str]:
    return [k.split(":", 1)[1] for k, v in ev.constraints.items() if k.startswith("slo:") and v > 0]


def trial_run_name(number: int, *, baseline: bool, ev: Evaluation, cause: str | None, pruned: bool = False) -> str:
    """`trial-12 infeasible ttft_ms.p99`, `trial-3 failed out_of_memory`, `trial-0 baseline feasible`,
    `trial-5 pruned ttft_ms.p99` (stopped early)."""
    head = f"trial-{number}" + (" baseline" if baseline else "")
    if cause is not None:
        return f"{head} failed {cause}"
    if pruned:
        return f"{head} pruned {' '.join(broken_slos(ev))}".rstrip()
    if ev.feasible:
        return f"{head} feasible"
    broken = broken_slos(ev)
    return f"{head} infeasible {' '.join(broken)}".rstrip()


def key_metrics(spec: AgentSpec, metrics: Mapping[str, float]) -> dict[str, float]:
    """The few numbers an operator compares trials by: objectives, SLO metrics, throughput, p99 latencies."""
    names = [o.metric for o in spec.objectives] + [slo_metric_name(s.metric) for s in spec.slos] + list(ALWAYS_KEY)
    return {n: float(metrics[n]) for n in dict.fromkeys(names) if n in metrics}


def trial_metrics(spec: AgentSpec, ev: Evaluation, metrics: Mapping[str, float],
                  measured: bool) -> tuple[dict[str, float], dict[str, float]]:
    """(key metrics, the rest) for a trial run. A trial that measured nothing logs no metric at all: its
    objective values and violations are placeholders that would distort every chart (tags say why)."""
    if not measured:
        return {}, {}
    key = key_metrics(spec, metrics)
    vals = {f"objective_{i}_{o.metric}": v for i, (o, v) in enumerate(zip(spec.objectives, ev.values, strict=True))}
    cons = {f"violation_{k.replace(':', '_').replace('.', '_')}": v for k, v in ev.constraints.items()
            if k != FAILURE_CONSTRAINT}
    rest = {k: v for k, v in {**metrics, **vals, **cons}.items() if k not in key}
    return key, rest


def _log_pngs(tracker: Tracker, run_id: str | None, pngs: Mapping[str, bytes], folder: str) -> None:
    if run_id is None or not pngs:
        return
    with tempfile.TemporaryDirectory() as d:
        for name, data in pngs.items():
            p = Path(d) / f"{name}.png"
            p.write_bytes(data)
        tracker.log_dir(run_id, Path(d), folder)


def log_latency_plot(tracker: Tracker, run_id: str | None, records: Sequence[RequestRecord], title: str) -> None:
    if run_id is None or not records:
        return
    try:  # the import too: a plotting library that fails to load (a venv being reinstalled) must not either
        from tuner.tracking.plots import latency_cdf

        data = latency_cdf(records, title=title)
    except Exception as exc:  # noqa: BLE001 - a plot must never fail a trial
        log.warning("latency plot of %s failed: %s", title, exc)
        return
    if data is not None:
        _log_pngs(tracker, run_id, {"latency_cdf": data}, "plots")


def log_cycle_plots(tracker: Tracker, run_id: str | None, trials: Sequence[FrozenTrial], spec: AgentSpec) -> None:
    """The study's plots (every trial so far) on the cycle's run, under plots/."""
    if run_id is None or not tracker.enabled:
        return
    try:
        from tuner.tracking.plots import study_plots

        pngs = study_plots(trials, spec)
    except Exception as exc:  # noqa: BLE001 - plots are a view; the trials are recorded already
        log.warning("cycle plots failed: %s", exc)
        return
    _log_pngs(tracker, run_id, pngs, "plots")


def trial_parent(trial: FrozenTrial | None) -> Any:
    """The MLflow run of the cycle that ran `trial` (recorded at tell), or None."""
    return None if trial is None else trial.user_attrs.get("cycle_run_id")
