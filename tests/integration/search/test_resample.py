"""Proposals that break a declared constraint cost no budget trial when the sampler resamples them."""

from pathlib import Path

import optuna

from tuner.agent import load_agent
from tuner.loop import open_session, run_cycle

AGENT = """\
name: resample-test
target: {{kind: sim, hardware: a100-80gb-sxm, model: llama-3-8b, num_gpus: 8}}
search_space:
  params:
    tensor_parallel_size: {{type: categorical, choices: [1, 2, 4, 8], default: 1}}
    data_parallel_size: {{type: categorical, choices: [1, 2, 4, 8], default: 1}}
    max_num_seqs: {{type: int, low: 8, high: 512, log: true, default: 256}}
  constraints:
    - tensor_parallel_size * data_parallel_size <= 8
workload:
  arrival: {{kind: poisson, rate_per_s: 20}}
  prompt_tokens: {{dist: fixed, value: 64}}
  output_tokens: {{dist: fixed, value: 16}}
  num_requests: 20
objectives:
  - {{metric: output_throughput, direction: maximize}}
sampler: {sampler}
budget: {{trials: 12}}
tracking: {{enabled: false}}
"""


def _run(tmp_path: Path, sampler: str) -> tuple[list, list[optuna.trial.FrozenTrial]]:
    p = tmp_path / "agent.yaml"
    p.write_text(AGENT.format(sampler=sampler))
    session = open_session(load_agent(p), tmp_path / "state")
    result = run_cycle(session, trials=12)
    return result.outcomes, session.study.trials()


def test_violating_proposals_are_rejected_not_spent(tmp_path: Path) -> None:
    outcomes, trials = _run(tmp_path, "{name: random, seed: 0, resample_violations: 50}")
    assert len(outcomes) == 12 and all(o.cause is None for o in outcomes)  # every budget trial deployed
    rejected = [t for t in trials if t.user_attrs.get("rejected")]
    assert rejected, "random draws break TP x DP <= 8 6 times in 16: some must have been rejected"
    for t in rejected:
        assert t.user_attrs["cause"] == "constraint" and t.user_attrs["feasible"] is False
        assert t.params["tensor_parallel_size"] * t.params["data_parallel_size"] > 8
        assert t.state == optuna.trial.TrialState.COMPLETE and max(t.constraints.values()) > 0  # data for TPE
        assert "metrics" not in t.user_attrs  # never deployed
    assert {o.number for o in outcomes}.isdisjoint({t.number for t in rejected})


def test_without_resampling_a_violation_is_a_spent_infeasible_trial(tmp_path: Path) -> None:
    outcomes, trials = _run(tmp_path, "{name: random, seed: 0}")
    assert len(outcomes) == 12
    assert any(o.cause == "infeasible_config" for o in outcomes)
    assert not any(t.user_attrs.get("rejected") for t in trials)
