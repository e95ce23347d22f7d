"""A fault after a trial's measurement (a target's bug in what it measured, a database call that broke) fails
that trial with its cause; it never ends the loop, nor a fleet worker, with a traceback."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from optuna.trial import TrialState

from tests.support.promote_double import NoisyDeployment, NoisyOptions, NoisyTarget, make_agent
from tuner.loop import open_session, run_cycle
from tuner.measure.measurement import Measurement
from tuner.spec import WorkloadSpec
from tuner.targets.base import Deployment, TrialContext


class _BadTelemetry(NoisyDeployment):
    def measure(self, workload: WorkloadSpec, *, goodput_ms: Mapping[str, float], seed: int) -> Measurement:
        m = super().measure(workload, goodput_ms=goodput_ms, seed=seed)
        m.telemetry["gpu_util"] = "n/a"  # type: ignore[assignment] - a target's bug: not a number
        return m


class BadTelemetryTarget(NoisyTarget):
    """Measures, then hands back telemetry that is no number: the loop trips on it only after the measure."""

    @contextmanager
    def deploy(self, params: Mapping[str, Any], ctx: TrialContext) -> Iterator[Deployment]:
        yield _BadTelemetry(self, params, ctx)


def test_a_fault_after_the_measurement_fails_the_trial_and_the_cycle_goes_on(tmp_path: Path) -> None:
    session = open_session(make_agent(tmp_path), tmp_path / "state", target=BadTelemetryTarget(NoisyOptions()))
    result = run_cycle(session, trials=3)
    assert [o.cause for o in result.outcomes] == ["internal_error"] * 3
    assert all("TypeError" in (o.error or "") for o in result.outcomes)
    trials = session.study.trials()
    assert len(trials) == 3 and all(t.state == TrialState.FAIL for t in trials)
    assert all(t.user_attrs["cause"] == "internal_error" and "TypeError" in t.user_attrs["error"] for t in trials)
    assert not session.study.heartbeat.trials  # none left running, none beaten
