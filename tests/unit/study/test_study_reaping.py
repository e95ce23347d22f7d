"""Review: opening a session (tuner promote, status, run) must not fail the trials a live tuner is running."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from optuna.trial import TrialState

from tests.support.promote_double import NoisyOptions, NoisyTarget, make_agent
from tuner.loop import open_session
from tuner.objectives import Evaluation

pytestmark = pytest.mark.process  # starts processes: not in `make test-fast`


def test_a_second_session_leaves_a_live_tuners_running_trial_alone(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    sd = tmp_path / "state"
    running = open_session(agent, sd, target=NoisyTarget(NoisyOptions()))
    trial, _ = running.study.ask()
    # e.g. `tuner promote` or `tuner status` while the daemon measures this trial
    other = open_session(agent, sd, target=NoisyTarget(NoisyOptions()))
    assert other.study.trial(trial.number).state == TrialState.RUNNING
    done = running.study.tell(trial, Evaluation(values=[1.0], constraints={}), attrs={})
    assert done.state == TrialState.COMPLETE


def test_a_trial_of_a_dead_tuner_is_reaped(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    sd = tmp_path / "state"
    session = open_session(agent, sd, target=NoisyTarget(NoisyOptions()))
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
    agent = make_agent(tmp_path)
    sd = tmp_path / "state"
    session = open_session(agent, sd, target=NoisyTarget(NoisyOptions()))
    trial, _ = session.study.ask()
    session.study._told(trial)  # as if an error between ask and tell had ended its cycle
    assert session.study.reap_stale() == [trial.number]
