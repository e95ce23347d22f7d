"""Pruning and the `max_rate_under_slo` objective on the real reference engine (`tuner serve-engine`), slowed by
a fixed delay per step so that what is asserted holds on any host, however busy: with one sequence per batch
and 8 requests in flight, the 8th waits for 7 others' 12 steps of at least 25 ms each (TTFT >= 2.1 s, more
than 3 x the 500 ms limit whatever the speed), while 8 or 16 per batch queue nothing; and one sequence per
batch cannot complete more than 1 / (12 x 25 ms) = 3.3 requests per second."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from optuna.trial import TrialState

from tests.support import agents
from tuner.agent import load_agent
from tuner.loop import open_session, run_cycle

pytestmark = [pytest.mark.slow, pytest.mark.process]

STEP_DELAY_MS = 25
OUTPUT_TOKENS = 12
N_REQUESTS = 60


def engine_agent(tmp_path: Path, **changes: Any) -> Path:
    spec = agents.agent_spec(
        name="engine-prune", noise={"baseline_repeats": 0}, sampler={"name": "random", "seed": 0},
        target={"kind": "torch_engine", "preset": "tiny", "device": "cpu", "cpu_threads": 1,
                "step_delay_ms": STEP_DELAY_MS, "startup_timeout_s": 120},
        search_space={"target": "torch_engine", "params": {
            "batching": {"type": "categorical", "choices": ["continuous"], "default": "continuous"},
            "max_batch_size": {"type": "categorical", "choices": [16, 1, 8], "default": 16}}},
        workload={"arrival": {"kind": "closed", "concurrency": 8}, "prompt_tokens": {"dist": "fixed", "value": 16},
                  "output_tokens": {"dist": "fixed", "value": OUTPUT_TOKENS}, "num_requests": N_REQUESTS,
                  "ignore_eos": True, "timeout_s": 60},
        slos=[{"metric": "ttft_ms.p99", "max": 500}], pruning={"min_requests": 10}, **changes)
    return agents.write_spec(tmp_path / "agent.yaml", spec)


def test_a_queueing_configuration_is_pruned_early_and_the_others_run_whole(tmp_path: Path) -> None:
    session = open_session(load_agent(engine_agent(tmp_path)), tmp_path / "state")
    for bs in (1, 8):
        session.study.study.enqueue_trial({"batching": "continuous", "max_batch_size": bs})
    result = run_cycle(session, trials=3)
    assert [o.cause for o in result.outcomes] == [None] * 3, [o.error for o in result.outcomes]
    base, pruned, whole = session.study.trials()
    assert pruned.params["max_batch_size"] == 1 and pruned.state == TrialState.PRUNED
    why = pruned.user_attrs["pruned"]
    assert why["metric"] == "ttft_ms.p99" and why["value"] > 3 * 500
    done = pruned.user_attrs["metrics"]["completed"]
    assert 10 <= done < N_REQUESTS and why["completed"] == done
    assert pruned.user_attrs["metrics"]["p99_ttft_ms"] > 1500
    for t in (base, whole):
        assert t.state == TrialState.COMPLETE and t.user_attrs["metrics"]["completed"] == N_REQUESTS
    # MLflow holds the partial measurement
    run = next(r for r in session.tracker.runs() if r.data.tags.get("trial") == str(pruned.number))
    assert run.data.tags["state"] == "PRUNED" and run.data.metrics["completed"] == done
    assert "requests.csv" in {a.path for a in session.tracker.client.list_artifacts(run.info.run_id)}


def test_max_rate_under_slo_searches_each_configuration_on_the_engine(tmp_path: Path) -> None:
    p = engine_agent(tmp_path, budget={"trials": 2}, tracking={"enabled": False},
                     objectives=[{"metric": "max_rate_under_slo", "direction": "maximize",
                                  "search": {"max_runs": 3, "run_s": 3, "start_rate_per_s": 4}}],
                     at={"workload.arrival": {"kind": "poisson", "rate_per_s": 4}})
    session = open_session(load_agent(p), tmp_path / "state")
    session.study.study.enqueue_trial({"batching": "continuous", "max_batch_size": 1})
    result = run_cycle(session, trials=2)
    assert [o.cause for o in result.outcomes] == [None, None], [o.error for o in result.outcomes]
    wide, single = session.study.trials()
    for t in (wide, single):
        search = t.user_attrs["capacity_search"]
        assert 1 <= search["runs"] == len(search["probes"]) <= 3
        assert t.values == [search["rate_per_s"]]
        passed = [p["rate_per_s"] for p in search["probes"] if p["ok"]]
        assert search["rate_per_s"] == (max(passed) if passed else 0.0)
        assert search["load_s"] > 0 and search["wall_s"] > 0
    assert single.values[0] < 1000 / (OUTPUT_TOKENS * STEP_DELAY_MS)  # the engine's bound at one per batch
    assert wide.values[0] > single.values[0]
    assert all(o.capacity is not None and o.capacity["runs"] >= 1 for o in result.outcomes)
