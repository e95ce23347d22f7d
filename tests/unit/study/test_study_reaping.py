"""Review: opening a session (tuner promote, status, run) must not fail the trials a live tuner is running."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from optuna.trial import TrialState

from tests.support.promote_double import NoisyOptions, NoisyTarget, make_agent
from tuner.loop import open_session
from tuner.study.objectives import Evaluation

pytestmark = pytest.mark.process  # starts processes: not in `make test-fast`


def sessions(tmp_path: Path, n: int) -> list[Any]:
    """`n` sessions of one agent on one state dir, as `n` tuner processes sharing a study would open them."""
    agent = make_agent(tmp_path)
    return [open_session(agent, tmp_path / "state", target=NoisyTarget(NoisyOptions())) for _ in range(n)]


def test_a_second_session_leaves_a_live_tuners_running_trial_alone(tmp_path: Path) -> None:
    (running,) = sessions(tmp_path, 1)
    trial, _ = running.study.ask()
    # e.g. `tuner promote` or `tuner status` while the daemon measures this trial: opening it reaps nothing live
    (other,) = sessions(tmp_path, 1)
    assert other.study.trial(trial.number).state == TrialState.RUNNING
    done = running.study.tell(trial, Evaluation(values=[1.0], constraints={}), attrs={})
    assert done.state == TrialState.COMPLETE


def test_a_trial_of_a_dead_tuner_is_reaped(tmp_path: Path) -> None:
    (session,) = sessions(tmp_path, 1)
    trial, _ = session.study.ask()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    owner = dict(session.study.trial(trial.number).system_attrs["tuner:owner"])
    owner["pid"] = int(dead.stdout)
    session.study.study._storage.set_trial_system_attr(trial._trial_id, "tuner:owner", owner)
    assert session.study.reap_stale() == [trial.number]
    t = session.study.trial(trial.number)
    assert t.state == TrialState.FAIL and t.user_attrs["cause"] == "interrupted"


def test_a_trial_this_process_left_behind_is_reaped(tmp_path: Path) -> None:
    (session,) = sessions(tmp_path, 1)
    trial, _ = session.study.ask()
    session.study._told(trial)  # as if an error between ask and tell had ended its cycle
    assert session.study.reap_stale() == [trial.number]


def test_a_trial_whose_asker_died_before_recording_its_owner_is_reaped_at_once(tmp_path: Path) -> None:
    """A SIGKILL between Optuna's ask and the owner's record left the trial RUNNING without an owner until its
    lease ran out (the fault campaign's restart found it RUNNING in 4 of 20 kills). On SQLite, a reaper that
    holds the ask lock knows no asker is between those steps: the trial is failed at once."""
    (session,) = sessions(tmp_path, 1)
    orphan = session.study.study.ask()  # Optuna's ask alone: the asker died before recording the owner
    assert session.study.reap_stale() == [orphan.number]
    t = session.study.trial(orphan.number)
    assert t.state == TrialState.FAIL and t.user_attrs["cause"] == "interrupted"


def test_a_trial_being_asked_is_not_reaped(tmp_path: Path) -> None:
    """The reaper waits for an asker that holds the ask lock, then sees the owner it recorded."""
    import threading

    session, reaper = sessions(tmp_path, 2)
    asked: list[object] = []
    holding = threading.Event()

    def ask_slowly() -> None:
        study = session.study
        with study.lock("ask"):
            holding.set()
            raw = study.study.ask()
            asked.append(raw)
            threading.Event().wait(1.0)  # the reaper comes now
            from tuner.study.study import _IN_FLIGHT, _IN_FLIGHT_LOCK, OWNER_ATTR, _this_process

            with _IN_FLIGHT_LOCK:
                _IN_FLIGHT.add((study.storage_url, raw._trial_id))
            study.study._storage.set_trial_system_attr(raw._trial_id, OWNER_ATTR, _this_process())

    th = threading.Thread(target=ask_slowly)
    th.start()
    holding.wait(10)
    assert reaper.study.reap_stale() == []
    th.join(10)
    assert reaper.study.trial(asked[0].number).state == TrialState.RUNNING  # type: ignore[attr-defined]


class _DatabaseGoneMidAsk:
    """Stands in for the failure model at the step of an ask where the database went away (a PostgreSQL
    restart): its read raises the error SQLAlchemy raises then. The worker's retry then asks a new trial."""

    def fit(self, configs: object, failed: object) -> None:
        from sqlalchemy.exc import OperationalError

        raise OperationalError("SELECT trial_params ...", {}, Exception("terminating connection"))

    def rejects(self, config: object) -> None:
        return None


def test_a_trial_whose_ask_failed_is_released_and_holds_no_slot(tmp_path: Path) -> None:
    """The fleet's hang after a PostgreSQL restart: an ask that failed after Optuna made its trial left that
    trial RUNNING and beaten by its live owner forever, holding a slot of the budget; every worker then waited
    for it. The trial is failed as lost (its slot is redone) and no longer beaten."""
    from sqlalchemy.exc import OperationalError

    (session,) = sessions(tmp_path, 1)
    study = session.study
    baseline, _ = study.ask()
    study.tell(baseline, Evaluation(values=[1.0], constraints={}), attrs={"config": {}})
    study.failure_model = _DatabaseGoneMidAsk()
    with pytest.raises(OperationalError):
        study.ask()
    (lost,) = [t for t in study.trials() if t.number != baseline.number]
    assert lost.state == TrialState.FAIL and lost.user_attrs["cause"] == "interrupted"
    assert lost._trial_id not in study.heartbeat.trials
    assert study.counted() == 1  # the baseline only: the lost trial's slot is free again
    study.failure_model = None
    again, _ = study.ask()  # the retry
    assert again.number == lost.number + 1 and study.trial(again.number).state == TrialState.RUNNING
