"""A test double for promotion tests: a target whose throughput is known exactly, with seeded noise.

Passed in through `open_session(agent, state_dir, target=NoisyTarget(...))`. Parameters of a configuration:
`speed` (throughput = 100 * speed, noise-free), `ttft_ms` (p99 TTFT reported), `error_rate`, `flip` (how
many probe tokens differ from the reference). Every deploy is logged in `target.deploys` (label, seed, params).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from tuner.agent import Agent
from tuner.errors import DeployError
from tuner.measure.measurement import Measurement
from tuner.search.space import parse_space
from tuner.spec import AgentSpec, WorkloadSpec
from tuner.targets.base import Deployment, Target, TrialContext

PROBE = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]]


class NoisyOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    noise_cv: float = 0.0
    probe: bool = False


class NoisyDeployment(Deployment):
    def __init__(self, target: NoisyTarget, params: Mapping[str, Any], ctx: TrialContext) -> None:
        self.target = target
        self.params = dict(params)
        self.ctx = ctx

    def measure(self, workload: WorkloadSpec, *, goodput_ms: Mapping[str, float], seed: int) -> Measurement:
        cv = self.target.options.noise_cv  # type: ignore[attr-defined]
        factor = 1.0
        if cv > 0:
            sigma = math.sqrt(math.log1p(cv * cv))
            factor = float(np.random.default_rng(seed).lognormal(-sigma * sigma / 2, sigma))
        thr = 100.0 * float(self.params.get("speed", 1.0)) * factor
        summary = {"output_throughput": thr, "request_throughput": thr / 10,
                   "p99_ttft_ms": float(self.params.get("ttft_ms", 100.0)) / factor,
                   "error_rate": float(self.params.get("error_rate", 0.0)), "completed": 100.0}
        with self.target.lock:
            self.target.deploys.append({"label": self.ctx.label, "seed": seed, "params": self.params})
        return Measurement(summary=summary)

    def quality_probe(self) -> list[list[int]] | None:
        if not self.target.options.probe:  # type: ignore[attr-defined]
            return None
        flip = int(self.params.get("flip", 0))
        out = [list(p) for p in PROBE]
        for i in range(min(flip, 10)):
            out[0][9 - i] = 0
        return out


class NoisyTarget(Target):
    kind = "noisy"
    Options = NoisyOptions

    def __init__(self, options: BaseModel | None = None, *, agent_dir: Path = Path("."),
                 fail_speed: float | None = None) -> None:
        super().__init__(options or NoisyOptions(), agent_dir=agent_dir)
        self.deploys: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.fail_speed = fail_speed

    @contextmanager
    def deploy(self, params: Mapping[str, Any], ctx: TrialContext) -> Iterator[Deployment]:
        if self.fail_speed is not None and params.get("speed") == self.fail_speed:
            raise DeployError("cannot start", cause="out_of_memory")
        yield NoisyDeployment(self, params, ctx)

    def describe(self) -> dict[str, str]:
        return {"kind": "noisy", "engine": "noisy-1"}


SPACE = {"params": {
    "speed": {"type": "float", "low": 0.5, "high": 2.0, "default": 1.0},
    "ttft_ms": {"type": "float", "low": 10.0, "high": 1000.0, "default": 100.0},
    "error_rate": {"type": "float", "low": 0.0, "high": 0.5, "default": 0.0},
    "flip": {"type": "int", "low": 0, "high": 10, "default": 0},
}}


def make_agent(tmp_path: Path, *, name: str = "noisy", promotion: dict[str, Any] | None = None,
               tracking: bool = False, sampler: str = "random") -> Agent:
    spec = AgentSpec.model_validate({
        "name": name, "target": {"kind": "noisy"}, "search_space": SPACE,
        "workload": {"num_requests": 10},
        "objectives": [{"metric": "output_throughput", "direction": "maximize"}],
        "slos": [{"metric": "ttft_ms.p99", "max": 500}],
        "promotion": promotion or {}, "tracking": {"enabled": tracking},
        "sampler": {"name": sampler, "seed": 0}, "budget": {"trials": 4},
    })
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"{name}.yaml"
    path.write_text("# built in code by tests/support/promote_double.py\n")
    return Agent(spec=spec, path=path, space=parse_space(SPACE, file="<test>"), target_options=NoisyOptions())
