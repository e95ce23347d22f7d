"""TunerStudy.tell(..., pruned_at=n): a trial stopped early is PRUNED in Optuna with its constraints and attributes;
a single-objective study reports the partial value at step n (Optuna's pruning API: the pruned trial's value), a
multi-objective one cannot report (its pruned trials have no values)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from optuna.trial import TrialState

from tuner.agent import load_agent
from tuner.study.objectives import Evaluation
from tuner.study.study import TunerStudy

CONS = {"slo:ttft_ms.p99": 2.5, "deployed_and_measured": 0.0}


def study_of(path: Path) -> TunerStudy:
    agent = load_agent(path)
    return TunerStudy(agent.spec, agent.space, storage_url="memory:")


def test_single_objective_pruned_trial_has_its_partial_value(agent_file: Callable[..., Path]) -> None:
    study = study_of(agent_file())
    trial, _ = study.ask()
    t = study.tell(trial, Evaluation(values=[123.0], constraints=CONS), attrs={"pruned": {"completed": 20}},
                   pruned_at=20)
    assert t.state == TrialState.PRUNED and t.value == 123.0 and t.intermediate_values == {20: 123.0}
    assert t.constraints == CONS
    assert t.user_attrs["feasible"] is False and t.user_attrs["pruned"] == {"completed": 20}
    assert study.best() == [] and study.counts()["PRUNED"] == 1


def test_multi_objective_pruned_trial_has_no_values(agent_file: Callable[..., Path]) -> None:
    study = study_of(agent_file(objectives=[{"metric": "output_throughput", "direction": "maximize"},
                                            {"metric": "ttft_ms.p99", "direction": "minimize"}]))
    trial, _ = study.ask()
    t = study.tell(trial, Evaluation(values=[123.0, 9000.0], constraints=CONS), attrs={}, pruned_at=20)
    assert t.state == TrialState.PRUNED and t.values is None and not t.intermediate_values
    assert t.user_attrs["feasible"] is False
