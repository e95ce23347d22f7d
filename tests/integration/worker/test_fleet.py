"""A tuning fleet on one real PostgreSQL server and one real `mlflow server` whose backend store is that database.

Workers are real `tuner worker` processes. One PostgreSQL server and one MLflow server for the module; each
test has its own database and study. A worker started with `unshare --uts` runs under another host name: a
host whose processes this one cannot see, so only its lease can tell that it went away.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.support import postgres
from tests.support.agents import fake_server_agent, fleet_sim_agent, write_spec
from tests.support.logged_proc import output, start_logged
from tests.support.mlflow_server import start_mlflow_server
from tuner.study.study import not_budget

pytestmark = [
    pytest.mark.slow,
    # three worker processes, PostgreSQL and an MLflow server share the host: on a quiet 2-core host a test
    # takes 40-90 s; on one with ten busy processes (other work beside it) 5 min and more
    pytest.mark.timeout(900),
    pytest.mark.skipif(not postgres.available(), reason="PostgreSQL is not installed (.ci/run installs it)"),
]
REPO = Path(__file__).resolve().parents[3]




@pytest.fixture(scope="module")
def pg() -> Iterator[postgres.PgServer]:
    with postgres.start_postgres() as server:
        yield server


@pytest.fixture(scope="module")
def mlflow_uri(pg: postgres.PgServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    backend = pg.create_database("mlflow")
    with start_mlflow_server(backend, tmp_path_factory.mktemp("mlflow") / "artifacts", env=pg.env()) as uri:
        yield uri


def write_agent(tmp_path: Path, *, name: str, trials: int, storage: str, tracking: str, lease_s: int) -> Path:
    """The fleet's sim agent, tracked on `tracking`, its trials leased for `lease_s` (heartbeat every second)."""
    return write_spec(tmp_path / "agent.yaml", fleet_sim_agent(
        name=name, trials=trials, storage=storage, tracking={"uri": tracking},
        lease={"heartbeat_s": 1, "timeout_s": lease_s}))


def start_worker(agent: Path, tmp_path: Path, label: str, env: dict[str, str], *, host: str | None = None,
                 trials: int | None = None) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "tuner.cli", "worker", str(agent), "--state-dir", str(tmp_path / f"state-{label}")]
    if trials is not None:
        argv += ["--trials", str(trials)]
    if host is not None:  # a host of its own: another UTS namespace with its own host name
        argv = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host, *argv]
    return start_logged(argv, tmp_path / f"{label}.log", REPO, env)


def wait_all(procs: dict[str, subprocess.Popen[str]], tmp_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for label, proc in procs.items():
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs.values():
                p.kill()
            pytest.fail(f"worker {label} still running after {timeout_s:.0f} s:\n{output(tmp_path / f'{label}.log')}")
        assert proc.returncode == 0, f"worker {label} exited {proc.returncode}:\n{output(tmp_path / f'{label}.log')}"


def load(url: str, name: str, pg: postgres.PgServer) -> list[optuna.trial.FrozenTrial]:
    os.environ["PGPASSWORD"] = pg.password  # this test process reads the study as a worker would
    from tuner.study.study import open_storage

    return optuna.load_study(study_name=name, storage=open_storage(url)).get_trials(deepcopy=False)


def test_three_workers_share_one_study_of_30_trials(pg: postgres.PgServer, mlflow_uri: str,
                                                    tmp_path: Path) -> None:
    url = pg.create_database("three")
    agent = write_agent(tmp_path, name="three", trials=30, storage=url, tracking=mlflow_uri, lease_s=10)
    env = pg.env()
    procs = {f"w{i}": start_worker(agent, tmp_path, f"w{i}", env) for i in range(3)}
    wait_all(procs, tmp_path, 500)
    trials = load(url, "three", pg)
    # a configuration proposed again is a repeat of its earlier trial or answered from it: no budget trial
    budget = [t for t in trials if not not_budget(t)]
    assert len(budget) == 30, [(t.state, t.user_attrs.get("repeat_of"), t.user_attrs.get("duplicate_of"))
                               for t in trials]
    # no configuration is a budget trial twice, not even when two workers propose it at once (one runs it,
    # the other measures a repeat); the workers' seeded samplers do not propose one sequence between them
    configs = [json.dumps(t.user_attrs["config"], sort_keys=True) for t in budget]
    assert len(set(configs)) == len(configs), [(t.number, t.user_attrs["config"]) for t in budget]
    assert len(trials) - len(budget) <= 10, len(trials)  # repeats and copies are the exception
    # every trial finished; a copy of a trial that was running then is set aside as FAIL (never deployed)
    assert all(t.state == TrialState.COMPLETE or t.user_attrs.get("duplicate_of") is not None for t in trials)
    assert sorted(t.number for t in trials) == list(range(len(trials)))  # unique numbers, no gap
    assert [t.number for t in trials if t.user_attrs.get("baseline")] == [0]  # the baseline, once
    pids = {p.pid for p in procs.values()}
    assert {t.user_attrs["pid"] for t in trials} <= pids
    assert len({t.user_attrs["pid"] for t in trials}) >= 2  # the work was shared
    assert all(t.user_attrs["host"] for t in trials)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_uri)
    exp = client.get_experiment_by_name("three")
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    fleet = [r for r in runs if r.data.tags.get("kind") == "fleet"]
    assert len(fleet) == 1 and fleet[0].info.status == "FINISHED"
    nested = [r for r in runs if r.data.tags.get("kind") == "trial"]
    assert len(runs) == len(nested) + 1  # trial runs, nested under one fleet run
    assert {r.data.tags["mlflow.parentRunId"] for r in nested} == {fleet[0].info.run_id}
    # a run per trial that ran (repeats too; a copy, never deployed, has one once a reconcile wrote it), and
    # never two: workers reconciling at once after an MLflow outage both wrote a missing trial's run
    numbers = [int(r.data.tags["trial"]) for r in nested]
    assert len(set(numbers)) == len(numbers), sorted(numbers)
    ran = {t.number for t in trials if t.user_attrs.get("duplicate_of") is None}
    assert ran <= set(numbers) <= {t.number for t in trials}, (sorted(ran - set(numbers)), len(trials))
    assert all(r.data.tags["pid"] for r in nested)
    for label in procs:  # the database password never reaches a worker's output
        assert pg.password not in output(tmp_path / f"{label}.log", 10**6)


def test_a_killed_workers_trial_is_failed_when_its_lease_expires(pg: postgres.PgServer, tmp_path: Path) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is needed to give a worker a host name of its own")
    url = pg.create_database("killed")
    lease_s = 6
    # trials of a few seconds: a real server process per trial, serving fixed delays
    agent = write_spec(tmp_path / "agent.yaml", fake_server_agent(
        ttft_ms=[100, 120, 140, 160, 180, 200, 220, 240], itl_ms=20, output_tokens=50, num_requests=8, name="killed",
        budget={"trials": 6}, storage=url, lease={"heartbeat_s": 1, "timeout_s": lease_s}))
    env = pg.env()
    victim = start_worker(agent, tmp_path, "victim", env, host="fleet-victim")
    # wait until the victim runs a trial, then start the others and kill it mid-trial
    deadline = time.monotonic() + 300
    running: list[optuna.trial.FrozenTrial] = []
    while not running:
        assert time.monotonic() < deadline, output(tmp_path / "victim.log")
        assert victim.poll() is None, output(tmp_path / "victim.log")
        time.sleep(0.5)
        try:
            running = [t for t in load(url, "killed", pg) if t.state == TrialState.RUNNING
                       and t.user_attrs.get("host") == "fleet-victim"]
        except KeyError:  # the study is not made yet
            continue
    others = {f"w{i}": start_worker(agent, tmp_path, f"w{i}", env) for i in range(2)}
    time.sleep(1.0)
    victim.send_signal(signal.SIGKILL)  # unshare exec'd the worker: this is the worker itself
    victim.wait(timeout=10)
    wait_all(others, tmp_path, 500)
    trials = {t.number: t for t in load(url, "killed", pg)}
    lost = trials[running[0].number]
    assert lost.state == TrialState.FAIL
    assert lost.user_attrs["cause"] == "worker_lost"
    done = [t for t in trials.values() if t.state == TrialState.COMPLETE]
    assert sum(not not_budget(t) for t in done) == 6  # the others finished the budget, the lost trial redone
    # failed by lease expiry (only a lease tells of a process on another host) while the others waited for
    # it: its slot was redone after it (no wall-clock bound: a busy host stretches every beat)
    assert lost.datetime_complete is not None
    assert lost.datetime_complete <= max(t.datetime_start for t in done if t.datetime_start is not None)


def test_workers_ride_out_a_postgresql_restart(pg: postgres.PgServer, mlflow_uri: str, tmp_path: Path) -> None:
    url = pg.create_database("restart")
    agent = write_agent(tmp_path, name="restart", trials=24, storage=url, tracking=mlflow_uri,
                        lease_s=30)
    env = pg.env()
    procs = {f"w{i}": start_worker(agent, tmp_path, f"w{i}", env) for i in range(2)}
    deadline = time.monotonic() + 300
    while True:  # restart once a few trials are in
        assert time.monotonic() < deadline
        time.sleep(0.5)
        try:
            n = sum(t.state == TrialState.COMPLETE for t in load(url, "restart", pg))
        except KeyError:
            continue
        if n >= 3:
            break
    assert all(p.poll() is None for p in procs.values()), "the workers finished before the restart"
    pg.restart(down_s=3)
    wait_all(procs, tmp_path, 500)
    trials = load(url, "restart", pg)
    assert sorted(t.number for t in trials) == list(range(len(trials)))  # unique numbers, none skipped
    done = [t for t in trials if t.state == TrialState.COMPLETE and not not_budget(t)]  # repeats: no budget
    assert len(done) == 24, [(t.number, t.state, t.user_attrs) for t in trials]  # the whole budget, nothing lost
    # a trial asked for just as the server went down can lose its worker's answer (the worker's retry asks
    # again): it never completes, its lease fails it and its slot is redone, so it is never COMPLETE
    others = [t for t in trials if t.state != TrialState.COMPLETE and t.user_attrs.get("duplicate_of") is None]
    assert len(others) <= 2 and all(t.state == TrialState.FAIL for t in others), \
        [(t.number, t.state, t.user_attrs) for t in others]
    # (whether a worker's call met the 3 s outage is timing: one waiting on MLflow meanwhile reconnects
    # silently, its pool's connections checked before use)


def test_promote_from_two_hosts_at_once(pg: postgres.PgServer, mlflow_uri: str, tmp_path: Path) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is needed to give a process a host name of its own")
    url = pg.create_database("promo")
    agent = write_agent(tmp_path, name="promo", trials=6, storage=url, tracking=mlflow_uri, lease_s=10)
    env = pg.env()
    wait_all({"w": start_worker(agent, tmp_path, "w", env)}, tmp_path, 500)
    trials = load(url, "promo", pg)
    feasible = [t for t in trials if t.user_attrs.get("feasible") and not t.user_attrs.get("baseline")]
    assert len(feasible) >= 2, [(t.number, t.user_attrs.get("cause")) for t in trials]
    a, b = feasible[0].number, feasible[1].number

    def promote(trial: int, label: str, host: str | None) -> subprocess.Popen[str]:
        argv = [sys.executable, "-m", "tuner.cli", "promote", str(agent), "--trial", str(trial), "--skip-verify",
                "--yes", "--reason", f"from {label}", "--state-dir", str(tmp_path / f"state-{label}")]
        if host is not None:
            argv = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host, *argv]
        return start_logged(argv, tmp_path / f"{label}.log", REPO, env)

    procs = {"pa": promote(a, "pa", None), "pb": promote(b, "pb", "fleet-b")}
    wait_all(procs, tmp_path, 500)
    from tuner.agent import load_agent
    from tuner.champions.db import champion_store_for
    from tuner.study.study import TunerStudy

    spec_agent = load_agent(agent)
    study = TunerStudy(spec_agent.spec, spec_agent.space, storage_url=url)
    store = champion_store_for(spec_agent, tmp_path / "state-reader", study)
    champ = store.champion()
    assert champ is not None and champ.seq == 2 and champ.previous_seq == 1  # serialised: one after the other
    first = store.record(1)
    assert first is not None and {first.trial, champ.trial} == {a, b}
    promotes = [e for e in store.audit_log() if e["action"] == "promote"]
    assert sorted(e["seq"] for e in promotes) == [1, 2]
    assert len({e["host"] for e in promotes}) == 2  # both hosts recorded
    # every host sees the same champion: `tuner status` from a third state dir
    out = subprocess.run([sys.executable, "-m", "tuner.cli", "status", str(agent), "--json", "--state-dir",
                          str(tmp_path / "state-third")], capture_output=True, text=True, env=env, timeout=120,
                         cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["champion"]["seq"] == 2
    from mlflow.tracking import MlflowClient

    alias = MlflowClient(tracking_uri=mlflow_uri).get_model_version_by_alias("promo", "champion")
    assert alias.version == champ.model_version
