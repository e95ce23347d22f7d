"""The sample-efficiency study's pieces: one run through the tuner's loop as the agent ships, and the table's
arithmetic (best-after-k ratios, trials to a fraction of the optimum)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "experiments" / "sample-efficiency"))

from compare import first_reach, row  # noqa: E402
from harness import load, tune  # noqa: E402


def test_first_reach_and_the_row_of_a_variant() -> None:
    assert first_reach([0.0, 50.0, 96.0, 10.0], 95.0) == 3
    assert first_reach([0.0, 50.0], 95.0) is None
    res = {"variant": "v", "trials": 4, "runs": [
        {"values": [0.0, 50.0, 96.0, 10.0], "overhead_s": 0.4},
        {"values": [0.0, 91.0, 91.0, 91.0], "overhead_s": 0.4},
        {"values": [0.0, 0.0, 0.0, 0.0], "overhead_s": 0.4}]}
    r = row(res, 100.0)
    assert r["k5"] == (0.91, 0.0)  # medians and worst over seeds of the best so far
    assert r["to90"] == (3, 2)  # two seeds reach 90%, at trials 3 and 2: the median of (2, 3, never)
    assert r["to95"] == (None, 1)  # one seed of three reaches 95%: the median is 'never'
    assert abs(r["overhead_ms"] - 100.0) < 1e-9


def test_a_run_as_shipped_starts_with_the_baseline_then_the_parallel_layouts() -> None:
    agent = load("agents/sim-8xa100.yaml", noise_cv=0.0)
    outcomes = tune(agent, 3, cache={})
    assert len(outcomes) == 3
    base = outcomes[0]
    assert base.params == agent.space.defaults() and not base.feasible  # p99 ITL above the SLO
    for o in outcomes[1:]:
        tp, dp = o.params["tensor_parallel_size"], o.params["data_parallel_size"]
        assert tp * dp <= 8 and (tp, dp) != (1, 1)
        assert {k: v for k, v in o.params.items() if k not in ("tensor_parallel_size", "data_parallel_size")} == {
            k: v for k, v in base.params.items() if k not in ("tensor_parallel_size", "data_parallel_size")}
