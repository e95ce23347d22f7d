"""`rate_per_s: auto`: a study's open-loop rate sized on this host, once, from the baseline's capacity.

Before a study's first trial, the baseline configuration (the search space's defaults) is deployed once and
the capacity search (tuner.measure.capacity) finds the highest rate at which it still meets the agent's
upper-bound SLOs, in short bounded runs. The study's rate is `load` x that rate. The figure, how it was found
and every run of the search are recorded in the study (user attribute `workload_rate`) and in MLflow (the
cycle run), and every later trial and cycle of the study reuses it: a study never changes its rate. A study
sized anew (another target, another `load`) is a new study lineage, as any workload change is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.errors import TrialError, TunerError
from tuner.measure.capacity import (
    CapacityResult,
    CapacityStep,
    capacity_workload,
    default_backlog_s,
    find_capacity,
    in_flight_limit,
)
from tuner.measure.measurement import Measurement
from tuner.spec import DEFAULT_LOAD, AgentSpec, Arrival, WorkloadSpec

if TYPE_CHECKING:
    from tuner.agent import Agent

log = logging.getLogger(__name__)

RATE_ATTR = "workload_rate"  # study user attribute
METHOD = "capacity_search"
START_RATE_PER_S = 4.0
MIN_RATE_PER_S = 0.25
RUN_S = 5.0  # shortest run of the search
MIN_REQUESTS = 10  # a run lasts long enough for about this many arrivals ...
MAX_RUN_S = 20.0  # ... but no longer than this
WARMUP_S = 0.5
WARMUP_RUN_S = 2.0
WARMUP_CONCURRENCY = 4
GROWTH = 2.0
MAX_RUNS = 8
REL_TOL = 0.25


class SizingError(TunerError):
    """`rate_per_s: auto` could not be sized: the baseline failed, or met the SLOs at no rate tried."""

    exit_code = 4


@dataclass(frozen=True)
class RateSizing:
    """The rate a study runs at and how it was found."""

    rate_per_s: float
    capacity_rate_per_s: float  # the baseline's highest rate meeting the SLOs
    load: float
    method: str = METHOD
    runs: int = 0
    converged: bool = False
    upper_rate_per_s: float | None = None  # lowest rate at which the baseline broke an SLO
    wall_s: float = 0.0
    sized_at: float = 0.0  # unix time
    steps: list[dict[str, Any]] = field(default_factory=list)

    def to_attr(self) -> dict[str, Any]:
        d = asdict(self)
        d["steps"] = [{k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in s.items()}
                      for s in self.steps]
        return d

    @classmethod
    def from_attr(cls, d: Any) -> RateSizing | None:
        if not isinstance(d, dict) or not isinstance(d.get("rate_per_s"), int | float):
            return None
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})

    def describe(self) -> str:
        found = "converged" if self.converged else "not converged"
        return (f"{self.rate_per_s:.3g} req/s = {self.load:g} x {self.capacity_rate_per_s:.3g} req/s, the baseline's "
                f"highest rate meeting the SLOs ({self.method}: {self.runs} run(s), {found}, {self.wall_s:.0f} s)")


def step_line(step: CapacityStep, runs: int) -> str:
    """One progress line of the search."""
    verdict = "meets the SLOs" if step.ok else "fails: " + "; ".join(step.violations)
    return f"sizing run {runs}/{MAX_RUNS} (max): baseline at {step.rate_per_s:.3g} req/s {verdict}"


def needs_rate(spec: AgentSpec) -> bool:
    return spec.workload.auto_rate


def recorded(study: Any) -> RateSizing | None:
    """The rate sizing recorded in an Optuna study (tuner.study.study.TunerStudy or optuna.Study), if any."""
    attrs = getattr(study, "study", study).user_attrs
    return RateSizing.from_attr(attrs.get(RATE_ATTR))


def apply(agent: Agent, sizing: RateSizing | None) -> Agent:
    """`agent` with its `auto` rate replaced by the sized one (unchanged without a sizing or an auto rate)."""
    if sizing is None or not needs_rate(agent.spec):
        return agent
    spec = agent.spec.model_copy(update={"workload": agent.spec.workload.with_rate(sizing.rate_per_s)})
    return agent.model_copy(update={"spec": spec})


def slo_limits(spec: AgentSpec) -> dict[str, float]:
    """The upper-bound SLOs the capacity search holds the baseline to."""
    return {s.metric: float(s.max) for s in spec.slos if s.max is not None}


def run_seconds(workload: WorkloadSpec, rate_per_s: float) -> float:
    """How long one run of the search lasts: as long as a trial's measurement at `rate_per_s` (a backlog that
    takes a trial's length to build counts), and at least MIN_REQUESTS arrivals long; within [RUN_S, MAX_RUN_S]."""
    trial_s = workload.duration_s if workload.duration_s is not None else (workload.num_requests or 0) / rate_per_s
    return min(max(RUN_S, trial_s, MIN_REQUESTS / rate_per_s), MAX_RUN_S)


def probe_run(dep: Any, workload: WorkloadSpec, rate_per_s: float, *, run_s: float, seed: int, base_dir: Any,
              backlog_s: float, stop: Any = None, goodput_ms: Mapping[str, float] | None = None,
              telemetry: bool = False) -> Measurement:
    """One run of a capacity search on the deployment `dep`: `workload`'s requests at `rate_per_s`, open loop,
    for `run_s` (capacity_workload). On a server the run stops early once its backlog shows it saturated (the
    summary's `saturated`), and a server that died or answered 5xx is a classified TrialError; `telemetry`: the
    server's /metrics and the GPUs are read as in a trial. Raises Interrupted when `stop` is set."""
    from tuner.errors import Interrupted
    from tuner.targets.process import HttpDeployment

    w = capacity_workload(workload, rate_per_s, run_s=run_s, warmup_s=WARMUP_S)
    if not isinstance(dep, HttpDeployment):
        return dep.measure(w, goodput_ms=goodput_ms or {}, seed=seed)  # type: ignore[no-any-return]
    from tuner.measure.loadgen import measure_endpoint

    m = measure_endpoint(dep.base_url, model=dep.model, workload=w, goodput_ms=goodput_ms or {}, seed=seed,
                         base_dir=base_dir, tokenizer=dep.tokenizer,
                         max_in_flight=in_flight_limit(rate_per_s, backlog_s),
                         stop_event=stop, metrics_url=dep.metrics_url if telemetry else None,
                         gpu_indices=dep.ctx.gpus if telemetry else ())
    if m.summary.get("interrupted"):
        raise Interrupted("stop requested during a capacity-search run")
    dep.check_after_run(m)  # the server died or answered 5xx: a classified failure
    return dataclasses.replace(m, cold_start_s=dep.cold_start_s)


def size(session: Any, *, on_step: Callable[[CapacityStep, int], None] | None = None,
         stop: Any = None) -> RateSizing:
    """Deploy the baseline of `session` (tuner.loop.Session) once and size its rate. Raises SizingError.

    One uncounted warm-up run first (a fresh server's first requests pay its lazy start-up), then the capacity
    search's runs (from START_RATE_PER_S, doubling or halving until bracketed, then narrowing to REL_TOL), each
    `run_seconds(rate)` of open-loop arrivals."""
    from tuner.errors import Interrupted
    from tuner.targets.base import TrialContext

    spec = session.agent.spec
    space = session.agent.space
    load = spec.workload.arrival.load or DEFAULT_LOAD
    slos = slo_limits(spec)
    backlog_s = default_backlog_s(slos)
    seed = spec.workload.seed
    config = space.full_config(space.defaults())
    ctx = TrialContext(trial_number=0, state_dir=session.state_dir, seed=seed, label="sizing-baseline")
    if stop is not None:
        ctx.stop_event = stop
    t0 = time.monotonic()
    try:
        with contextlib.ExitStack() as stack:
            need = session.target.gpus_needed(config)
            if need > 0:
                from tuner.placement.gpupool import GpuPool

                pool = GpuPool(spec.gpus)
                if pool.total > 0:
                    ctx.gpus = tuple(stack.enter_context(pool.claim(need, ctx.stop_event, label="sizing")))
            dep = stack.enter_context(session.target.deploy(config, ctx))

            def run(rate: float) -> Measurement:
                return probe_run(dep, spec.workload, rate, run_s=run_seconds(spec.workload, rate), seed=seed,
                                 base_dir=session.agent.path.parent, backlog_s=backlog_s, stop=ctx.stop_event)

            # warm-up (not counted): a fresh server's first requests pay its lazy start-up
            w_up = spec.workload.model_copy(update={
                "arrival": Arrival(kind="closed", concurrency=WARMUP_CONCURRENCY), "num_requests": None,
                "duration_s": WARMUP_RUN_S, "warmup_s": 0.0, "warmup_requests": 0, "cooldown_s": 0.0})
            dep.measure(w_up, goodput_ms={}, seed=seed)
            res = find_capacity(run, slos, start_rate_per_s=START_RATE_PER_S, min_rate_per_s=MIN_RATE_PER_S,
                                rel_tol=REL_TOL, max_runs=MAX_RUNS, growth=GROWTH, on_step=on_step)
            if ctx.stop_event.is_set():
                raise Interrupted("stopped while sizing the rate")
    except Interrupted:
        raise
    except TrialError as exc:
        raise SizingError(f"rate_per_s: auto: the baseline could not be measured ({exc.cause}): {exc}") from None
    return _result(res, load, time.monotonic() - t0, slos)


def _result(res: CapacityResult, load: float, wall_s: float, slos: dict[str, float]) -> RateSizing:
    if res.rate_per_s <= 0:
        last = res.steps[-1] if res.steps else None
        why = f"at {last.rate_per_s:.3g} req/s: {'; '.join(last.violations)}" if last else "no run"
        raise SizingError(
            f"rate_per_s: auto: the baseline met the SLOs ({', '.join(f'{k} <= {v:g}' for k, v in slos.items())}) "
            f"at no rate tried, down to {MIN_RATE_PER_S:g} req/s ({why}); loosen the SLOs, give a fixed "
            "rate_per_s, or start from a faster baseline (the search space's defaults)")
    return RateSizing(rate_per_s=round(load * res.rate_per_s, 4), capacity_rate_per_s=round(res.rate_per_s, 4),
                      load=load, runs=len(res.steps), converged=res.converged,
                      upper_rate_per_s=res.upper_rate_per_s, wall_s=round(wall_s, 2), sized_at=time.time(),
                      steps=[dict(s) for s in res.table()])


def ensure(session: Any, *, on_step: Callable[[CapacityStep, int], None] | None = None,
           stop: Any = None) -> RateSizing | None:
    """The study's rate: the recorded one, or sized now and recorded. None when the rate is not auto.

    Applies it to `session.agent`, so every trial of the session runs at it.
    """
    sizing = recorded(session.study)  # (open_session applied it already)
    if sizing is None and not needs_rate(session.agent.spec):
        return None
    if sizing is None:
        log.info("sizing the workload's rate (rate_per_s: auto) on the baseline: up to %d runs of %g-%g s",
                 MAX_RUNS, RUN_S, MAX_RUN_S)
        sizing = size(session, on_step=on_step, stop=stop)
        again = recorded(session.study)  # another process sized the same study meanwhile: its figure stands
        if again is not None:
            sizing = again
        else:
            session.study.study.set_user_attr(RATE_ATTR, sizing.to_attr())
        log.info("workload rate: %s", sizing.describe())
    session.agent = apply(session.agent, sizing)
    return sizing
