"""Local steps of the default sampler (issue 26): a neighbour moves one or two knobs of a configuration, within
their ranges; the incumbent is the best feasible trial, or the nearest to feasible while none is."""

import random

import optuna
from optuna.distributions import FloatDistribution
from optuna.trial import create_trial

from tuner.search.design import incumbent, neighbour
from tuner.search.space import parse_space

SPACE = parse_space({"params": {
    "mode": {"type": "categorical", "choices": ["a", "b", "c"], "default": "a"},
    "seqs": {"type": "int", "low": 8, "high": 1024, "log": True, "default": 256},
    "util": {"type": "float", "low": 0.7, "high": 0.95, "default": 0.9}}}, file="<test>")


def test_a_neighbour_changes_one_or_two_knobs_within_their_ranges() -> None:
    rng = random.Random(0)
    base = SPACE.defaults()
    changed = []
    for _ in range(200):
        nb = neighbour(SPACE, base, rng)
        diff = [k for k in base if nb[k] != base[k]]
        assert 0 < len(diff) <= 2 or (len(diff) == 0 and nb == base)  # a clipped move may change nothing
        assert 8 <= nb["seqs"] <= 1024 and 0.7 <= nb["util"] <= 0.95 and nb["mode"] in "abc"
        changed += diff
    assert set(changed) == {"mode", "seqs", "util"}
    assert min(neighbour(SPACE, base, random.Random(i))["seqs"] for i in range(100)) <= 64  # log steps reach far


def test_the_incumbent_is_the_best_feasible_else_the_nearest_miss() -> None:
    study = optuna.create_study(direction="maximize")
    dist = {"x": FloatDistribution(0, 1)}

    def add(value: float, violation: float, x: float) -> None:
        t = create_trial(value=value, params={"x": x}, distributions=dist, user_attrs={"config": {"x": x}},
                         system_attrs={"constraints": [violation]})
        study.add_trial(t)

    add(5.0, 3.0, 0.1)  # a far miss
    add(1.0, 0.4, 0.2)  # the nearest miss
    add(0.0, 1e6, 0.3)  # failed
    inc = incumbent(study)
    assert inc is not None and inc.params["x"] == 0.2
    add(2.0, 0.0, 0.4)
    add(3.0, -0.1, 0.5)
    inc = incumbent(study)
    assert inc is not None and inc.params["x"] == 0.5


def test_a_pruned_trial_counts_as_a_miss_never_as_the_best() -> None:
    from optuna.trial import TrialState

    study = optuna.create_study(direction="maximize")
    dist = {"x": FloatDistribution(0, 1)}

    def add(value: float, violation: float, x: float, state: TrialState = TrialState.COMPLETE) -> None:
        study.add_trial(create_trial(value=value, params={"x": x}, distributions=dist, state=state,
                                     user_attrs={"config": {"x": x}}, system_attrs={"constraints": [violation]}))

    add(1.0, 5.0, 0.1)
    add(9.0, 2.0, 0.2, TrialState.PRUNED)  # stopped early: its partial measurement misses by less
    inc = incumbent(study)
    assert inc is not None and inc.params["x"] == 0.2
    add(0.5, 0.0, 0.3)
    inc = incumbent(study)
    assert inc is not None and inc.params["x"] == 0.3  # feasible beats any miss, a pruned one too
