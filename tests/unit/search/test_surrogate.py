"""Model-guided proposals (issue 26, item 4): candidates drawn in bulk are ranked by a surrogate fitted to the
study's own trials; the chosen one is unseen, honours the constraints, and follows what the trials say."""

import math
import random

import optuna

from tuner.search.design import DesignThenSampler
from tuner.search.space import parse_space
from tuner.search.surrogate import MIN_TRIALS, Observed, candidates, rank

SPACE = parse_space({"params": {
    "mode": {"type": "categorical", "choices": ["a", "b", "c"], "default": "a"},
    "seqs": {"type": "int", "low": 8, "high": 1024, "log": True, "default": 256},
    "tokens": {"type": "int", "low": 256, "high": 32768, "log": True, "default": 2048},
    "util": {"type": "float", "low": 0.7, "high": 0.95, "default": 0.9}},
    "constraints": ["tokens >= seqs"]}, file="<test>")


def value(c: dict) -> float:
    """A landscape with its peak at mode b, seqs 64, tokens 8192 (higher is better)."""
    return 100.0 - 10 * abs(math.log2(c["seqs"] / 64)) - 10 * abs(math.log2(c["tokens"] / 8192)) \
        - (0 if c["mode"] == "b" else 30)


def draws(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        c = {"mode": rng.choice("abc"), "seqs": int(2 ** rng.uniform(3, 10)),
             "tokens": int(2 ** rng.uniform(8, 15)), "util": rng.uniform(0.7, 0.95)}
        if not SPACE.violations(c):
            out.append(c)
    return out


def test_candidates_are_unseen_and_honour_the_constraints() -> None:
    start = SPACE.defaults()
    cands = candidates(SPACE, [start], random.Random(0), seen=[start])
    assert len(cands) > 100
    assert start not in cands and all(not SPACE.violations(c) for c in cands)
    # every one-knob move of the incumbent is among them: each other mode, each factor of a numeric knob
    assert {c["mode"] for c in cands if c["seqs"] == 256 and c["tokens"] == 2048 and c["util"] == 0.9} == {"b", "c"}
    assert {c["seqs"] for c in cands if c["mode"] == "a" and c["tokens"] == 2048 and c["util"] == 0.9} >= {32, 512}


def test_too_few_trials_leave_the_choice_to_the_caller() -> None:
    obs = [Observed(c, value(c), 0.0) for c in draws(MIN_TRIALS - 1, 0)]
    assert rank(SPACE, obs, random.Random(0), seen=[o.config for o in obs]) is None


def test_the_ranked_choice_follows_the_trials() -> None:
    obs = [Observed(c, value(c), 0.0) for c in draws(30, 1)]
    median = sorted(value(o.config) for o in obs)[len(obs) // 2]
    picks = [rank(SPACE, obs, random.Random(seed), seen=[o.config for o in obs], seed=seed) for seed in range(8)]
    assert all(p is not None and not SPACE.violations(p) and p not in [o.config for o in obs] for p in picks)
    # the surrogate proposes in the good region (an exploring pick may miss it): most picks beat the median trial
    assert sum(value(p) > median for p in picks if p is not None) >= 6


def test_while_nothing_is_feasible_it_walks_towards_the_slos() -> None:
    # the violation falls with seqs: a pick should have fewer seqs than the trials' median
    obs = [Observed(c, value(c), max(0.05, math.log2(c["seqs"] / 8))) for c in draws(20, 2)]
    picks = [rank(SPACE, obs, random.Random(seed), seen=[o.config for o in obs], seed=seed) for seed in range(5)]
    median = sorted(o.config["seqs"] for o in obs)[len(obs) // 2]
    assert sum(p is not None and p["seqs"] < median for p in picks) >= 4


def test_a_failure_counts_as_no_measurement() -> None:
    # failed trials (no score) sit at the failure tier; the objective model uses the measured ones only
    obs = [Observed(c, None if c["mode"] == "c" else value(c), 1e6 if c["mode"] == "c" else 0.0)
           for c in draws(24, 3)]
    picks = [rank(SPACE, obs, random.Random(seed), seen=[o.config for o in obs], seed=seed) for seed in range(5)]
    assert sum(p is not None and p["mode"] != "c" for p in picks) >= 4


def test_the_default_sampler_asks_guided_local_steps() -> None:
    """Through Optuna: after the design, guided steps are new configurations that break no constraint."""
    sampler = DesignThenSampler(SPACE, optuna.samplers.TPESampler(seed=0, n_startup_trials=0), n_design=4, seed=0,
                                around_defaults=True, local_every=1, guided=True)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    seen = []
    for _ in range(14):
        t = study.ask()
        c = {p.name: (t.suggest_categorical(p.name, p.spec.choices) if p.spec.type == "categorical"
                      else t.suggest_int(p.name, int(p.spec.low), int(p.spec.high), log=p.spec.log)
                      if p.spec.type == "int" else t.suggest_float(p.name, p.spec.low, p.spec.high))
             for p in SPACE.params}
        assert not SPACE.violations(c) and c not in seen
        seen.append(c)
        t.set_user_attr("config", c)
        study.tell(t, value(c))
    assert max(value(c) for c in seen[4:]) >= max(value(c) for c in seen[:4])
