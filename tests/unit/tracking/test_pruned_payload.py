"""A PRUNED trial's MLflow run, as the reconcile writes it: its partial measurement, status FINISHED (it was not a
failure), and the run name the loop gives it."""

from __future__ import annotations

from optuna.distributions import IntDistribution
from optuna.trial import TrialState, create_trial

from tuner.study.objectives import Evaluation
from tuner.tracking.review import trial_run_name
from tuner.tracking.sync import FINISHED_STATES, trial_payload


def test_a_pruned_trial_is_written_with_its_partial_measurement() -> None:
    t = create_trial(state=TrialState.PRUNED, params={"max_num_seqs": 2},
                     distributions={"max_num_seqs": IntDistribution(1, 512)}, intermediate_values={20: 180.0},
                     user_attrs={"config": {"max_num_seqs": 2}, "metrics": {"completed": 20.0, "p99_ttft_ms": 6100.0},
                                 "pruned": {"metric": "ttft_ms.p99", "completed": 20}, "feasible": False})
    assert t.state in FINISHED_STATES
    params, metrics, status = trial_payload(t, ["output_throughput"])
    assert status == "FINISHED" and params == {"max_num_seqs": 2}
    assert metrics["completed"] == 20.0 and metrics["p99_ttft_ms"] == 6100.0


def test_run_names_say_pruned() -> None:
    ev = Evaluation(values=[1.0], constraints={"slo:ttft_ms.p99": 2.05, "deployed_and_measured": 0.0})
    assert trial_run_name(4, baseline=False, ev=ev, cause=None, pruned=True) == "trial-4 pruned ttft_ms.p99"
    assert trial_run_name(4, baseline=False, ev=ev, cause=None) == "trial-4 infeasible ttft_ms.p99"
