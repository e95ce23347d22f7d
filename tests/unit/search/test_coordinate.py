"""The coordinate search of the default sampler (issue 26): from the incumbent it screens every knob no two
trials have isolated before it repeats a knob, follows a move that helped, bisects towards a side that was worse,
leaves alone a knob that changed nothing, and while nothing is feasible walks down the violation along the
numeric knobs first, with larger screening steps, both ways of each knob from every incumbent."""

import math
import random

import optuna

from tuner.search.coordinate import EXPAND, MOMENTUM, POLL, SCREEN, SCREEN_FIRST, knob_moved, pending, step
from tuner.search.design import DesignThenSampler
from tuner.search.space import parse_space
from tuner.search.surrogate import Observed

SPACE = parse_space({"params": {
    "mode": {"type": "categorical", "choices": ["a", "b", "c"], "default": "a"},
    "seqs": {"type": "int", "low": 8, "high": 1024, "log": True, "default": 256},
    "tokens": {"type": "int", "low": 256, "high": 32768, "log": True, "default": 2048},
    "util": {"type": "float", "low": 0.7, "high": 0.95, "default": 0.9},
    "eager": {"type": "bool", "default": False},
    "graphs": {"type": "int", "low": 8, "high": 512, "log": True, "default": 64, "when": "not eager"}},
    "constraints": ["tokens >= seqs"]}, file="<test>")
BASE = SPACE.defaults()


def cfg(**values: object) -> dict:
    return {p.name: values.get(p.name, BASE.get(p.name)) for p in SPACE.params
            if p.name in values or p.name in BASE}


def moved(c: dict) -> set[str]:
    return {k for k in c if k in BASE and c[k] != BASE[k]}


def run(value, violation, n: int, seed: int = 0, *, while_infeasible: bool | None = None) -> list[dict]:
    """`n` coordinate steps after a design (the baseline, each other mode, a three-knob move), told `value` and
    `violation`."""
    design = (BASE, cfg(mode="b"), cfg(mode="c"), cfg(mode="c", util=0.8, seqs=128))
    obs = [Observed(c, value(c), violation(c)) for c in design]
    rng = random.Random(seed)
    for _ in range(n):
        m = step(SPACE, obs, rng, seen=[o.config for o in obs], seed=seed, while_infeasible=while_infeasible)
        assert m is not None and not SPACE.violations(m.config)
        assert m.config not in [o.config for o in obs]
        obs.append(Observed(m.config, value(m.config), violation(m.config)))
    return [o.config for o in obs[4:]]


def test_a_move_of_one_knob_is_told_apart_from_its_conditional_knobs() -> None:
    assert knob_moved(SPACE, BASE, cfg(seqs=128)) == "seqs"
    eager = {k: v for k, v in cfg(eager=True).items() if k != "graphs"}
    assert knob_moved(SPACE, BASE, eager) == "eager"  # graphs switched off with it: still a move of eager alone
    assert knob_moved(SPACE, BASE, cfg(seqs=128, tokens=4096)) is None
    assert knob_moved(SPACE, BASE, BASE) is None


def test_each_knob_is_screened_once_before_any_is_moved_again() -> None:
    # a flat landscape: every move changes nothing, so each knob is moved once, then left alone
    steps = run(lambda c: 100.0, lambda c: 0.0, 5)
    assert all(len(moved(c)) == 1 for c in steps)  # one knob each (graphs switched off with eager aside)
    # mode was isolated by the design: the five un-varied knobs come first, each once
    assert sorted(next(iter(moved(c))) for c in steps) == ["eager", "graphs", "seqs", "tokens", "util"]


def test_numeric_knobs_are_screened_both_ways_before_the_categorical_ones() -> None:
    # the baseline is the optimum: every move is worse, so the incumbent never changes
    def value(c: dict) -> float:
        return 100.0 - sum(c[k] != BASE[k] for k in ("mode", "seqs", "tokens", "util", "eager")) \
            - abs(math.log(c.get("graphs", 64) / 64))

    steps = run(value, lambda c: 0.0, 9)
    knobs = [next(iter(moved(c))) for c in steps]
    assert sorted(knobs[:8]) == ["graphs", "graphs", "seqs", "seqs", "tokens", "tokens", "util", "util"]
    assert knobs[8] == "eager"


def test_screening_moves_are_large_and_honour_the_ranges() -> None:
    tiers = {(m.knob, m.config[m.knob]): m.tier for m in pending(SPACE, [Observed(BASE, 1.0, 0.0)])}
    moves = {k for k, tier in tiers.items() if tier in (SCREEN_FIRST, SCREEN)}
    assert {("seqs", 128), ("seqs", 512), ("tokens", 1024), ("tokens", 4096), ("graphs", 32), ("graphs", 128),
            ("eager", True), ("mode", "b"), ("mode", "c")} <= moves
    utils = sorted(v for k, v in moves if k == "util")
    assert utils[0] < 0.9 and utils[-1] == 0.95  # a quarter of the range each way, clipped at the top
    # the numeric knobs' moves (local ones) come before the categorical ones (jumps)
    assert tiers[("seqs", 128)] == tiers[("util", 0.95)] == SCREEN_FIRST and tiers[("mode", "b")] == SCREEN


def test_a_move_that_helped_is_repeated() -> None:
    obs = [Observed(BASE, 1.0, 0.0), Observed(cfg(mode="b"), 0.5, 0.0), Observed(cfg(mode="c"), 0.4, 0.0),
           Observed(cfg(seqs=128), 2.0, 0.0)]
    m = step(SPACE, obs, random.Random(0), seen=[o.config for o in obs])
    assert m is not None and m.tier == MOMENTUM and m.config == cfg(seqs=32)  # on, twice the step


def test_a_side_that_was_worse_is_bisected_and_a_flat_knob_left_alone() -> None:
    inc = Observed(BASE, 10.0, 0.0)
    obs = [inc, Observed(cfg(tokens=4096), 9.0, 0.0), Observed(cfg(tokens=1024), 8.0, 0.0),
           Observed(cfg(seqs=512), 10.0, 0.0), Observed(cfg(seqs=128), 10.0, 0.0)]
    moves = pending(SPACE, obs)
    tokens = sorted(m.config["tokens"] for m in moves if m.knob == "tokens")
    assert tokens == [round(2048 / math.sqrt(2)), round(2048 * math.sqrt(2))]
    assert all(m.tier == POLL for m in moves if m.knob == "tokens")
    assert not [m for m in moves if m.knob == "seqs"]  # both ways changed nothing: it does not matter here
    # after the bisection too was worse, the knob is done at this step size
    obs += [Observed(cfg(tokens=2896), 9.5, 0.0), Observed(cfg(tokens=1448), 9.5, 0.0)]
    assert not [m for m in pending(SPACE, obs) if m.knob == "tokens"]


def test_a_side_that_changed_nothing_is_expanded() -> None:
    obs = [Observed(BASE, 10.0, 0.0), Observed(cfg(tokens=4096), 10.0, 0.0), Observed(cfg(tokens=1024), 9.0, 0.0)]
    tokens = {m.config["tokens"]: m.tier for m in pending(SPACE, obs) if m.knob == "tokens"}
    assert tokens.get(8192) == EXPAND  # twice as far past x2, which changed nothing
    assert tokens.get(1448) == POLL  # halfway towards x1/2, which was worse


def test_a_knob_that_made_a_difference_is_screened_both_ways() -> None:
    obs = [Observed(BASE, 10.0, 0.0), Observed(cfg(tokens=1024), 9.0, 0.0), Observed(cfg(seqs=128), 10.0, 0.0)]
    tiers = {(m.knob, m.config[m.knob]): m.tier for m in pending(SPACE, obs)}
    assert tiers[("tokens", 4096)] == SCREEN_FIRST  # x1/2 was worse: x2 is still screening
    assert tiers[("seqs", 512)] == POLL  # x1/2 changed nothing: the other way waits


def test_while_nothing_is_feasible_it_walks_down_the_violation_along_numeric_knobs() -> None:
    # an SLO met only with seqs <= 32: the violation falls with seqs; mode and util do nothing for it
    def violation(c: dict) -> float:
        return max(0.0, math.log2(c["seqs"] / 32))

    first = [m for m in pending(SPACE, [Observed(BASE, 1.0, violation(BASE))]) if m.tier == SCREEN_FIRST]
    assert first and all(SPACE.by_name[m.knob].spec.type in ("int", "float") for m in first)
    steps = run(lambda c: 1.0, violation, 12, while_infeasible=True)
    feasible = [i for i, c in enumerate(steps) if violation(c) <= 0]
    assert feasible and feasible[0] <= 8  # screening finds the seqs direction, momentum follows it down
    assert steps[feasible[0]]["seqs"] <= 32


def test_it_can_be_told_to_wait_for_a_feasible_trial() -> None:
    # then the surrogate's violation ranking of broader candidates proposes before one (the caller's fallback)
    obs = [Observed(c, 1.0, 2.0) for c in (BASE, cfg(mode="b"), cfg(mode="c"), cfg(seqs=128))]
    assert step(SPACE, obs, random.Random(0), seen=[o.config for o in obs], while_infeasible=False) is None
    assert step(SPACE, obs, random.Random(0), seen=[o.config for o in obs]) is not None  # the default descends
    obs.append(Observed(cfg(seqs=64), 1.0, 0.0))
    assert step(SPACE, obs, random.Random(0), seen=[o.config for o in obs], while_infeasible=False) is not None


def test_while_nothing_is_feasible_the_screening_steps_are_x4_and_both_ways() -> None:
    inc = Observed(BASE, 1.0, 0.5)
    tiers = {(m.knob, m.config[m.knob]): m.tier for m in pending(SPACE, [inc])}
    assert tiers[("tokens", 512)] == tiers[("tokens", 8192)] == SCREEN_FIRST  # x1/4 and x4, not x1/2 and x2
    assert tiers[("seqs", 64)] == tiers[("seqs", 1024)] == SCREEN_FIRST
    # x4 changed nothing (a plateau of the p99): x1/4 is still screening, not left to the poll
    obs = [inc, Observed(cfg(tokens=8192), 1.0, 0.5)]
    tiers = {(m.knob, m.config[m.knob]): m.tier for m in pending(SPACE, obs)}
    assert tiers[("tokens", 512)] == SCREEN_FIRST
    # once a trial is feasible, the feasible incumbent's screening is x2 again, a flat side's other way waits
    feasible = [Observed(BASE, 1.0, 0.0), Observed(cfg(tokens=4096), 1.0, 0.0)]
    tiers = {(m.knob, m.config[m.knob]): m.tier for m in pending(SPACE, feasible)}
    assert tiers[("tokens", 1024)] == POLL and ("seqs", 128) in tiers


def test_a_direction_not_yet_isolated_is_screened_from_a_new_incumbent() -> None:
    # tokens x4 changed nothing; then a small gain elsewhere moved the incumbent: from there tokens x1/4 is
    # still screening (no two trials have isolated that direction), x4 is not (its direction was isolated)
    obs = [Observed(BASE, 1.0, 0.5), Observed(cfg(tokens=8192), 1.0, 0.5), Observed(cfg(graphs=16), 1.0, 0.49)]
    tiers = {m.config["tokens"]: m.tier for m in pending(SPACE, obs) if m.knob == "tokens"}
    assert tiers[512] == SCREEN_FIRST and tiers[8192] == POLL


def test_a_plateau_with_the_slo_a_quarter_away_is_crossed_by_screening() -> None:
    """The class of the suite's 70B goodput misses: the violation is flat (or a little worse) from half the token
    budget upwards and met at a quarter of it; the graphs knob gives small gains that move the incumbent."""
    def violation(c: dict) -> float:
        if c["tokens"] <= 700:
            return 0.0
        return 0.05 + (0.01 if 800 <= c["tokens"] <= 1200 else 0.0) - 1e-3 * math.log2(c.get("graphs", 64) / 8)

    for seed in range(10):
        steps = run(lambda c: 1.0, violation, 12, seed)
        assert any(violation(c) <= 0 for c in steps[:10]), seed


def test_a_near_miss_that_scored_better_is_repaired_first() -> None:
    """Once a trial is feasible, a trial that scored much better but missed the SLO a little (on the suite: the
    best layout of the sweep, while the feasible one is a Sobol point far away) is repaired first: its numeric
    knobs screened as while nothing is feasible."""
    near = cfg(mode="b")
    obs = [Observed(BASE, 1.0, 0.3), Observed(near, 2.0, 0.2), Observed(cfg(mode="c"), 0.5, 0.9),
           Observed(cfg(mode="c", seqs=32, tokens=512), 1.0, 0.0)]
    m = step(SPACE, obs, random.Random(0), seen=[o.config for o in obs])
    assert m is not None and m.tier == SCREEN_FIRST and knob_moved(SPACE, near, m.config) is not None
    k = m.knob
    if SPACE.by_name[k].spec.log:  # the while-infeasible step: x4 either way
        assert m.config[k] in (near[k] * 4, near[k] // 4) or m.config[k] == SPACE.by_name[k].spec.high


def test_the_repair_finds_the_move_that_meets_the_slo() -> None:
    # the SLO is met wherever tokens <= 700 (the feasible trials say so); the near miss is at tokens 2048
    def violation(c: dict) -> float:
        return 0.0 if c["tokens"] <= 700 else 0.2

    near = cfg(mode="b")
    trials = [BASE, near, cfg(mode="c"), cfg(tokens=512), cfg(mode="c", tokens=512, util=0.8),
              cfg(tokens=400, seqs=128), cfg(mode="c", seqs=64), cfg(util=0.75)]
    obs = [Observed(c, 2.0 if c is near else 1.0, violation(c)) for c in trials]
    for seed in range(5):
        m = step(SPACE, obs, random.Random(seed), seen=trials, seed=seed)
        assert m is not None and knob_moved(SPACE, near, m.config) == "tokens" and m.config["tokens"] == 512


def test_a_far_miss_or_a_small_gain_is_not_repaired() -> None:
    feasible = cfg(mode="c", seqs=32, tokens=512)
    for score, violation in ((2.0, 1.5), (1.02, 0.2)):
        obs = [Observed(BASE, 0.5, 0.3), Observed(cfg(mode="b"), score, violation), Observed(cfg(mode="c"), 0.5, 0.9),
               Observed(feasible, 1.0, 0.0)]
        m = step(SPACE, obs, random.Random(0), seen=[o.config for o in obs])
        assert m is not None and knob_moved(SPACE, feasible, m.config) is not None  # from the feasible incumbent


def test_the_default_sampler_screens_on_every_trial_after_the_design() -> None:
    """Through Optuna: after the baseline, a 2-trial design and one TPE trial (too few trials for a model), the
    next trials are one-knob moves of the incumbent (the turns TPE would have had included)."""
    sampler = DesignThenSampler(SPACE, optuna.samplers.TPESampler(seed=0, n_startup_trials=0), n_design=2, seed=0,
                                around_defaults=True, local_every=2, guided=True, coordinate=True)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.enqueue_trial(BASE)
    configs = []
    for _ in range(8):
        t = study.ask()
        c = {}
        for p in SPACE.params:
            if not SPACE.active(p, c):
                continue
            s = p.spec
            c[p.name] = (t.suggest_categorical(p.name, s.choices) if s.type == "categorical"
                         else t.suggest_categorical(p.name, [False, True]) if s.type == "bool"
                         else t.suggest_int(p.name, int(s.low), int(s.high), log=s.log) if s.type == "int"
                         else t.suggest_float(p.name, s.low, s.high))
        t.set_user_attr("config", c)
        study.tell(t, 100.0 - sum(c.get(k) != BASE.get(k) for k in BASE))  # the baseline is the best
        configs.append(c)
    knobs = [knob_moved(SPACE, BASE, c) for c in configs[4:]]
    assert all(k is not None for k in knobs)  # four in a row: TPE's turns were screening moves too
    assert all(SPACE.by_name[k].spec.type in ("int", "float") for k in knobs if k)  # numeric knobs first
