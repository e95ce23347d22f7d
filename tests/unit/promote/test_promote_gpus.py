"""Review: verification runs on the agent's GPUs (as its trials do), not on whatever the host shows first."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.promote_double import NoisyOptions, NoisyTarget, make_agent
from tuner.loop import open_session, run_cycle
from tuner.promotion.verify import verify
from tuner.targets.base import Deployment, TrialContext


class TwoGpuTarget(NoisyTarget):
    """Every configuration needs 2 GPUs; each deploy records the GPUs it was given."""

    def __init__(self) -> None:
        super().__init__(NoisyOptions())
        self.gpus_seen: list[tuple[str, tuple[int, ...]]] = []

    def gpus_needed(self, params: Mapping[str, Any]) -> int:
        return 2

    @contextmanager
    def deploy(self, params: Mapping[str, Any], ctx: TrialContext) -> Iterator[Deployment]:
        self.gpus_seen.append((ctx.label, tuple(ctx.gpus)))
        with super().deploy(params, ctx) as dep:
            yield dep


def test_verification_runs_claim_the_agents_gpus(tmp_path: Path) -> None:
    agent = make_agent(tmp_path, promotion={"verify_runs": 2})
    agent = agent.model_copy(update={"spec": agent.spec.model_copy(update={"gpus": [4, 5, 6]})})
    target = TwoGpuTarget()
    session = open_session(agent, tmp_path / "state", target=target)
    run_cycle(session, trials=1)
    trial = [(label, gpus) for label, gpus in target.gpus_seen if label.startswith("trial-0")]
    assert trial[0] == ("trial-0", (4, 5)) and all(g == (4, 5) for _, g in trial)  # the trial and its repeats
    seen = len(target.gpus_seen)
    verify(session, {"speed": 1.3, "ttft_ms": 100.0, "error_rate": 0.0, "flip": 0}, candidate_trial=0)
    runs = target.gpus_seen[seen:]
    assert len(runs) == 4 and all(gpus == (4, 5) for _, gpus in runs), runs
