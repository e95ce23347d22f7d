"""The fleet's pieces on SQLite, without a database server: spec rules, the study lock, trial leases."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from optuna.trial import TrialState

from tests.support.promote_double import NoisyOptions, NoisyTarget, make_agent
from tuner.agent import load_agent
from tuner.coord.dblock import LockTimeout, study_lock
from tuner.errors import ConfigError
from tuner.loop import open_session
from tuner.study.objectives import Evaluation
from tuner.study.study import OWNER_ATTR, LeaseLost

AGENT = """\
name: a
target: {kind: sim}
search_space: {params: {max_num_seqs: {type: int, low: 16, high: 256, default: 128}}}
workload: {num_requests: 10}
objectives: [{metric: output_throughput, direction: maximize}]
"""


@pytest.mark.parametrize(("extra", "field", "words"), [
    ("storage: postgresql+psycopg://tuner:s3cret@db:5432/study", "storage", "PGPASSWORD"),
    ("tracking: {uri: 'http://me:s3cret@mlflow:5000'}", "tracking.uri", "MLFLOW_TRACKING_PASSWORD"),
    ("lease: {heartbeat_s: 5, timeout_s: 8}", "lease", "at least twice heartbeat_s"),
    ("executor: {kind: local, address: auto}", "executor", "address is for kind 'ray'"),
])
def test_fleet_fields_are_checked(tmp_path: Path, extra: str, field: str, words: str) -> None:
    p = tmp_path / "agent.yaml"
    p.write_text(AGENT + extra + "\n")
    with pytest.raises(ConfigError) as e:
        load_agent(p)
    assert e.value.exit_code == 2
    assert str(p) in str(e.value) and field in str(e.value) and words in str(e.value)
    assert "s3cret" not in str(e.value)


def test_a_url_without_password_is_accepted(tmp_path: Path) -> None:
    p = tmp_path / "agent.yaml"
    p.write_text(AGENT + "storage: postgresql+psycopg://tuner@db:5432/study\ntracking: {uri: 'http://mlflow:5000'}\n")
    assert load_agent(p).spec.storage == "postgresql+psycopg://tuner@db:5432/study"


def test_the_study_lock_excludes_another_holder(tmp_path: Path) -> None:
    from sqlalchemy import create_engine

    engine = create_engine(f"sqlite:///{tmp_path / 's.db'}")
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with study_lock(engine, "x"):
            held.set()
            release.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    assert held.wait(10)
    with pytest.raises(LockTimeout):
        with study_lock(engine, "x", timeout_s=0.3):
            pass
    with study_lock(engine, "y", timeout_s=0.3):  # another lock's name is free
        pass
    release.set()
    t.join(10)
    with study_lock(engine, "x", timeout_s=2):
        pass


def _lease_agent(tmp_path: Path):  # type: ignore[no-untyped-def]
    agent = make_agent(tmp_path)
    spec = agent.spec.model_copy(update={"lease": agent.spec.lease.model_copy(update={"heartbeat_s": 1,
                                                                                      "timeout_s": 2})})
    return agent.model_copy(update={"spec": spec})


@pytest.mark.slow  # waits out a lease: not in `make test-fast`
def test_a_trial_whose_beats_stopped_is_failed_once_its_lease_expires(tmp_path: Path) -> None:
    agent = _lease_agent(tmp_path)
    sd = tmp_path / "state"
    owner = open_session(agent, sd, target=NoisyTarget(NoisyOptions()))
    trial, _ = owner.study.ask()
    # an owner on another host (its PID means nothing here) that stops beating: a lost node
    attr = dict(owner.study.trial(trial.number).system_attrs[OWNER_ATTR], host="elsewhere")
    owner.study.study._storage.set_trial_system_attr(trial._trial_id, OWNER_ATTR, attr)
    other = open_session(agent, sd, target=NoisyTarget(NoisyOptions()))
    assert other.study.reap_stale() == []  # a fresh lease: running
    owner.study.heartbeat.remove(trial._trial_id)
    time.sleep(3.5)  # the SQLite clock has whole seconds: more than the 2 s lease for sure
    assert other.study.reap_stale() == [trial.number]
    t = other.study.trial(trial.number)
    assert t.state == TrialState.FAIL and t.user_attrs["cause"] == "worker_lost"
    with pytest.raises(LeaseLost):  # the owner comes back too late: its tell is refused, not mixed in
        owner.study.tell(trial, Evaluation(values=[1.0], constraints={}), attrs={})


@pytest.mark.slow  # waits out a lease: not in `make test-fast`
def test_a_beaten_trial_outlives_its_lease(tmp_path: Path) -> None:
    agent = _lease_agent(tmp_path)
    sd = tmp_path / "state"
    owner = open_session(agent, sd, target=NoisyTarget(NoisyOptions()))
    trial, _ = owner.study.ask()
    attr = dict(owner.study.trial(trial.number).system_attrs[OWNER_ATTR], host="elsewhere")
    owner.study.study._storage.set_trial_system_attr(trial._trial_id, OWNER_ATTR, attr)
    other = open_session(agent, sd, target=NoisyTarget(NoisyOptions()))
    time.sleep(4.0)  # twice the lease, beaten every second
    assert other.study.reap_stale() == []
    done = owner.study.tell(trial, Evaluation(values=[1.0], constraints={}), attrs={})
    assert done.state == TrialState.COMPLETE and owner.study.trial(trial.number).user_attrs["host"]


def test_a_database_that_stays_unreachable_is_said_in_one_line() -> None:
    """A worker whose database did not come back died with SQLAlchemy's traceback; now the retry's end is a
    TunerError (the CLI's one error line) naming the step, the wait and the driver's words."""
    import socket

    import sqlalchemy

    from tuner.study.study import DatabaseUnreachable, with_db_retry

    with socket.socket() as s:  # a port nothing listens on: connection refused, at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    engine = sqlalchemy.create_engine(f"postgresql+psycopg://tuner:s3cret@127.0.0.1:{port}/study")
    with pytest.raises(DatabaseUnreachable) as err:
        with_db_retry("take a slot of the budget", lambda: engine.connect(), deadline_s=1.0)
    msg = str(err.value)
    assert msg.startswith("take a slot of the budget: the study's database did not answer for 1 s")
    assert "refused" in msg.lower() and "\n" not in msg and "s3cret" not in msg, msg
