"""The `max_rate_under_slo` objective on the simulator: each trial's bounded capacity search finds its highest rate
under the SLOs, every probe run is recorded (Optuna, MLflow), the value is the found rate and the cost is in the
summary."""

from __future__ import annotations

import json
from pathlib import Path

from optuna.trial import TrialState

from tests.support import agents
from tuner.agent import load_agent
from tuner.loop import open_session, run_cycle
from tuner.study.summary import run_summary

MAX_RUNS = 6


def test_each_trial_searches_its_rate_and_records_every_probe(tmp_path: Path) -> None:
    p = agents.write_agent(
        tmp_path / "agent.yaml", name="rate", budget={"trials": 2}, sampler={"name": "random", "seed": 0},
        objectives=[{"metric": "max_rate_under_slo", "direction": "maximize",
                     "search": {"max_runs": MAX_RUNS, "run_s": 10}}],
        slos=[{"metric": "ttft_ms.p99", "max": 500}], noise={"baseline_repeats": 0},
        search_space={"params": {"max_num_seqs": {"type": "categorical", "choices": [256, 4], "default": 256}}},
        at={"workload.arrival": {"kind": "poisson", "rate_per_s": 10}})
    session = open_session(load_agent(p), tmp_path / "state")
    session.study.study.enqueue_trial({"max_num_seqs": 4})
    result = run_cycle(session, trials=2)
    trials = session.study.trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2
    rates = []
    for t in trials:
        search = t.user_attrs["capacity_search"]
        probes = search["probes"]
        assert len(probes) == search["runs"] <= MAX_RUNS
        rate = search["rate_per_s"]
        rates.append(rate)
        assert t.values == [rate] and t.user_attrs["metrics"]["max_rate_under_slo"] == rate
        # the highest passing probe is the found rate; every probe above it failed
        assert rate == max(p["rate_per_s"] for p in probes if p["ok"])
        assert all(not p["ok"] for p in probes if p["rate_per_s"] > rate)
        if search["upper_rate_per_s"] is not None:
            assert search["upper_rate_per_s"] > rate
        # the trial's figures are those of the run at the found rate: it meets the SLO
        assert search["measured_at_rate_per_s"] == rate
        assert t.user_attrs["feasible"] and t.user_attrs["metrics"]["p99_ttft_ms"] <= 500
        assert t.user_attrs["metrics"]["capacity_probe_runs"] == len(probes)
        assert abs(search["load_s"] - sum(p["duration"] for p in probes)) < 1e-2
    # 256 sequences in flight serve far more under the SLO than 4
    assert rates[0] > 2 * rates[1] > 0
    assert session.study.best()[0].number == 0
    # the cost, in the run's summary and the cycle's MLflow run
    lines = run_summary(trials, session.agent.spec, feasible=True, cycle_outcomes=result.outcomes)
    total = sum(t.user_attrs["capacity_search"]["runs"] for t in trials)
    assert any(line.startswith(f"capacity search (max_rate_under_slo): {total} probe run(s) over 2 trial(s)")
               for line in lines), lines
    runs = session.tracker.runs()
    cycle = next(r for r in runs if r.data.tags.get("kind") == "cycle")
    assert cycle.data.metrics["capacity_probe_runs"] == total
    trial_run = next(r for r in runs if r.data.tags.get("trial") == "1")
    assert trial_run.data.metrics["max_rate_under_slo"] == rates[1]
    path = session.tracker.client.download_artifacts(trial_run.info.run_id, "capacity_search.json", str(tmp_path))
    assert len(json.loads(Path(path).read_text())["probes"]) == trials[1].user_attrs["capacity_search"]["runs"]
