"""The run summary (nearest misses, failure causes, advice) and the `rate_per_s: auto` spec rules."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tuner.agent import load_agent
from tuner.errors import ConfigError
from tuner.loop import TrialOutcome
from tuner.spec import AgentSpec
from tuner.study.summary import nearest_misses, run_summary, slo_misses

SPEC = AgentSpec.model_validate({
    "name": "s", "target": {"kind": "sim"}, "search_space": {"params": {}},
    "workload": {"arrival": {"kind": "poisson", "rate_per_s": 16}, "num_requests": 10},
    "objectives": [{"metric": "request_goodput", "direction": "maximize"}],
    "slos": [{"metric": "ttft_ms.p99", "max": 100}, {"metric": "itl_ms.p99", "max": 50}],
})


def trial(number: int, metrics: dict[str, float] | None, *, feasible: bool = False, cause: str | None = None,
          baseline: bool = False) -> optuna.trial.FrozenTrial:
    attrs: dict[str, object] = {"feasible": feasible, "baseline": baseline}
    if metrics is not None:
        attrs["metrics"] = metrics
    if cause:
        attrs["cause"] = cause
    t = optuna.trial.create_trial(state=TrialState.COMPLETE, values=[1.0], user_attrs=attrs)
    t.number = number
    return t


def test_slo_misses_name_the_slo_the_value_and_the_excess() -> None:
    misses = slo_misses({"p99_ttft_ms": 766.0, "p99_itl_ms": 40.0}, SPEC.slos)
    assert [m.metric for m in misses] == ["ttft_ms.p99"]
    assert misses[0].text() == "ttft_ms.p99 766 ms > 100 ms (+666%)"


def test_nearest_misses_are_the_closest_measured_trials() -> None:
    trials = [
        trial(0, {"p99_ttft_ms": 1047.0, "p99_itl_ms": 30.0}, baseline=True),
        trial(1, {"p99_ttft_ms": 766.0, "p99_itl_ms": 60.0}),
        trial(2, {"p99_ttft_ms": 120.0, "p99_itl_ms": 20.0}),
        trial(3, None, cause="deploy_failed"),
        trial(4, {"p99_ttft_ms": 90.0, "p99_itl_ms": 20.0}, feasible=True),
        trial(5, {"p99_ttft_ms": 2000.0, "p99_itl_ms": 20.0}),
    ]
    near = nearest_misses(trials, SPEC, k=3)
    assert [n.trial for n in near] == [2, 1, 0]  # +20%, +666%, +947%; failed and feasible trials left out
    assert near[1].text() == "trial 1: ttft_ms.p99 766 ms > 100 ms (+666%); itl_ms.p99 60 ms > 50 ms (+20%)"
    assert near[2].text().startswith("trial 0 (baseline): ")


def test_run_summary_counts_failure_causes_and_says_what_to_change() -> None:
    trials = [trial(0, {"p99_ttft_ms": 300.0, "p99_itl_ms": 20.0}, baseline=True),
              trial(1, None, cause="deploy_failed"), trial(2, None, cause="deploy_failed"),
              trial(3, None, cause="startup_timeout")]
    outcomes = [TrialOutcome(0, {}, [1.0], False)] + [
        TrialOutcome(t.number, {}, [0.0], False, cause=t.user_attrs["cause"]) for t in trials[1:]]
    lines = run_summary(trials, SPEC, feasible=False, cycle_outcomes=outcomes)
    assert lines[0] == "failed trials by cause: deploy_failed x2, startup_timeout x1"
    assert lines[1] == "no feasible trial; nearest misses:"
    assert lines[2] == "  trial 0 (baseline): ttft_ms.p99 300 ms > 100 ms (+200%)"
    assert lines[-1].startswith("what to change: ") and "rate_per_s: auto" in lines[-1]
    # a feasible study: only the causes
    assert run_summary(trials, SPEC, feasible=True, cycle_outcomes=outcomes) == [lines[0]]
    assert run_summary(trials, SPEC, feasible=True) == []


def _agent(tmp_path: Path, arrival: str, slos: str = "[{metric: ttft_ms.p99, max: 100}]") -> Path:
    p = tmp_path / "a.yaml"
    p.write_text(f"""name: a
target: {{kind: sim}}
search_space: {{params: {{max_num_seqs: {{type: int, low: 8, high: 64, default: 16}}}}}}
workload: {{arrival: {arrival}, num_requests: 10}}
objectives: [{{metric: request_throughput, direction: maximize}}]
slos: {slos}
""")
    return p


def test_auto_rate_spec_rules(tmp_path: Path) -> None:
    a = load_agent(_agent(tmp_path, "{kind: poisson, rate_per_s: auto, load: 0.5}"))
    assert a.spec.workload.auto_rate and a.spec.workload.arrival.load == 0.5
    fixed = a.spec.workload.with_rate(3.5)
    assert fixed.arrival.rate_per_s == 3.5 and not fixed.auto_rate and fixed.arrival.load is None
    bad = {
        "{kind: closed, concurrency: 4, rate_per_s: auto}": "open-loop arrivals",
        "{kind: poisson, rate_per_s: 5, load: 0.5}": "load applies only with rate_per_s: auto",
        "{kind: poisson, rate_per_s: auto, load: 0}": "greater than 0",
        "{kind: poisson, rate_per_s: fast}": "rate_per_s",
        "{kind: poisson, rate_per_s: 0}": "rate_per_s: .*must be a finite number greater than 0, or auto",
    }
    for arrival, why in bad.items():
        with pytest.raises(ConfigError, match=why) as ei:
            load_agent(_agent(tmp_path, arrival))
        assert "a.yaml" in str(ei.value) and ei.value.exit_code == 2
    with pytest.raises(ConfigError, match="add at least one slo with a max"):
        load_agent(_agent(tmp_path, "{kind: poisson, rate_per_s: auto}", slos="[]"))


def test_an_unsized_auto_rate_is_refused_where_a_run_needs_a_number() -> None:
    from tuner.measure.workload import build_plans

    w = SPEC.workload.model_copy(update={"arrival": SPEC.workload.arrival.model_copy(
        update={"rate_per_s": "auto"})})
    with pytest.raises(ConfigError, match="rate_per_s is 'auto' and was not sized"):
        build_plans(w)
