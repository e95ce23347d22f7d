"""Pruning a running trial whose partial measurement breaks an SLO by far, on the simulator with real SQLite Optuna
and MLflow stores: the trial is PRUNED with what it measured (Optuna and MLflow), the others run to their end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from tests.support import agents
from tuner.agent import load_agent
from tuner.loop import open_session, run_cycle
from tuner.study.objectives import total_violation
from tuner.study.summary import run_summary

N_REQUESTS = 300


def write(tmp_path: Path, **changes: Any) -> Path:
    # closed loop of 64: max_num_seqs 2 queues almost every request (TTFT far past 3 x 2 s); 256 and 128 do not
    changes = {"sampler": {"name": "random", "seed": 0}, **changes}
    return agents.write_agent(
        tmp_path / "agent.yaml", name="prune", budget={"trials": 3},
        slos=[{"metric": "ttft_ms.p99", "max": 2000}], noise={"baseline_repeats": 0},
        search_space={"params": {"max_num_seqs": {"type": "categorical", "choices": [256, 2, 128],
                                                  "default": 256}}},
        at={"workload.num_requests": N_REQUESTS}, **changes)


def run(tmp_path: Path, trials: int = 3, **changes: Any) -> tuple[Any, Any]:
    session = open_session(load_agent(write(tmp_path, **changes)), tmp_path / "state")
    q = session.study.study
    q.enqueue_trial({"max_num_seqs": 2})
    q.enqueue_trial({"max_num_seqs": 128})
    return session, run_cycle(session, trials=trials)


def test_a_trial_breaking_the_slo_by_far_is_pruned_with_its_partial_kept(tmp_path: Path) -> None:
    # the default sampler gets a fourth trial: the space has three configurations and the pruned one counts as
    # run, so the cycle ends after three (SearchExhausted) instead of deploying it again
    session, result = run(tmp_path, trials=4, sampler={"name": "auto", "seed": 0})
    assert [o.number for o in result.outcomes] == [0, 1, 2]
    trials = {t.number: t for t in session.study.trials() if not t.user_attrs.get("duplicate_of")}
    assert [trials[n].params["max_num_seqs"] for n in range(3)] == [256, 2, 128]
    base, pruned, whole = trials[0], trials[1], trials[2]
    # the others ran their whole workload
    for t in (base, whole):
        assert t.state == TrialState.COMPLETE and t.user_attrs["metrics"]["completed"] == N_REQUESTS
        assert "pruned" not in t.user_attrs
    # the breaking one: PRUNED in Optuna, its partial measurement and the cause kept
    assert pruned.state == TrialState.PRUNED
    why = pruned.user_attrs["pruned"]
    assert why["metric"] == "ttft_ms.p99" and why["value"] > why["factor"] * why["limit"] == 6000
    done = pruned.user_attrs["metrics"]["completed"]
    assert why["completed"] == done and 20 <= done < N_REQUESTS
    assert pruned.user_attrs["metrics"]["p99_ttft_ms"] == why["value"]
    assert pruned.user_attrs["feasible"] is False and "cause" not in pruned.user_attrs
    # single objective: Optuna's report at the step of the completed requests, which becomes its value
    assert pruned.intermediate_values == {done: pruned.value}
    assert pruned.value == pruned.user_attrs["metrics"]["output_throughput"]
    # the search sees it infeasible, by the measured relative excess (comparable to other SLO misses)
    assert total_violation(pruned.constraints) >= why["factor"] - 1
    assert total_violation(pruned.constraints) < 1e4
    assert [t.number for t in session.study.best()] != [1]
    # a proposal of its configuration again is no new budget trial
    assert session.study.same_config(pruned.user_attrs["config"]).number == 1
    assert session.study.counts()["PRUNED"] == 1
    (outcome,) = [o for o in result.outcomes if o.number == 1]
    assert outcome.pruned and "ttft_ms.p99" in outcome.pruned and not outcome.feasible and outcome.cause is None
    lines = run_summary(session.study.trials(), session.agent.spec, feasible=True, cycle_outcomes=result.outcomes)
    assert any(line.startswith("pruned 1 trial(s)") and "trial 1" in line for line in lines), lines
    # MLflow: the run of the pruned trial holds its partial measurement and says why
    runs = {r.data.tags["trial"]: r for r in session.tracker.runs() if r.data.tags.get("kind") == "trial"}
    r = runs["1"]
    assert r.data.tags["state"] == "PRUNED" and "ttft_ms.p99" in r.data.tags["pruned"]
    assert r.info.run_name.startswith("trial-1 pruned") and r.info.status == "FINISHED"
    assert r.data.metrics["completed"] == done and r.data.metrics["p99_ttft_ms"] > 6000
    arts = {a.path for a in session.tracker.client.list_artifacts(r.info.run_id)}
    assert {"requests.csv", "pruned.json"} <= arts
    path = session.tracker.client.download_artifacts(r.info.run_id, "pruned.json", str(tmp_path))
    assert json.loads(Path(path).read_text())["completed"] == done
    assert runs["2"].data.tags["state"] == "COMPLETE"
    cycle = next(r for r in session.tracker.runs() if r.data.tags.get("kind") == "cycle")
    assert cycle.data.metrics["trials_pruned"] == 1


def test_pruning_off_runs_every_trial_to_its_end(tmp_path: Path) -> None:
    session, _ = run(tmp_path, pruning={"enabled": False}, tracking={"enabled": False})
    trials = session.study.trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3
    assert [t.user_attrs["metrics"]["completed"] for t in trials] == [N_REQUESTS] * 3
    assert trials[1].user_attrs["feasible"] is False  # it still breaks the SLO, measured whole


def test_a_factor_it_does_not_reach_does_not_prune(tmp_path: Path) -> None:
    session, _ = run(tmp_path, pruning={"factor": 1e5}, tracking={"enabled": False})
    assert optuna.trial.TrialState.PRUNED not in {t.state for t in session.study.trials()}


def test_run_status_and_report_show_the_pruned_trial(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tuner.cli.main import app

    p = write(tmp_path, tracking={"enabled": False})
    sd = tmp_path / "state"
    session = open_session(load_agent(p), sd)  # the baseline first, then the configurations to run
    session.study.study.enqueue_trial({"max_num_seqs": 2})
    session.study.study.enqueue_trial({"max_num_seqs": 128})
    runner = CliRunner()
    res = runner.invoke(app, ["run", str(p), "--trials", "3", "--state-dir", str(sd)])
    assert res.exit_code == 0, res.output
    assert "pruned 1 trial(s)" in res.output and "trial 1 after" in res.output, res.output
    res = runner.invoke(app, ["status", str(p), "--state-dir", str(sd)])
    assert res.exit_code == 0 and "1 pruned" in res.output, res.output
    res = runner.invoke(app, ["run", str(p), "--trials", "1", "--state-dir", str(sd), "--json"])
    # the three configurations ran (one pruned): none is left, the pruned one is not deployed again
    assert json.loads(res.output.strip().splitlines()[-1])["trials"] == []
    from tuner.report.data import gather
    from tuner.study.study import TunerStudy

    agent = load_agent(p)
    study = TunerStudy(agent.spec, agent.space, storage_url=f"sqlite:///{sd / 'optuna.db'}")
    rows = {r.number: r for r in gather(agent, sd, study, plots=False).rows}
    assert rows[1].state == "pruned" and rows[1].broken == ["ttft_ms.p99"] and rows[1].values
