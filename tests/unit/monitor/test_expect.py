"""The champion's expectation (tuner.monitor.expect): elasticities from the reference engine's simulator, levels
from the champion's trial, and the factor the monitor divides each latency by."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from tests.support import agents
from tuner.agent import load_agent
from tuner.champions.db import champion_store
from tuner.champions.store import ChampionRecord
from tuner.loop import open_session
from tuner.monitor.expect import ChampionExpectation, champion_expectation, from_simulator, varied
from tuner.sim.refcost import StepModel
from tuner.spec import WorkloadSpec

COEF = [1e-3, 5e-4, 1e-5, 0.0, 2e-3, 1e-4, 0.0, 0.0, 0.0]
WORKLOAD = {"arrival": {"kind": "poisson", "rate_per_s": 3.0}, "prompt_tokens": {"dist": "uniform", "low": 16,
            "high": 64}, "output_tokens": {"dist": "uniform", "low": 8, "high": 24}, "duration_s": 60,
            "ignore_eos": True}


def write_exp_agent(path: Path) -> Path:
    """A torch_engine agent over the batching mode, its screening model in model.json beside it."""
    return agents.write_agent(
        path, name="exp", target={"kind": "torch_engine", "preset": "tiny", "device": "cpu", "cpu_threads": 1},
        search_space={"target": "torch_engine", "params": {
            "batching": {"type": "categorical", "choices": ["static", "continuous"], "default": "continuous"}}},
        workload=WORKLOAD, objectives=[{"metric": "ttft_ms.mean", "direction": "minimize"}], slos=None,
        sampler={"name": "random", "seed": 1, "screen": {"model": "model.json"}}, budget={"trials": 1},
        tracking={"enabled": False})


def test_elasticities_from_the_simulator_and_the_factor() -> None:
    wl = WorkloadSpec.model_validate(WORKLOAD)
    e = from_simulator(StepModel(coef={"float32": COEF}), {}, wl, measured={"median_e2el_ms": 120.0})
    assert e.reference["rate_per_s"] == pytest.approx(3.0, rel=0.2)
    assert e.elasticity["e2el_ms_p50"]["output_tokens_mean"] > 0.3  # longer answers take longer to finish
    assert e.measured_ms == {"e2el_ms_p50": 120.0}
    at_ref = dict(e.reference)
    assert e.factor("e2el_ms_p50", at_ref) == pytest.approx(1.0)
    longer = {**at_ref, "output_tokens_mean": 2 * at_ref["output_tokens_mean"]}
    assert e.factor("e2el_ms_p50", longer) > 1.2
    assert e.expected_ms("e2el_ms_p50", longer) == pytest.approx(120.0 * e.factor("e2el_ms_p50", longer))
    assert e.factor("rate_per_s", longer) == 1.0  # inputs expect nothing
    far = ChampionExpectation(reference={"rate_per_s": 1.0}, elasticity={"ttft_ms_p50": {"rate_per_s": 4.0}})
    assert far.factor("ttft_ms_p50", {"rate_per_s": 100.0}) == pytest.approx(10.0)  # clipped
    with pytest.raises(ValueError):
        varied(wl.model_copy(update={"arrival": wl.arrival.model_copy(update={"kind": "closed", "concurrency": 4,
                                                                              "rate_per_s": None})}),
               "rate_per_s", 1.25)


def test_the_champion_in_force_gives_its_trial_and_the_screen_model_its_slopes(tmp_path: Path) -> None:
    StepModel(coef={"float32": COEF}).save(tmp_path / "model.json")
    session = open_session(load_agent(write_exp_agent(tmp_path / "agent.yaml")), tmp_path / "state")
    assert champion_expectation(session) is None  # no champion: nothing expected
    dist = optuna.distributions.CategoricalDistribution(["static", "continuous"])
    session.study.study.add_trial(optuna.trial.create_trial(
        params={"batching": "continuous"}, distributions={"batching": dist}, values=[40.0],
        user_attrs={"metrics": {"median_ttft_ms": 40.0, "mean_itl_ms": 9.0}}))
    number = session.study.study.get_trials(deepcopy=False)[-1].number
    champion_store(session).write_champion(ChampionRecord(seq=1, agent="exp", config={"batching": "continuous"},
                                                          study=session.study.name, trial=number))
    e = champion_expectation(session)
    assert e is not None and e.measured_ms == {"ttft_ms_p50": 40.0, "itl_ms_mean": 9.0}
    assert e.elasticity["e2el_ms_p50"] and e.reference["output_tokens_mean"] == pytest.approx(16, rel=0.2)
