"""Capacity search: the highest open-loop request rate at which given SLOs still hold.

A few short runs: grow the rate geometrically until one fails, then shrink the bracket [highest passing,
lowest failing] until it is narrower than `rel_tol`: by interpolation on the worst SLO ratio (value/limit)
where the failing end is only mildly over (ratio <= 2, clamped to the middle half of the bracket), by
bisection past a cliff. A run counts as failed when any SLO is violated or
when the server clearly cannot keep up (achieved request rate below `min_throughput_ratio` of the offered
rate, or the backlog in flight grew past a limit and the run stopped early).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tuner.measure.measurement import Measurement
from tuner.measure.metrics import offered_rate_per_s
from tuner.spec import Arrival, WorkloadSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CapacityStep:
    rate_per_s: float
    ok: bool
    worst_ratio: float  # max over SLOs of value/limit (>1 is a violation); inf when saturated
    violations: tuple[str, ...]
    summary: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class CapacityResult:
    rate_per_s: float  # highest passing rate found (0 when even the lowest tried failed)
    steps: tuple[CapacityStep, ...]
    converged: bool
    upper_rate_per_s: float | None = None  # lowest failing rate found

    def table(self) -> list[dict[str, float | bool | str]]:
        return [{"rate_per_s": s.rate_per_s, "ok": s.ok, "worst_ratio": s.worst_ratio,
                 "violations": "; ".join(s.violations)} for s in self.steps]


def check(m: Measurement, slos: Mapping[str, float], offered_rate: float | None = None,
          min_throughput_ratio: float = 0.9) -> tuple[bool, float, list[str]]:
    """(ok, worst value/limit ratio, violations) of one run. SLOs are upper limits by spec metric name."""
    worst = 0.0
    bad: list[str] = []
    for metric, limit in slos.items():
        v = m.value(metric)
        if math.isnan(v):
            bad.append(f"{metric} undefined")
            worst = math.inf
            continue
        ratio = v / limit if limit > 0 else (0.0 if v <= 0 else math.inf)
        worst = max(worst, ratio)
        if v > limit:
            bad.append(f"{metric}={v:.4g} > {limit:.4g}")
    if m.summary.get("saturated", 0.0) > 0:
        bad.append("saturated (backlog limit reached)")
        worst = math.inf
    # what was offered: the load generator's figure, else the requests' scheduled times (a simulator's run), else
    # the rate asked for
    offered = m.summary.get("offered_rate_per_s") or offered_rate_per_s(m.records) or offered_rate or 0.0
    if offered:
        # completions per second over the run, less one typical request latency (the drain at the end)
        s = m.summary
        med_ms = s.get("median_e2el_ms", 0.0)
        span = s.get("duration", 0.0) - (med_ms / 1000.0 if math.isfinite(med_ms) else 0.0)
        achieved = s.get("completed", 0.0) / max(span, 1e-3)
        if achieved < min_throughput_ratio * offered:
            bad.append(f"completed {achieved:.4g}/s < {min_throughput_ratio:g} x offered {offered:.4g}/s")
            worst = max(worst, min_throughput_ratio * offered / max(achieved, 1e-9))
    return not bad, worst, bad


def find_capacity(run: Callable[[float], Measurement], slos: Mapping[str, float], *, start_rate_per_s: float,
                  max_rate_per_s: float = math.inf, min_rate_per_s: float = 0.0, rel_tol: float = 0.1,
                  max_runs: int = 10, growth: float = 2.0,
                  min_throughput_ratio: float = 0.9,
                  on_step: Callable[[CapacityStep, int], None] | None = None) -> CapacityResult:
    """Search with `run(rate) -> Measurement` for the highest rate meeting `slos`.

    `on_step(step, runs so far)` is called after every run (a progress line)."""
    steps: list[CapacityStep] = []
    lo: CapacityStep | None = None
    hi: CapacityStep | None = None
    rate = min(start_rate_per_s, max_rate_per_s)
    converged = False
    while len(steps) < max_runs:
        m = run(rate)
        ok, worst, bad = check(m, slos, rate, min_throughput_ratio)
        step = CapacityStep(rate, ok, worst, tuple(bad), {k: v for k, v in m.summary.items()
                                                          if isinstance(v, float) and math.isfinite(v)})
        steps.append(step)
        log.info("capacity: %.4g req/s %s %s", rate, "ok" if ok else "fails", "; ".join(bad))
        if on_step is not None:
            on_step(step, len(steps))
        if ok:
            lo = step if lo is None or rate > lo.rate_per_s else lo
        else:
            hi = step if hi is None or rate < hi.rate_per_s else hi
        if lo is not None and hi is not None:
            if hi.rate_per_s - lo.rate_per_s <= rel_tol * lo.rate_per_s:
                converged = True
                break
            a, b = lo.rate_per_s, hi.rate_per_s
            rate = (a + b) / 2
            # interpolate only where the SLO degrades smoothly; past a cliff, bisect
            if 1.0 < hi.worst_ratio <= 2.0 and hi.worst_ratio > lo.worst_ratio:
                guess = a + (b - a) * (1.0 - lo.worst_ratio) / (hi.worst_ratio - lo.worst_ratio)
                rate = min(max(guess, a + 0.25 * (b - a)), b - 0.25 * (b - a))
        elif lo is not None:  # everything passed so far
            if lo.rate_per_s >= max_rate_per_s:
                converged = True
                break
            rate = min(lo.rate_per_s * growth, max_rate_per_s)
        else:  # everything failed so far
            assert hi is not None
            rate = hi.rate_per_s / growth
            if rate < min_rate_per_s:
                break
    return CapacityResult(rate_per_s=lo.rate_per_s if lo else 0.0, steps=tuple(steps), converged=converged,
                          upper_rate_per_s=hi.rate_per_s if hi else None)


def measure_capacity(base_url: str, *, model: str, workload: WorkloadSpec, slos: Mapping[str, float],
                     seed: int, start_rate_per_s: float = 8.0, run_s: float = 5.0, warmup_s: float = 0.5,
                     rel_tol: float = 0.1, max_runs: int = 10, max_rate_per_s: float = math.inf,
                     base_dir: Path | None = None, tokenizer: str | None = None,
                     backlog_s: float | None = None, min_rate_per_s: float = 0.0,
                     on_step: Callable[[CapacityStep, int], None] | None = None) -> CapacityResult:
    """find_capacity with short open-loop runs of `workload` (Poisson unless it names constant/gamma).

    A run stops early once more requests are in flight than `rate x backlog_s x 3` (default backlog_s:
    the largest ttft/e2el limit in `slos`, else 10 s): clearly saturated.
    """
    from tuner.measure.loadgen import measure_endpoint

    if backlog_s is None:
        backlog_s = default_backlog_s(slos)

    def run(rate: float) -> Measurement:
        spec = capacity_workload(workload, rate, run_s=run_s, warmup_s=warmup_s)
        limit = in_flight_limit(rate, backlog_s)
        return measure_endpoint(base_url, model=model, workload=spec, goodput_ms={}, seed=seed,
                                base_dir=base_dir, tokenizer=tokenizer, max_in_flight=limit)

    return find_capacity(run, slos, start_rate_per_s=start_rate_per_s, max_rate_per_s=max_rate_per_s,
                         min_rate_per_s=min_rate_per_s, rel_tol=rel_tol, max_runs=max_runs, on_step=on_step)


def capacity_workload(workload: WorkloadSpec, rate_per_s: float, *, run_s: float = 5.0,
                      warmup_s: float = 0.5) -> WorkloadSpec:
    """One short open-loop run of the capacity search: `workload`'s requests at `rate_per_s` for `run_s`
    (Poisson unless it names constant/gamma)."""
    kind = workload.arrival.kind if workload.arrival.kind in ("constant", "poisson", "gamma") else "poisson"
    return workload.model_copy(update={
        "arrival": Arrival(kind=kind, rate_per_s=rate_per_s, burstiness=workload.arrival.burstiness,
                           concurrency=None),
        "num_requests": None, "duration_s": run_s, "warmup_s": warmup_s, "warmup_requests": 0,
        "cooldown_s": 0.0,
    })


def default_backlog_s(slos: Mapping[str, float]) -> float:
    """The largest ttft/e2el limit in `slos` in seconds, else 10 s."""
    lat = [v / 1000.0 for k, v in slos.items() if k.startswith(("ttft_ms", "e2el_ms"))]
    return max(lat) if lat else 10.0


def in_flight_limit(rate_per_s: float, backlog_s: float) -> int:
    """Requests in flight past which a run at `rate_per_s` is clearly saturated and stops early."""
    return max(16, int(math.ceil(rate_per_s * backlog_s * 3)))
