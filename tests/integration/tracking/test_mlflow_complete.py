"""MLflow is eventually complete: Optuna stays the source of truth, and what MLflow missed (a store that
could not be reached, a process killed mid-cycle, a store whose creation was interrupted) is written later,
once, tagged as backfilled. Real SQLite stores and real `tuner run` processes; the faults are real too (a
store path that cannot be created, SIGKILL, a half-migrated database)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from tuner.agent import load_agent
from tuner.cli.main import app
from tuner.loop import open_session, run_cycle
from tuner.study.study import default_storage, open_storage
from tuner.tracking.sync import reconcile
from tuner.tracking.tracker import BACKFILLED_TAG, Tracker, default_tracking_uri

AGENT = """\
name: complete
target: {kind: sim, hardware: a100-80gb-sxm, model: llama-3-8b, num_gpus: 8}
search_space:
  params:
    max_num_seqs: {type: int, low: 8, high: 512, log: true, default: 256}
    max_num_batched_tokens: {type: int, low: 256, high: 16384, log: true, default: 2048}
  constraints:
    - max_num_batched_tokens >= max_num_seqs
workload:
  arrival: {kind: poisson, rate_per_s: 20}
  prompt_tokens: {dist: uniform, low: 64, high: 512}
  output_tokens: {dist: fixed, value: 64}
  num_requests: NUM
objectives:
  - {metric: output_throughput, direction: maximize}
slos:
  - {metric: ttft_ms.p99, max: 5000}
sampler: {name: random, seed: 1}
budget: {trials: 6}
"""


def _agent(tmp_path: Path, n: int = 40) -> Path:
    p = tmp_path / "agent.yaml"
    p.write_text(AGENT.replace("NUM", str(n)))
    return p


def _runs(tracker: Tracker) -> list:
    return [r for r in tracker.runs() if r.data.tags.get("kind") in ("cycle", "trial")]


def _wait(cond, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_trials_run_while_mlflow_is_down_are_backfilled_once_it_is_back(tmp_path: Path) -> None:
    blocker = tmp_path / "mlstore"  # a file where the store's directory must go: the store cannot open
    blocker.write_text("")
    tracker = Tracker(f"sqlite:///{blocker}/mlflow.db", "complete", pause_s=0.3)
    agent = load_agent(_agent(tmp_path))
    session = open_session(agent, tmp_path / "state", tracker=tracker)
    t0 = time.monotonic()
    first = run_cycle(session, trials=3)
    assert time.monotonic() - t0 < 60
    assert tracker.down and first.run_id is None and len(first.outcomes) == 3
    blocker.unlink()  # the store can be made now: the probe sees it, the next trial backfills
    _wait(lambda: not tracker.down, 180, "the tracker to see the store again")
    run_cycle(session, trials=1)
    runs = _runs(tracker)
    trials = sorted(int(r.data.tags["trial"]) for r in runs if r.data.tags["kind"] == "trial")
    assert trials == [0, 1, 2, 3]  # every trial, once
    backfilled = {int(r.data.tags["trial"]) for r in runs
                  if r.data.tags["kind"] == "trial" and r.data.tags.get(BACKFILLED_TAG) == "true"}
    assert backfilled == {0, 1, 2}
    assert sorted(int(r.data.tags["cycle"]) for r in runs if r.data.tags["kind"] == "cycle") == [1, 2]
    assert all(r.info.status != "RUNNING" for r in runs)
    t1 = next(r for r in runs if r.data.tags.get("trial") == "1")
    optuna_t1 = session.study.study.trials[1]
    assert t1.data.metrics["output_throughput"] == pytest.approx(optuna_t1.user_attrs["metrics"]["output_throughput"])
    assert t1.data.params["max_num_seqs"] == str(optuna_t1.params["max_num_seqs"])
    cycle1 = next(r for r in runs if r.data.tags.get("kind") == "cycle" and r.data.tags["cycle"] == "1")
    assert t1.data.tags["mlflow.parentRunId"] == cycle1.info.run_id
    # idempotent: another pass writes nothing
    again = reconcile(tracker, session.study.study, agent="complete", objectives=["output_throughput"])
    assert again.changed == 0 and again.skipped is None
    assert len(_runs(tracker)) == len(runs)


def test_an_unanswering_store_costs_bounded_time(tmp_path: Path) -> None:
    """A TCP port that accepts and never answers: the first write waits call_timeout_s, the others none."""
    import socket

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(16)
        port = srv.getsockname()[1]
        tracker = Tracker(f"http://user:hunter2@127.0.0.1:{port}", "x", call_timeout_s=5.0, pause_s=60)
        t0 = time.monotonic()
        assert tracker.start_run("cycle-1") is None
        first_s = time.monotonic() - t0
        t1 = time.monotonic()
        for i in range(20):
            assert tracker.start_run(f"trial-{i}") is None
        rest_s = time.monotonic() - t1
    # the first waits about call_timeout_s, the 20 others none (one more wait would be 5 s): generous bounds, a
    # busy host stretches both
    assert first_s < 25.0 and rest_s < 4.0, (first_s, rest_s)


@pytest.mark.slow
def test_a_killed_runs_mlflow_runs_are_ended_killed_at_the_next_start(tmp_path: Path) -> None:
    agent = _agent(tmp_path, n=400)
    sd = tmp_path / "state"
    log = tmp_path / "run.log"
    env = {**os.environ, "TUNER_STATE_DIR": str(sd)}
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tuner.cli", "run", str(agent), "--trials", "200"],
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def two_done() -> bool:
            assert proc.poll() is None, log.read_text()[-3000:]
            if not (sd / "optuna.db").exists():
                return False
            try:
                study = optuna.load_study(study_name="complete", storage=open_storage(default_storage(sd)))
            except Exception:  # noqa: BLE001 - not created yet
                return False
            return sum(t.state.name == "COMPLETE" for t in study.get_trials(deepcopy=False)) >= 2
        _wait(two_done, 180, "two finished trials")
        # a trial run (and the cycle run) is RUNNING in MLflow now
        tracker = Tracker(default_tracking_uri(sd), "complete")
        _wait(lambda: any(r.info.status == "RUNNING" and r.data.tags.get("kind") == "trial" for r in _runs(tracker)),
              60, "a RUNNING trial run")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    assert any(r.info.status == "RUNNING" for r in _runs(tracker))
    res = CliRunner().invoke(app, ["run", str(agent), "--trials", "1", "--state-dir", str(sd)])
    assert res.exit_code == 0, res.output
    runs = _runs(tracker)
    assert all(r.info.status != "RUNNING" for r in runs), [(r.info.run_name, r.info.status) for r in runs]
    killed_cycle = next(r for r in runs if r.data.tags.get("kind") == "cycle" and r.data.tags["cycle"] == "1")
    assert killed_cycle.info.status == "KILLED" and killed_cycle.data.tags["interrupted"] == "True"
    study = optuna.load_study(study_name="complete", storage=open_storage(default_storage(sd)))
    finished = {t.number for t in study.get_trials(deepcopy=False) if t.state.name in ("COMPLETE", "FAIL", "PRUNED")}
    tracked = [int(r.data.tags["trial"]) for r in runs if r.data.tags.get("kind") == "trial"]
    assert sorted(tracked) == sorted(finished)  # every finished trial (a pruned one too), once
    hist = CliRunner().invoke(app, ["history", str(agent), "--state-dir", str(sd), "--json"])
    assert hist.exit_code == 0, hist.output
    import json

    cycles = json.loads(hist.output)["cycles"]
    first = next(c for c in cycles if c["cycle"] == 1)
    assert first["interrupted"] is True and first["status"] == "KILLED"


def test_a_half_made_store_is_set_aside_and_made_again(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    sd.mkdir()
    uri = default_tracking_uri(sd)
    Tracker(uri, "x").start_run("probe")  # a complete store
    db = sd / "mlflow.db"
    with sqlite3.connect(db) as conn:  # what a kill during the migration leaves: tables, no version stamp
        conn.execute("DELETE FROM runs")
        conn.execute("DELETE FROM alembic_version")
    tracker = Tracker(uri, "x")
    assert tracker.start_run("after") is not None, "the store was not repaired"
    assert len(tracker.runs()) == 1
    assert list(sd.glob("mlflow.db.broken-*")), "the half-made store was not kept aside"
    assert not list(sd.glob("mlflow.db.making-*"))
    assert (db.stat().st_mode & 0o777) == 0o600


def test_a_run_ending_while_the_store_is_back_but_unprobed_writes_everything_before_it_returns(
        tmp_path: Path) -> None:
    """The background probe has not seen the store back yet (its pause is 10 minutes here) when the cycle ends:
    the cycle's end asks the store once more (at most end_probe_s) and backfills, so the run leaves MLflow
    complete rather than waiting for the next start."""
    blocker = tmp_path / "mlstore"
    blocker.write_text("")
    tracker = Tracker(f"sqlite:///{blocker}/mlflow.db", "complete", pause_s=600, end_probe_s=120)
    session = open_session(load_agent(_agent(tmp_path)), tmp_path / "state", tracker=tracker)

    def on_trial(outcome: object) -> None:
        if tracker.down and blocker.exists():
            blocker.unlink()  # the store can be made again from now on; nobody has asked it yet

    result = run_cycle(session, trials=3, on_trial=on_trial)
    assert result.run_id is None and len(result.outcomes) == 3  # the cycle ran while MLflow was down
    assert not tracker.down
    runs = _runs(tracker)
    assert sorted(int(r.data.tags["trial"]) for r in runs if r.data.tags["kind"] == "trial") == [0, 1, 2]
    assert [r.data.tags["cycle"] for r in runs if r.data.tags["kind"] == "cycle"] == ["1"]
    assert all(r.info.status != "RUNNING" and r.data.tags.get(BACKFILLED_TAG) == "true" for r in runs)


def test_a_tracker_made_for_a_store_found_down_starts_down_and_probes_in_bounded_time() -> None:
    """The daemon makes a tracker per cycle: once a store is found silent, the next cycle's tracker does not
    wait call_timeout_s again, and its end-of-cycle probe waits at most end_probe_s."""
    import socket

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(16)
        uri = f"http://127.0.0.1:{srv.getsockname()[1]}"
        first = Tracker(uri, "x", call_timeout_s=8.0, pause_s=60)
        assert first.start_run("cycle-1") is None and first.down
        t0 = time.monotonic()
        second = Tracker(uri, "x", call_timeout_s=8.0, pause_s=60, end_probe_s=1.0)
        assert second.down
        assert second.start_run("cycle-2") is None
        assert time.monotonic() - t0 < 6.0  # not call_timeout_s (8 s) again
        t1 = time.monotonic()
        assert second.probe_now() is False
        assert 0.9 <= time.monotonic() - t1 < 7.0  # end_probe_s (1 s), not call_timeout_s (8 s)


def _verifying_agent(tmp_path: Path) -> Path:
    p = _agent(tmp_path)
    p.write_text(p.read_text() + "promotion: {policy: manual, verify_runs: 2, min_improvement: 0.0}\n")
    return p


def test_verifications_mlflow_missed_are_backfilled_once(tmp_path: Path) -> None:
    """A verification recorded while MLflow was down (the champion store holds it, MLflow has no run) is
    written when the store answers again, tagged backfilled, under its candidate's cycle; a stored
    verification of an older tuner (no key) too; a second pass writes nothing."""
    from tuner.champions.db import champion_store
    from tuner.loop import finish_tracking, sync_mlflow
    from tuner.promotion.verify import verify
    from tuner.tracking.tracker import VERIFICATION_KEY_TAG

    blocker = tmp_path / "mlstore"
    blocker.write_text("")
    tracker = Tracker(f"sqlite:///{blocker}/mlflow.db", "complete", pause_s=600, end_probe_s=120)
    session = open_session(load_agent(_verifying_agent(tmp_path)), tmp_path / "state", tracker=tracker)
    run_cycle(session, trials=3, finish=False)
    assert tracker.down
    cand = max((t for t in session.study.trials() if t.user_attrs.get("feasible")), key=lambda t: t.values[0])
    verdict = verify(session, session.agent.space.full_config(cand.params), candidate_trial=cand.number, runs=2)
    assert verdict.run_id is None  # MLflow was down: only the champion store has it
    store = champion_store(session)
    old = {k: v for k, v in store.verifications()[0].items() if k not in ("uid", "time")}
    store.add_verification({**old, "reason": "an older tuner's entry"})  # no uid: known by its time
    assert len(store.verifications()) == 2
    blocker.unlink()
    finish_tracking(session)
    assert not tracker.down
    runs = tracker.runs("tags.kind = 'verification'")
    assert len(runs) == 2, [r.data.tags for r in runs]
    keys = {r.data.tags[VERIFICATION_KEY_TAG] for r in runs}
    assert verdict.uid in keys and any(k.startswith("time:") for k in keys)
    mine = next(r for r in runs if r.data.tags[VERIFICATION_KEY_TAG] == verdict.uid)
    assert mine.info.status == "FINISHED" and mine.data.tags[BACKFILLED_TAG] == "true"
    assert mine.data.tags["candidate_trial"] == str(cand.number)
    assert mine.data.tags["verdict"] == ("pass" if verdict.passed else "fail")
    if verdict.test is not None:
        assert mine.data.metrics["improvement"] == pytest.approx(verdict.test.improvement)
    cycle1 = next(r for r in _runs(tracker) if r.data.tags["kind"] == "cycle")
    assert mine.data.tags["mlflow.parentRunId"] == cycle1.info.run_id
    history = tracker.client.get_metric_history(mine.info.run_id, "B_value")
    assert len(history) == 2  # one step per pair
    sync_mlflow(session)  # idempotent
    assert len(tracker.runs("tags.kind = 'verification'")) == 2


def test_a_verification_run_a_killed_process_left_running_is_completed_from_the_store(tmp_path: Path) -> None:
    import socket

    from tuner.tracking.tracker import OWNER_TAG, VERIFICATION_KEY_TAG

    sd = tmp_path / "state"
    tracker = Tracker(default_tracking_uri(sd), "complete")
    session = open_session(load_agent(_verifying_agent(tmp_path)), sd, tracker=tracker)
    run_cycle(session, trials=2)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    from tuner.base.proc import process_start_ticks

    owner = f"{socket.gethostname()}:{dead.pid}:{process_start_ticks(os.getpid())}"
    run_id = tracker.start_run("verify-trial-1 pass", tags={
        "kind": "verification", "study": session.study.name, OWNER_TAG: owner, VERIFICATION_KEY_TAG: "abc"})
    tracker.active.discard(run_id)  # as if another process had made it
    from tuner.champions.db import champion_store

    champion_store(session).add_verification({
        "passed": True, "reason": "better", "study": session.study.name, "trial": 1, "reference": "baseline",
        "run_id": run_id, "uid": "abc", "pairs": 2, "improvement": 0.1, "improvement_low": 0.05, "p_value": 0.01,
        "runs": [{"arm": a, "pair": i, "value": 10.0 + i} for i in (1, 2) for a in ("A", "B")]})
    from tuner.loop import sync_mlflow

    sync_mlflow(session)
    run = tracker.client.get_run(run_id)
    assert run.info.status == "FINISHED", run.info.status
    assert run.data.metrics["improvement"] == pytest.approx(0.1)
    assert len(tracker.runs("tags.kind = 'verification'")) == 1  # completed, not written twice
