"""The cross-evaluation matrix: every scenario's champion (and the baseline) measured on every scenario's
workload, in interleaved rounds (each round measures every configuration once, so slow drift of the machine
hits all alike), and the gain of each scenario's own champion over the baseline and over each other champion on
that scenario's traffic, with a two-sided interval (tuner.promotion.stats.paired_interval on the paired rounds).

A scenario's workload is the one its study tunes on (fitted from observed traffic, else declared); a scenario
with neither has no column. Configurations that are identical are measured once. The result is written to
<state>/<agent>/scenarios/matrix.json and to an MLflow run tagged kind=cross_evaluation.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from tuner.context import AgentContext
from tuner.errors import Interrupted, TrialError
from tuner.promotion.stats import paired_interval
from tuner.scenarios.session import plan_cycle
from tuner.scenarios.store import ScenarioBook
from tuner.study.objectives import evaluate

log = logging.getLogger(__name__)

MATRIX_SEED_BASE = 200_000
BASELINE = "baseline"


def cross_evaluate(ctx: AgentContext, *, runs: int = 3, stop: threading.Event | None = None,
                   confidence: float | None = None) -> dict[str, Any]:
    """Measure the matrix (see the module docstring). Returns what matrix.json holds."""
    from tuner.loop import measure_config
    from tuner.targets.base import TrialContext

    if runs < 2:
        raise ValueError("a cross-evaluation needs at least 2 runs per cell (the intervals are paired)")
    stop = stop or threading.Event()
    spec = ctx.agent.spec
    obj = spec.objectives[0]
    conf = confidence or spec.promotion.confidence
    book = ScenarioBook(ctx.state_dir, ctx.name)
    scenarios = book.all(spec)
    champions = {s.name: c for s in scenarios if (c := book.champions(s.name).champion()) is not None}
    space = ctx.agent.space
    configs: dict[str, dict[str, Any]] = {BASELINE: space.full_config(space.defaults())}
    configs |= {n: dict(c.config) for n, c in champions.items()}
    # one measurement per distinct configuration: the others read the same values
    distinct: dict[str, str] = {}
    for name, cfg in configs.items():
        distinct[name] = next((k for k, v in configs.items() if v == cfg and k in distinct.values()), name)
    cells: dict[str, dict[str, Any]] = {}
    gains: dict[str, dict[str, Any]] = {}
    for s in scenarios:
        if stop.is_set():
            break
        if book.fitted(s.name) is None and s.workload is None:
            continue
        planned = plan_cycle(ctx, None, s.name)
        session = planned.session
        values: dict[str, list[float | None]] = {k: [] for k in set(distinct.values())}
        feasible: dict[str, list[bool]] = {k: [] for k in values}
        for r in range(runs):
            for key in sorted(values):
                if stop.is_set():
                    break
                seed = spec.workload.seed + MATRIX_SEED_BASE + 100 * r
                tctx = TrialContext(trial_number=-1, state_dir=ctx.state_dir, seed=seed, stop_event=stop,
                                    label=f"matrix-{s.name}-{key}-{r + 1}")
                try:
                    m, _ = measure_config(session, configs[key], tctx)
                except Interrupted:
                    break
                except TrialError as exc:
                    log.warning("cross-evaluation %s on %s, run %d failed: %s", key, s.name, r + 1, exc)
                    values[key].append(None)
                    feasible[key].append(False)
                    continue
                ev = evaluate(m, spec.objectives, spec.slos)
                values[key].append(ev.values[0])
                feasible[key].append(ev.feasible)
        col = {n: {"values": values[distinct[n]], "feasible": feasible[distinct[n]],
                   "same_as": distinct[n] if distinct[n] != n else None} for n in configs}
        cells[s.name] = {"workload_source": planned.workload_source, "study": session.study.name, "configs": col}
        own = s.name if s.name in configs else BASELINE
        gains[s.name] = {"own": own, "vs": {}}
        for other in configs:
            if other == own:
                continue
            gains[s.name]["vs"][other] = _gain(values[distinct[own]], values[distinct[other]], obj.direction, conf,
                                               same=distinct[own] == distinct[other])
    out = {"time": time.time(), "runs": runs, "confidence": conf, "objective": f"{obj.metric}:{obj.direction}",
           "configs": configs, "cells": cells, "gains": gains}
    book.set_matrix(out)
    _record(ctx, out)
    return out


def _gain(own: list[float | None], other: list[float | None], direction: str, confidence: float, *,
          same: bool) -> dict[str, Any]:
    if same:
        return {"improvement": 0.0, "low": 0.0, "high": 0.0, "n": len(own), "note": "the same configuration"}
    pairs = [(b, a) for a, b in zip(own, other, strict=False) if a is not None and b is not None and a > 0 and b > 0]
    if len(pairs) < 2:
        return {"improvement": None, "low": None, "high": None, "n": len(pairs),
                "note": "fewer than 2 paired runs measured"}
    ref, cand = [p[0] for p in pairs], [p[1] for p in pairs]
    est, low, high = paired_interval(ref, cand, direction=direction, confidence=confidence)
    return {"improvement": est, "low": low, "high": high, "n": len(pairs)}


def _record(ctx: AgentContext, out: dict[str, Any]) -> None:
    tr = ctx.tracker()
    if not tr.enabled:
        return
    run_id = tr.start_run("cross-evaluation", tags={"kind": "cross_evaluation", "agent": ctx.name},
                          params={"runs": out["runs"], "confidence": out["confidence"], "objective": out["objective"]})
    metrics = {f"gain.{s}.vs.{o}": g["improvement"] for s, row in out["gains"].items()
               for o, g in row["vs"].items() if g.get("improvement") is not None}
    tr.log(run_id, metrics=metrics)
    tr.log_text(run_id, json.dumps(out, indent=1, default=str), "matrix.json")
    tr.end_run(run_id)
