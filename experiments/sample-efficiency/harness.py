"""Shared pieces of the sample-efficiency study: noise-free evaluation of a configuration, and one tuning run
through the tuner's own loop (open_session + run_cycle), as `tuner run` drives it, with tracking off."""

from __future__ import annotations

import dataclasses
import math
import tempfile
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.agent import Agent, load_agent
from tuner.errors import TrialError
from tuner.loop import TrialOutcome, measure_config, open_session, run_cycle
from tuner.measure.measurement import Measurement
from tuner.placement.gpupool import GpuPool
from tuner.study.objectives import evaluate
from tuner.targets.base import Deployment, Target, TrialContext
from tuner.targets.registry import make_target
from tuner.targets.sim import SimTarget
from tuner.tracking.tracker import Tracker

ROOT = Path(__file__).resolve().parents[2]


def load(agent_path: str, *, noise_cv: float | None = 0.0, sampler: dict[str, Any] | None = None) -> Agent:
    """The agent with its noise set (0: noise-free) and its sampler replaced by `sampler` (when given)."""
    agent = load_agent(ROOT / agent_path)
    opts = agent.target_options
    if noise_cv is not None and hasattr(opts, "noise_cv"):
        opts = opts.model_copy(update={"noise_cv": noise_cv})
    spec = agent.spec
    if sampler is not None:
        spec = spec.model_copy(update={"sampler": type(spec.sampler).model_validate(sampler)})
    spec = spec.model_copy(update={"tracking": spec.tracking.model_copy(update={"enabled": False})})
    return agent.model_copy(update={"spec": spec, "target_options": opts})


@dataclass
class Evaluator:
    """Deploys and measures configurations of one agent, as the loop does (measure_config + evaluate)."""

    agent: Agent
    target: Target
    state_dir: Path
    calls: int = 0

    @classmethod
    def of(cls, agent: Agent, state_dir: Path) -> Evaluator:
        target = make_target(agent.spec.target.kind, agent.target_options, agent.path.parent)
        return cls(agent, target, state_dir)

    def value(self, params: dict[str, Any], seed: int = 0) -> tuple[float, bool, str | None]:
        """(objective 0, feasible, failure cause) of `params`; a constraint violation is (0, False, 'constraint')."""
        space = self.agent.space
        if space.violations(params):
            return 0.0, False, "constraint"
        self.calls += 1
        from tuner.loop import Session

        session = Session(agent=self.agent, state_dir=self.state_dir, target=self.target,
                          study=None, tracker=None)  # type: ignore[arg-type] - measure_config reads neither
        ctx = TrialContext(trial_number=0, state_dir=self.state_dir, seed=seed, stop_event=threading.Event())
        try:
            m, _ = measure_config(session, space.full_config(params), ctx)
        except TrialError as exc:
            return 0.0, False, exc.cause
        ev = evaluate(m, self.agent.spec.objectives, self.agent.spec.slos)
        v = ev.values[0]
        return (v if math.isfinite(v) else 0.0), ev.feasible, None


class _Replay(Deployment):
    def __init__(self, m: Measurement) -> None:
        self.m = m
        self.cold_start_s = m.cold_start_s

    def measure(self, workload: Any, *, goodput_ms: Any, seed: int) -> Measurement:
        return self.m


class _Recording(Deployment):
    def __init__(self, inner: Deployment, cache: dict[str, Any], key: str) -> None:
        self.inner, self.cache, self.key = inner, cache, key
        self.cold_start_s = inner.cold_start_s

    def measure(self, workload: Any, *, goodput_ms: Any, seed: int) -> Measurement:
        m = self.inner.measure(workload, goodput_ms=goodput_ms, seed=seed)
        self.cache[self.key] = dataclasses.replace(m, records=())  # the summary is what the loop evaluates
        return m


class CachedSimTarget(SimTarget):
    """The sim target, noise-free, remembering each configuration's measurement (or refusal): with noise off
    a configuration measures the same every time, so a repeat (the baseline of every run) costs nothing."""

    def __init__(self, options: Any, *, agent_dir: Path, cache: dict[str, Any]) -> None:
        if options.noise_cv:
            raise ValueError("only a noise-free sim target may replay measurements")
        super().__init__(options, agent_dir=agent_dir)
        self.cache = cache

    @contextmanager
    def deploy(self, params: Mapping[str, Any], ctx: TrialContext) -> Iterator[Deployment]:
        key = repr(sorted(params.items()))
        hit = self.cache.get(key)
        if isinstance(hit, TrialError):
            raise hit
        if hit is not None:
            yield _Replay(hit)
            return
        try:
            with super().deploy(params, ctx) as dep:
                yield _Recording(dep, self.cache, key)
        except TrialError as exc:
            self.cache[key] = exc
            raise


CACHE: dict[str, Any] = {}


def tune(agent: Agent, trials: int, *, cache: dict[str, Any] | None = None,
         target_cls: type[CachedSimTarget] = CachedSimTarget) -> list[TrialOutcome]:
    """One tuning run of `trials` budget trials through the tuner's loop (open_session + run_cycle, as
    `tuner run`), storage in memory, tracking off; the outcomes in trial order."""
    with tempfile.TemporaryDirectory(prefix="se-") as tmp:
        d = Path(tmp)
        spec = agent.spec.model_copy(update={"storage": "memory:"})
        agent = agent.model_copy(update={"spec": spec})
        tracker = Tracker("file:" + str(d / "mlruns"), spec.name, enabled=False)
        target = target_cls(agent.target_options, agent_dir=agent.path.parent,
                                 cache=CACHE if cache is None else cache)
        session = open_session(agent, d, tracker=tracker, target=target)
        result = run_cycle(session, trials=trials, gpu_pool=GpuPool([]))
        return sorted(result.outcomes, key=lambda o: o.number)
