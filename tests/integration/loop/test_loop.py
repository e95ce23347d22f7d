"""The tuning loop end to end on the simulator, with real SQLite Optuna and MLflow stores."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from tests.support import agents
from tuner.agent import load_agent
from tuner.cli.main import app
from tuner.loop import open_session, run_cycle
from tuner.study.study import default_storage, open_storage


def write_agent(tmp_path: Path, *, model: str = "llama-3-8b", tp: int = 1, n: int = 60) -> Path:
    return agents.write_agent(
        tmp_path / "agent.yaml", name="loop-test", budget={"trials": 6}, sampler={"name": "tpe", "seed": 1},
        slos=[{"metric": "ttft_ms.p99", "max": 5000}],
        at={"target.model": model, "search_space.params.max_num_seqs.default": 256,
            "search_space.params.tensor_parallel_size": {"type": "categorical", "choices": [1, 2, 4, 8],
                                                         "default": tp},
            "workload.arrival": {"kind": "poisson", "rate_per_s": 20},
            "workload.prompt_tokens": {"dist": "uniform", "low": 64, "high": 512}, "workload.num_requests": n})


def test_cycle_records_trials_and_mlflow(tmp_path: Path) -> None:
    agent = load_agent(write_agent(tmp_path))
    sd = tmp_path / "state"
    session = open_session(agent, sd)
    result = run_cycle(session, trials=6)
    assert [o.number for o in result.outcomes] == list(range(6))
    trials = session.study.trials()
    assert trials[0].params == agent.space.defaults()
    assert trials[0].user_attrs["baseline"] is True
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    assert "output_throughput" in trials[0].user_attrs["metrics"]
    # MLflow: one parent run and six nested runs with params and metrics
    runs = session.tracker.runs()
    parents = [r for r in runs if r.data.tags.get("kind") == "cycle"]
    children = [r for r in runs if r.data.tags.get("kind") == "trial"]
    assert len(parents) == 1 and len(children) == 6
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
    c0 = next(r for r in children if r.data.tags["trial"] == "0")
    assert c0.data.params["max_num_seqs"] == "256"
    assert c0.data.metrics["output_throughput"] > 0
    assert "p99_ttft_ms" in c0.data.metrics
    arts = {a.path for a in session.tracker.client.list_artifacts(c0.info.run_id)}
    assert {"config.yaml", "requests.csv"} <= arts
    # a second cycle continues the same study
    again = run_cycle(open_session(agent, sd), trials=2)
    assert [o.number for o in again.outcomes] == [6, 7]


def test_failed_deploy_is_an_infeasible_trial_and_loop_goes_on(tmp_path: Path) -> None:
    # Llama-3-70B does not fit one A100 at TP=1: the baseline fails with out_of_memory, others run
    agent = load_agent(write_agent(tmp_path, model="llama-3-70b", tp=1, n=30))
    session = open_session(agent, tmp_path / "state")
    result = run_cycle(session, trials=5)
    assert len(result.outcomes) == 5
    base = result.outcomes[0]
    assert base.cause == "out_of_memory" and not base.feasible
    t0 = session.study.trial(0)
    assert t0.user_attrs["cause"] == "out_of_memory"
    assert t0.constraints is not None and max(dict(t0.constraints).values()) > 0
    assert t0.state == optuna.trial.TrialState.COMPLETE  # told, so the sampler learns from it


def test_constraint_violation_is_never_deployed(tmp_path: Path) -> None:
    session = open_session(load_agent(write_agent(tmp_path)), tmp_path / "state")
    session.study.study.enqueue_trial({"max_num_seqs": 512, "max_num_batched_tokens": 256,
                                       "tensor_parallel_size": 2})
    result = run_cycle(session, trials=2)
    bad = result.outcomes[1]
    assert bad.cause == "infeasible_config"
    assert "max_num_batched_tokens >= max_num_seqs" in (bad.error or "")
    assert bad.duration_s < result.outcomes[0].duration_s  # never deployed


def _count_states(sd: Path, name: str = "loop-test") -> dict[str, int]:
    # through the tuner's own opening, so that this read never races the run creating the tables
    study = optuna.load_study(study_name=name, storage=open_storage(default_storage(sd)))
    out: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        out[t.state.name] = out.get(t.state.name, 0) + 1
    return out


@pytest.mark.slow
def test_sigkill_mid_cycle_loses_nothing(tmp_path: Path) -> None:
    agent = write_agent(tmp_path, n=400)
    sd = tmp_path / "state"
    env = {**os.environ, "TUNER_STATE_DIR": str(sd)}
    log = tmp_path / "run.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tuner.cli", "run", str(agent), "--trials", "200"],
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 90
    done = 0
    last_error = ""
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
        if (sd / "optuna.db").exists():
            try:
                done = _count_states(sd).get("COMPLETE", 0)
            except Exception as exc:  # noqa: BLE001 - the study may not exist yet
                done, last_error = 0, f"{type(exc).__name__}: {exc}"
            if done >= 4:
                break
    assert done >= 4, (f"the run never got going (exit status {proc.poll()}, last read error: {last_error or '-'}):\n"
                       + log.read_text(errors="replace")[-3000:])
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    before = _count_states(sd)
    assert before.get("COMPLETE", 0) >= 4
    # restart: stale RUNNING trials are reaped as interrupted, finished ones are kept
    session = open_session(load_agent(agent), sd)
    run_cycle(session, trials=1)
    after = _count_states(sd)
    assert after.get("RUNNING", 0) == 0
    # the restarted cycle runs a trial of its own to its end: complete, or pruned by the study's pruner
    finished = ("COMPLETE", "PRUNED")
    assert sum(after.get(s, 0) for s in finished) >= sum(before.get(s, 0) for s in finished) + 1
    assert after.get("COMPLETE", 0) >= before.get("COMPLETE", 0)  # none of the finished ones lost
    assert after.get("FAIL", 0) == before.get("RUNNING", 0) + before.get("FAIL", 0)
    for t in session.study.trials():
        if t.state == optuna.trial.TrialState.FAIL:
            assert t.user_attrs["cause"] == "interrupted"


def test_cli_run_and_status_json(tmp_path: Path) -> None:
    agent = write_agent(tmp_path, n=40)
    sd = tmp_path / "state"
    runner = CliRunner()
    res = runner.invoke(app, ["run", str(agent), "--trials", "3", "--state-dir", str(sd)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["status", str(agent), "--state-dir", str(sd), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["trials"]["COMPLETE"] == 3
    assert data["baseline"]["number"] == 0
    assert set(data["baseline"]) >= {"number", "params", "values", "metrics"}
    assert data["best"] and set(data["best"][0]) >= {"number", "params", "values", "metrics"}
    assert "champion" in data


def test_a_later_cycle_does_not_replay_the_seeded_proposals(tmp_path: Path) -> None:
    p = write_agent(tmp_path, n=20)
    p.write_text(p.read_text().replace("sampler: {name: tpe, seed: 1}", "sampler: {name: random, seed: 1}"))
    agent = load_agent(p)
    sd = tmp_path / "state"
    run_cycle(open_session(agent, sd), trials=3)
    session = open_session(agent, sd)
    run_cycle(session, trials=2)
    params = [t.params for t in session.study.trials()]
    assert params[3] != params[1] or params[4] != params[2]
