"""Review: a cycle that ends in an exception does not leave its MLflow parent run RUNNING forever."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.promote_double import NoisyOptions, NoisyTarget, make_agent
from tuner.loop import TrialOutcome, open_session, run_cycle


def test_an_aborted_cycle_ends_its_mlflow_run(tmp_path: Path) -> None:
    session = open_session(make_agent(tmp_path, tracking=True), tmp_path / "state",
                           target=NoisyTarget(NoisyOptions()))

    def broken_progress(outcome: TrialOutcome) -> None:
        raise BrokenPipeError("the progress display went away")

    with pytest.raises(BrokenPipeError):
        run_cycle(session, trials=2, on_trial=broken_progress)
    cycles = session.tracker.runs("tags.kind = 'cycle'")
    assert len(cycles) == 1 and cycles[0].info.status == "FAILED"
