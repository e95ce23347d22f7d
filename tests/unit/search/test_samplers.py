"""The sampler registry: every registered name builds its Optuna sampler; unknown names are refused by name."""

from pathlib import Path

import optuna
import pytest

from tuner.agent import load_agent
from tuner.errors import ConfigError
from tuner.search.samplers import SAMPLER_NAMES, SAMPLERS, make_sampler
from tuner.search.space import parse_space
from tuner.spec import SamplerSpec

SPACE = parse_space({"params": {
    "max_num_seqs": {"type": "int", "low": 8, "high": 512, "log": True, "default": 256},
    "kv_cache_dtype": {"type": "categorical", "choices": ["auto", "fp8"], "default": "auto"},
}}, file="space.yaml")

EXPECTED = {"tpe": optuna.samplers.TPESampler, "nsga2": optuna.samplers.NSGAIISampler,
            "gp": optuna.samplers.GPSampler, "random": optuna.samplers.RandomSampler,
            "grid": optuna.samplers.GridSampler, "qmc": optuna.samplers.QMCSampler}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_name_builds_its_sampler(name: str) -> None:
    assert isinstance(make_sampler(SamplerSpec(name=name, seed=3), SPACE), EXPECTED[name])


def test_registry_is_the_source_of_the_valid_names(tmp_path: Path) -> None:
    assert set(SAMPLER_NAMES) == set(SAMPLERS) >= set(EXPECTED)
    agent = tmp_path / "a.yaml"  # the loader checks the name (the spec schemas import nothing of the tuner)
    agent.write_text("name: a\ntarget: {kind: sim}\nsearch_space: {params: {max_num_seqs: {type: int, low: 8, "
                     "high: 64}}}\nworkload: {num_requests: 10}\n"
                     "objectives: [{metric: output_throughput, direction: maximize}]\nsampler: annealing\n")
    with pytest.raises(ConfigError, match="unknown sampler 'annealing'; valid: tpe") as info:
        load_agent(agent)
    assert info.value.field == "sampler.name" and info.value.line == 6


def test_an_unregistered_name_is_a_config_error() -> None:
    spec = SamplerSpec.model_construct(name="annealing", seed=0, n_startup_trials=None)  # bypasses validation
    with pytest.raises(ConfigError, match="unknown sampler 'annealing'") as info:
        make_sampler(spec, SPACE)
    assert info.value.field == "sampler.name"


def test_startup_trials_reach_the_sampler() -> None:
    tpe = make_sampler(SamplerSpec(name="tpe", n_startup_trials=3), SPACE)
    assert isinstance(tpe, optuna.samplers.TPESampler) and tpe._n_startup_trials == 3


def test_the_default_ranks_its_local_steps_unless_told_not_to() -> None:
    from tuner.search.design import DesignThenSampler

    guided = make_sampler(SamplerSpec(), SPACE)
    plain = make_sampler(SamplerSpec(model_guided=False), SPACE)
    assert isinstance(guided, DesignThenSampler) and guided._guided and guided._coordinate
    assert isinstance(plain, DesignThenSampler) and not plain._guided and not plain._coordinate
