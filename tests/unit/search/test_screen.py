"""Screening (tuner.study.screen): a proposal the calibrated simulator predicts far outside the SLOs, or far worse than
the best, is told to Optuna as screened, never deployed, never charged, never the best."""

from __future__ import annotations

from pathlib import Path

import pytest
from optuna.trial import TrialState

from tuner.agent import Agent, load_agent, preflight
from tuner.errors import ConfigError
from tuner.sim.refcost import StepModel, load_screen_model
from tuner.study.objectives import Evaluation
from tuner.study.screen import SCREEN_CONSTRAINT, Screener
from tuner.study.study import TunerStudy

CHEAP = [1e-3, 5e-4, 1e-5, 0.0, 2e-3, 1e-4, 0.0, 0.0, 0.0]
SLOW = [1.0] + [0.0] * 8  # a second a pass: every request far beyond the 2 s p99 TTFT

AGENT = """\
name: screen-test
target: {{kind: torch_engine, preset: tiny, device: cpu, cpu_threads: 1}}
search_space:
  target: torch_engine
  params:
    batching: {{type: categorical, choices: [static, continuous], default: static}}
    max_batch_size: {{type: int, low: 1, high: 16, log: true, default: 8}}
    dtype: {{type: categorical, choices: [float32, bfloat16], default: float32}}
workload:
  arrival: {{kind: poisson, rate_per_s: 4}}
  prompt_tokens: {{dist: uniform, low: 32, high: 96}}
  output_tokens: {{dist: uniform, low: 8, high: 16}}
  duration_s: 4
objectives:
  - {{metric: ttft_ms.mean, direction: minimize}}
slos:
  - {{metric: ttft_ms.p99, max: 2000}}
sampler: {{name: random, seed: 0, screen: {{model: {model}}}}}
budget: {{trials: 8}}
tracking: {{enabled: false}}
"""


def agent(tmp_path: Path, *, model: str = "model.json") -> Agent:
    StepModel(coef={"float32": CHEAP, "bfloat16": SLOW}).save(tmp_path / "model.json")
    p = tmp_path / "agent.yaml"
    p.write_text(AGENT.format(model=model))
    return load_agent(p)


def study_of(a: Agent) -> TunerStudy:
    space = a.space.bind_facts({"device": "cpu"})
    study = TunerStudy(a.spec.model_copy(update={"storage": "memory:"}), space, storage_url="memory:")
    study.screener = Screener.for_agent(a, None)
    return study


def test_proposals_predicted_far_outside_the_slos_are_screened_not_spent(tmp_path: Path) -> None:
    study = study_of(agent(tmp_path))
    asked = [study.ask()[1] for _ in range(8)]
    assert all(p["dtype"] == "float32" for p in asked)  # every bfloat16 proposal screened
    screened = [t for t in study.trials() if t.user_attrs.get("screened")]
    assert screened, "a random sampler proposes bfloat16 about every other time"
    for t in screened:
        assert t.params["dtype"] == "bfloat16" and t.state == TrialState.COMPLETE
        assert t.user_attrs["cause"] == "screened" and t.user_attrs["feasible"] is False
        assert t.user_attrs["predicted"]["p99_ttft_ms"] > 3000  # the prediction, kept as such
        assert "metrics" not in t.user_attrs  # never measured
        assert t.constraints and max(t.constraints.values()) > 0  # infeasible to the sampler too
    # screened proposals cost no budget trial (nor does a repeat: a configuration one of the 8 still running has)
    repeats = [t for t in study.trials() if t.user_attrs.get("repeat_of") is not None]
    assert study.counted() == 8 - len(repeats)
    assert study.counts()["SCREENED"] == len(screened)


def test_a_screened_proposal_is_never_the_best(tmp_path: Path) -> None:
    study = study_of(agent(tmp_path))
    trial, _ = study.ask()
    study.tell(trial, Evaluation(values=[50.0], constraints={"slo:ttft_ms.p99": -0.5}), attrs={})
    while not any(t.user_attrs.get("screened") for t in study.trials()):
        study.ask()
    assert [t.number for t in study.best()] == [trial.number]


def test_a_proposal_predicted_far_worse_than_the_best_is_screened(tmp_path: Path) -> None:
    screener = Screener.for_agent(agent(tmp_path), None)
    config = {"batching": "static", "batch_timeout_ms": 50.0, "max_batch_size": 8, "dtype": "float32"}
    assert screener.judge(config, incumbent=None) is None  # within the SLOs, nothing to compare with
    predicted = screener.predict(config)
    assert predicted is not None
    value = predicted[0].values[0]
    assert screener.judge(config, incumbent=value) is None
    verdict = screener.judge(config, incumbent=value / 10)  # 10x worse than a best measured at a tenth
    assert verdict is not None and "worse than the best" in verdict.reason
    assert verdict.evaluation.constraints[SCREEN_CONSTRAINT] == 1.0


def test_screening_needs_the_reference_engine_and_a_model_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="torch_engine"):
        a = agent(tmp_path)
        load_screen_model(a.spec.sampler.screen, a.path.parent, "sim")
    with pytest.raises(ConfigError, match="sampler.screen.model") as exc:
        preflight(agent(tmp_path, model="missing.json"))
    assert exc.value.file is not None and exc.value.file.endswith("agent.yaml")
