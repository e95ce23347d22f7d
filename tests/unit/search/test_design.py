"""The Sobol initial design: space-filling, conditions applied, constraints honoured, baseline not counted."""

import optuna
import pytest

from tuner.search.design import DESIGN_ATTR, DesignThenSampler, SpaceDesign
from tuner.search.points import point_to_config, unit_to_value
from tuner.search.samplers import make_sampler
from tuner.search.space import parse_space
from tuner.spec import SamplerSpec

SPACE = parse_space({
    "params": {
        "tensor_parallel_size": {"type": "categorical", "choices": [1, 2, 4, 8], "default": 1},
        "data_parallel_size": {"type": "categorical", "choices": [1, 2, 4, 8], "default": 1},
        "batching": {"type": "categorical", "choices": ["continuous", "static"], "default": "continuous"},
        "batch_timeout_ms": {"type": "float", "low": 1.0, "high": 2000.0, "log": True, "default": 100.0,
                             "when": "batching == 'static'"},
        "max_num_seqs": {"type": "int", "low": 8, "high": 1024, "log": True, "default": 256},
        "enforce_eager": {"type": "bool", "default": False},
    },
    "constraints": ["tensor_parallel_size * data_parallel_size <= 8"],
}, file="space.yaml")


def test_unit_values_cover_each_range_and_choice() -> None:
    p = SPACE.by_name["max_num_seqs"]
    assert unit_to_value(p, 0.0) == 8 and unit_to_value(p, 0.999999) == 1024
    assert unit_to_value(p, 0.5) == 91  # log scale: the geometric middle of 8..1024
    tp = SPACE.by_name["tensor_parallel_size"]
    assert [unit_to_value(tp, u) for u in (0.0, 0.26, 0.51, 0.99)] == [1, 2, 4, 8]


def test_conditions_apply_to_a_point() -> None:
    cont = point_to_config(SPACE, [0.0, 0.0, 0.1, 0.5, 0.5, 0.9])
    static = point_to_config(SPACE, [0.0, 0.0, 0.9, 0.5, 0.5, 0.9])
    assert "batch_timeout_ms" not in cont and cont["batching"] == "continuous"
    assert static["batching"] == "static" and 1.0 <= static["batch_timeout_ms"] <= 2000.0


def test_design_honours_constraints_and_spreads() -> None:
    d = SpaceDesign(SPACE, seed=0)
    configs = [d.config(i) for i in range(16)]
    assert all(not SPACE.violations(c) for c in configs)
    assert d.skipped > 0  # the unconstrained sequence does break TP x DP <= 8
    pairs = {(c["tensor_parallel_size"], c["data_parallel_size"]) for c in configs}
    assert len(pairs) >= 7  # 10 pairs are allowed; 16 random draws of them would repeat more
    assert d.config(3) == configs[3]  # stable
    assert SpaceDesign(SPACE, seed=1).config(0) != configs[0]


def _ask(study: optuna.Study) -> optuna.trial.Trial:
    trial = study.ask()
    chosen: dict = {}
    for p in SPACE.params:
        if SPACE.active(p, chosen):
            chosen[p.name] = trial._suggest(p.name, p.distribution())
    study.tell(trial, float(len(chosen)))
    return trial


def test_design_trials_then_the_model_and_the_baseline_is_not_a_design_trial() -> None:
    sampler = make_sampler(SamplerSpec(name="tpe", seed=0, n_startup_trials=4, initial_design="sobol"), SPACE)
    assert isinstance(sampler, DesignThenSampler)
    study = optuna.create_study(sampler=sampler, direction="maximize")
    study.enqueue_trial(SPACE.defaults())
    for _ in range(7):
        _ask(study)
    trials = study.get_trials()
    design = SpaceDesign(SPACE, seed=0)
    assert DESIGN_ATTR not in trials[0].system_attrs and trials[0].params == SPACE.defaults()
    assert [t.system_attrs.get(DESIGN_ATTR) for t in trials[1:]] == [0, 1, 2, 3, None, None]
    for i, t in enumerate(trials[1:5]):
        assert t.params == design.config(i)


@pytest.mark.parametrize("name", ["tpe", "gp"])
def test_sobol_design_is_offered_for_model_based_samplers(name: str) -> None:
    assert isinstance(make_sampler(SamplerSpec(name=name, initial_design="sobol"), SPACE), DesignThenSampler)


def test_group_sweep_covers_the_allowed_parallel_layouts_at_the_defaults() -> None:
    from tuner.search.design import constrained_groups, group_sweep

    assert constrained_groups(SPACE) == [["tensor_parallel_size", "data_parallel_size"]]
    sweep = group_sweep(SPACE, seed=0)
    layouts = {(c["tensor_parallel_size"], c["data_parallel_size"]) for c in sweep}
    assert len(sweep) == len(layouts) == 9  # 10 pairs with TP x DP <= 8, less the baseline's (1, 1)
    assert all(c["max_num_seqs"] == 256 and c["batching"] == "continuous" for c in sweep)
    assert group_sweep(SPACE, seed=1) != sweep and sorted(map(str, group_sweep(SPACE, seed=1))) == sorted(
        map(str, sweep))
    d = SpaceDesign(SPACE, seed=0, sweep_groups=True)
    assert [d.config(i) for i in range(9)] == sweep and not SPACE.violations(d.config(9))
