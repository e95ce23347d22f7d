"""The `max_rate_under_slo` objective: per trial, a bounded capacity search on the deployed configuration.

A trial of an agent whose objectives name `max_rate_under_slo` does not run its workload once: on the one
deployment it runs the capacity search (tuner.measure.capacity.find_capacity) with short open-loop runs of
the workload's requests (tuner.study.sizing.probe_run), growing the rate from `search.start_rate_per_s` by
`search.growth` until a run breaks an upper-bound SLO (or saturates), then narrowing the bracket to
`search.rel_tol`, at most `search.max_runs` runs. The trial's measurement is the run at the highest rate that
met the SLOs (so its other objectives and SLO verdicts are those of that rate; feasible), or, when none did,
the run at the lowest rate tried (infeasible, value 0). Its summary carries the found rate
(`max_rate_under_slo`) and the search's cost (`capacity_probe_runs`, `capacity_probe_load_s`: seconds of
load, `capacity_probe_wall_s`); `Measurement.capacity_search` holds every probe's figures, which the loop
records in the trial (user attribute `capacity_search`) and its MLflow run (capacity_search.json).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tuner.measure.capacity import CapacityStep, default_backlog_s, find_capacity
from tuner.measure.measurement import Measurement
from tuner.spec import AgentSpec, CapacitySearchSpec

RATE_METRIC = "max_rate_under_slo"
# the per-probe figures kept in the trial's record (the probe's whole summary goes to MLflow's JSON)
PROBE_KEYS = ("completed", "failed", "duration", "request_throughput", "output_throughput", "p99_ttft_ms",
              "p99_tpot_ms", "p99_e2el_ms", "saturated", "offered_rate_per_s")


def search_spec(spec: AgentSpec) -> CapacitySearchSpec | None:
    """The bounds of the capacity search of `spec`'s `max_rate_under_slo` objective; None without one."""
    for o in spec.objectives:
        if o.metric == RATE_METRIC:
            return o.search or CapacitySearchSpec()
    return None


def probe_seconds(spec: AgentSpec, bounds: CapacitySearchSpec, rate_per_s: float) -> float:
    """Seconds of arrivals of one probe at `rate_per_s`: `bounds.run_s`, else as the rate sizing's runs."""
    from tuner.study.sizing import run_seconds

    return bounds.run_s if bounds.run_s is not None else run_seconds(spec.workload, rate_per_s)


def measure_max_rate(dep: Any, spec: AgentSpec, *, seed: int, base_dir: Path, stop: Any = None,
                     goodput_ms: Mapping[str, float] | None = None,
                     on_step: Callable[[CapacityStep, int], None] | None = None) -> Measurement:
    """Run the bounded capacity search on the deployment `dep` and return the trial's measurement (see the
    module's docstring). Raises Interrupted when `stop` is set, a classified TrialError when the server fails."""
    from tuner.study.sizing import probe_run, slo_limits

    bounds = search_spec(spec) or CapacitySearchSpec()
    slos = slo_limits(spec)
    backlog_s = default_backlog_s(slos)
    runs: list[tuple[float, Measurement, float]] = []  # (rate, measurement, wall seconds)
    t0 = time.monotonic()

    def run(rate: float) -> Measurement:
        ts = time.monotonic()
        m = probe_run(dep, spec.workload, rate, run_s=probe_seconds(spec, bounds, rate), seed=seed + len(runs),
                      base_dir=base_dir, backlog_s=backlog_s, stop=stop, goodput_ms=goodput_ms, telemetry=True)
        runs.append((rate, m, time.monotonic() - ts))
        return m

    res = find_capacity(run, slos, start_rate_per_s=bounds.start_rate_per_s,
                        max_rate_per_s=bounds.max_rate_per_s or math.inf, min_rate_per_s=bounds.min_rate_per_s,
                        rel_tol=bounds.rel_tol, max_runs=bounds.max_runs, growth=bounds.growth, on_step=on_step)
    wall_s = time.monotonic() - t0
    passing = [i for i, s in enumerate(res.steps) if s.ok and s.rate_per_s == res.rate_per_s]
    pick = passing[-1] if passing else min(range(len(runs)), key=lambda i: runs[i][0])
    load_s = sum(float(m.summary.get("duration", 0.0) or 0.0) for _, m, _ in runs)
    probes = [{"rate_per_s": rate, "ok": step.ok, "worst_ratio": step.worst_ratio if
               math.isfinite(step.worst_ratio) else None, "violations": "; ".join(step.violations),
               "wall_s": round(w, 3), **{k: m.summary[k] for k in PROBE_KEYS if k in m.summary}}
              for (rate, m, w), step in zip(runs, res.steps, strict=True)]
    record = {"rate_per_s": res.rate_per_s, "converged": res.converged, "upper_rate_per_s": res.upper_rate_per_s,
              "runs": len(runs), "max_runs": bounds.max_runs, "load_s": round(load_s, 3), "wall_s": round(wall_s, 3),
              "measured_at_rate_per_s": runs[pick][0], "probes": probes}
    m = runs[pick][1]
    summary = {**m.summary, RATE_METRIC: float(res.rate_per_s), "capacity_probe_runs": float(len(runs)),
               "capacity_probe_load_s": load_s, "capacity_probe_wall_s": wall_s,
               "capacity_converged": float(res.converged)}
    note = (f"{RATE_METRIC}: {res.rate_per_s:.4g} req/s found in {len(runs)} probe run(s) "
            f"({'converged' if res.converged else 'not converged'}, {load_s:.0f} s of load); the figures are "
            f"those of the run at {runs[pick][0]:.4g} req/s")
    return dataclasses.replace(m, summary=summary, notes=(*m.notes, note), capacity_search=record)
