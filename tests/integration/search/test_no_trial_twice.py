"""Issue 26: one scale of violation for every cause, the target's real resources bound every proposal, and a
re-proposed configuration is a repeat of the earlier trial (a noise sample, no budget trial), never a second
budget trial."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna

from tests.support import agents
from tuner.agent import Agent, load_agent
from tuner.loop import open_session, run_cycle
from tuner.search.design import SpaceDesign, group_sweep
from tuner.study.objectives import total_violation


def _agent(tmp_path: Path, *, gpus: int = 8, model: str = "llama-3-8b", tp: int = 1, ttft: float = 5000,
           sampler: dict[str, Any] | None = None, trials: int = 12) -> Agent:
    spec = agents.agent_spec(
        name="twice", slos=[{"metric": "ttft_ms.p99", "max": ttft}], budget={"trials": trials},
        sampler=sampler or {"name": "tpe", "seed": 0, "resample_violations": 50}, tracking={"enabled": False},
        search_space={"params": {
            "tensor_parallel_size": {"type": "categorical", "choices": [1, 2, 4, 8], "default": tp},
            "data_parallel_size": {"type": "categorical", "choices": [1, 2, 4, 8], "default": 1},
            "max_num_seqs": {"type": "categorical", "choices": [32, 256], "default": 256},
        }, "constraints": ["tensor_parallel_size * data_parallel_size <= 8"]},
        at={"target.model": model, "target.num_gpus": gpus, "workload.arrival": {"kind": "closed", "concurrency": 16},
            "workload.prompt_tokens": {"dist": "fixed", "value": 64},
            "workload.output_tokens": {"dist": "fixed", "value": 16}, "workload.num_requests": 24})
    return load_agent(agents.write_spec(tmp_path / "agent.yaml", spec))


def test_the_layout_sweep_on_a_4_gpu_target_proposes_only_layouts_it_can_place(tmp_path: Path) -> None:
    session = open_session(_agent(tmp_path, gpus=4, sampler={"name": "auto", "seed": 0}), tmp_path / "state")
    space = session.agent.space
    layouts = {(c["tensor_parallel_size"], c["data_parallel_size"]) for c in group_sweep(space, 0)}
    assert layouts and all(tp * dp <= 4 for tp, dp in layouts)  # the declared constraint allows 8
    assert {(2, 2), (4, 1), (1, 4)} <= layouts
    design = SpaceDesign(space, 0, around_defaults=True)
    assert all(design.config(i)["tensor_parallel_size"] * design.config(i).get("data_parallel_size", 1) <= 4
               for i in range(30))
    result = run_cycle(session, trials=12)
    assert all(o.cause is None for o in result.outcomes), [(o.number, o.cause) for o in result.outcomes]
    assert all(o.params["tensor_parallel_size"] * o.params["data_parallel_size"] <= 4 for o in result.outcomes)
    rejected = [t for t in session.study.trials() if t.user_attrs.get("rejected")]
    for t in rejected:  # what a proposal beyond the target's GPUs is told: never deployed
        assert "target resources: needs" in t.user_attrs["error"] and "metrics" not in t.user_attrs


def test_memory_bounds_the_proposals(tmp_path: Path) -> None:
    # a 70B model's weights (141 GB) fit no 80 GB GPU at TP 1; at TP 2 they do
    session = open_session(_agent(tmp_path, model="llama-3-70b", tp=4), tmp_path / "state")
    space = session.agent.space
    bad = space.violations({"tensor_parallel_size": 1, "data_parallel_size": 1, "max_num_seqs": 256})
    assert bad and "GiB per GPU at tensor_parallel_size=1" in bad[0]
    assert not space.violations({"tensor_parallel_size": 2, "data_parallel_size": 1, "max_num_seqs": 256})
    assert all(c["tensor_parallel_size"] >= 2 for c in group_sweep(space, 0))


def test_a_rejected_proposal_ranks_below_every_measured_slo_miss(tmp_path: Path) -> None:
    # a TTFT SLO no configuration meets: every measured trial misses it; constraint-breakers are rejected
    session = open_session(_agent(tmp_path, ttft=0.001,
                                  sampler={"name": "random", "seed": 0, "resample_violations": 50}),
                           tmp_path / "state")
    run_cycle(session, trials=8)
    # a trial pruned for its partial measurement's miss is a measured miss too
    trials = [t for t in session.study.trials()
              if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)]
    measured = [t for t in trials if "metrics" in t.user_attrs and "cause" not in t.user_attrs]
    rejected = [t for t in trials if t.user_attrs.get("rejected")]
    assert measured and rejected
    assert not any(t.user_attrs["feasible"] for t in measured)
    worst_miss = max(total_violation(t.constraints) for t in measured)
    assert worst_miss > 1  # misses by far (a real miss of more than 100%)
    assert min(total_violation(t.constraints) for t in rejected) > worst_miss
    # Optuna's TPE ranks infeasible trials by that sum: the rejected ones are its worst
    from optuna.samplers._tpe.sampler import _get_infeasible_trial_score

    ranked = sorted(measured + rejected, key=_get_infeasible_trial_score)
    assert all(not t.user_attrs.get("rejected") for t in ranked[:len(measured)])


def test_a_reproposed_configuration_is_a_repeat_not_a_budget_trial(tmp_path: Path) -> None:
    # 16 allowed configurations; 14 budget trials of random search draw many configurations twice
    agent = _agent(tmp_path, sampler={"name": "random", "seed": 3, "resample_violations": 50}, trials=14)
    session = open_session(agent, tmp_path / "state")
    result = run_cycle(session, trials=14)
    configs = [tuple(sorted(o.params.items())) for o in result.outcomes]
    assert len(configs) == len(set(configs)) == 14  # no configuration is two budget trials
    assert result.repeats, "random draws from 16 configurations repeat within 14 trials"
    study = session.study
    numbers = {o.number for o in result.outcomes}
    for r in result.repeats:
        assert r.repeat_of in numbers and r.params == next(o.params for o in result.outcomes
                                                           if o.number == r.repeat_of)
    assert study.counted() == 14  # the repeats and the copies are no budget trials
    pooled = study.pooled()
    assert all(len(pooled[r.repeat_of]) >= 2 for r in result.repeats)  # pooled: noise samples
    assert study.noise_cv() == 0.0  # the sim without noise measures a configuration the same every time
    copies = [t for t in study.trials() if t.user_attrs.get("duplicate_of") is not None]
    assert all("metrics" not in t.user_attrs for t in copies)  # answered from the earlier trial, not deployed
    assert all(t.user_attrs.get("repeat_of") is None for t in study.best())


def test_a_best_that_changes_no_parameter_is_not_a_gain(tmp_path: Path) -> None:
    from optuna.trial import create_trial

    from tuner.study.study import same_as_baseline

    base = create_trial(value=1.0, user_attrs={"config": {"a": 1}, "baseline": True})
    same = create_trial(value=1.2, user_attrs={"config": {"a": 1}})
    other = create_trial(value=1.2, user_attrs={"config": {"a": 2}})
    assert same_as_baseline(same, base) and not same_as_baseline(other, base)
