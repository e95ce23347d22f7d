"""Model-guided proposals: rank candidate configurations by a surrogate fitted to the study's own trials.

Before a deployment is spent, `rank` draws candidates in bulk (every one-knob move of the incumbent, random moves
of one to three knobs from the best trials, draws from the whole space), predicts each with two random forests
fitted to the trials that ran (as SMAC does: the spread of the trees is the uncertainty) and returns the most
promising one:

- the objective model: the objective (its log when every value is positive; higher is better) of the trials that
  produced a measurement, feasible or not;
- the violation model: log(1 + total violation) of every trial that ran (a failure sits at the failure tier of
  tuner.study.objectives, far above any measured miss); P(feasible) is the share of trees predicting none.

With a feasible trial, the score is the expected improvement over the best feasible value times P(feasible);
while none is feasible, it is the optimistic predicted violation (mean less one spread), so the search walks
towards the SLOs. Each prediction uses only the study's trials: nothing is tuned to a landscape.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tuner.search.feasibility import encode
from tuner.search.points import LOCAL_FACTORS, point_to_config, with_defaults

if TYPE_CHECKING:
    from tuner.search.space import SearchSpace

# candidates per proposal: local moves from the best trials, and draws from the whole space
LOCAL_CANDIDATES = 384
GLOBAL_CANDIDATES = 256
# how many of the best trials the local moves start from (the incumbent gets half of them)
LOCAL_STARTS = 4
# the factors of the incumbent's one-knob moves on a log-scaled range (a linear one: design.LOCAL_FACTORS)
ONE_KNOB_FACTORS_LOG = (0.125, 0.25, 0.5, 0.71, 1.41, 2.0, 4.0, 8.0)
N_TREES = 24
# trials that ran before the surrogate is trusted (fewer: the caller takes its plain local step)
MIN_TRIALS = 4


@dataclass(frozen=True)
class Observed:
    """One trial that ran: its configuration, its objective (higher is better; None: no measurement) and its total
    violation (0: feasible)."""

    config: dict[str, Any]
    score: float | None
    violation: float


def _forest(x: np.ndarray, y: np.ndarray, seed: int) -> Any:
    from sklearn.ensemble import RandomForestRegressor

    model = RandomForestRegressor(n_estimators=N_TREES, min_samples_leaf=1, max_features=0.8, bootstrap=True,
                                  random_state=seed, n_jobs=1)
    model.fit(x, y)
    return model


def _per_tree(model: Any, x: np.ndarray) -> np.ndarray:
    """Predictions of every tree: shape (trees, candidates)."""
    return np.stack([t.predict(x) for t in model.estimators_])


def _expected_improvement(mu: np.ndarray, sigma: np.ndarray, best: float) -> np.ndarray:
    from scipy.stats import norm

    sigma = np.maximum(sigma, 1e-9)
    z = (mu - best) / sigma
    return np.asarray((mu - best) * norm.cdf(z) + sigma * norm.pdf(z))


def _move(space: SearchSpace, config: Mapping[str, Any], rng: random.Random) -> dict[str, Any]:
    """`config` with one knob moved: another choice, or a numeric one times a factor drawn log-uniformly in
    [1/8, 8] (a log range) or uniformly in [0.75, 1.25] (a linear one), clipped to its range."""
    active = [p for p in space.params if p.name in config]
    out = dict(config)
    if not active:
        return out
    p = rng.choice(active)
    s = p.spec
    if s.type in ("categorical", "bool"):
        others = [c for c in ([False, True] if s.type == "bool" else s.choices or []) if c != out[p.name]]
        if others:
            out[p.name] = rng.choice(others)
    else:
        assert s.low is not None and s.high is not None
        f = math.exp(rng.uniform(-math.log(8), math.log(8))) if s.log else rng.uniform(0.75, 1.25)
        v = min(max(float(out[p.name]) * f, float(s.low)), float(s.high))
        out[p.name] = int(round(v)) if s.type == "int" else v
    return with_defaults(space, out)


def candidates(space: SearchSpace, starts: Sequence[Mapping[str, Any]], rng: random.Random,
               seen: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Unseen constraint-honouring candidates, in random order: every one-knob move of `starts[0]` (the
    incumbent), random moves of one to three knobs from `starts` (the incumbent gets half of them) and draws from
    the whole space (around the defaults half of the time)."""
    seen_keys = {repr(sorted(c.items())) for c in seen}
    out: dict[str, dict[str, Any]] = {}

    def add(cfg: dict[str, Any]) -> None:
        k = repr(sorted(cfg.items()))
        if k not in seen_keys and k not in out and not space.violations(cfg):
            out[k] = cfg

    if starts:  # every one-knob move of the incumbent: each other choice, each factor of a numeric knob
        inc = dict(starts[0])
        for p in space.params:
            if p.name not in inc:
                continue
            s = p.spec
            if s.type in ("categorical", "bool"):
                moves: list[Any] = [c for c in ([False, True] if s.type == "bool" else s.choices or [])
                                    if c != inc[p.name]]
            else:
                assert s.low is not None and s.high is not None
                lo, hi = float(s.low), float(s.high)
                moves = [min(max(float(inc[p.name]) * f, lo), hi)
                         for f in (ONE_KNOB_FACTORS_LOG if s.log else LOCAL_FACTORS)]
                moves = [int(round(v)) if s.type == "int" else v for v in moves]
            for v in moves:
                add(with_defaults(space, {**inc, p.name: v}))
    for i in range(LOCAL_CANDIDATES if starts else 0):
        base = dict(starts[0] if i % 2 == 0 or len(starts) == 1 else starts[1 + (i // 2) % (len(starts) - 1)])
        cfg = _move(space, base, rng)
        for _ in range(rng.choice((0, 0, 1, 2))):  # chained moves: up to three knobs away
            cfg = _move(space, cfg, rng)
        add(cfg)
    n = len(space.params)
    for _ in range(GLOBAL_CANDIDATES):
        add(point_to_config(space, [rng.random() for _ in range(2 * n)], around_defaults=rng.random() < 0.5))
    cands = list(out.values())
    rng.shuffle(cands)  # a tie in the ranking (the trees cannot tell candidates apart) is broken at random
    return cands


def order_key(o: Observed) -> tuple[float, float]:
    """Sort key of the trials, best first: the feasible by score, then the rest by violation."""
    return (0.0, -(o.score or 0.0)) if o.violation <= 0 and o.score is not None else (1.0, o.violation)


def rank(space: SearchSpace, observed: Sequence[Observed], rng: random.Random, *,
         seen: Sequence[Mapping[str, Any]], seed: int = 0) -> dict[str, Any] | None:
    """The candidate the surrogate scores best, or None (too few trials, or no unseen candidate)."""
    if len(observed) < MIN_TRIALS:
        return None
    starts = [o.config for o in sorted(observed, key=order_key)[:LOCAL_STARTS]]
    cands = candidates(space, starts, rng, seen)
    if not cands:
        return None
    return cands[int(np.argmax(acquisition(space, observed, cands, rng, seed=seed)))]


def acquisition(space: SearchSpace, observed: Sequence[Observed], cands: Sequence[Mapping[str, Any]],
                rng: random.Random, *, seed: int = 0, violation_only: bool = False) -> np.ndarray:
    """How promising each candidate is (higher is better), from forests fitted to `observed`: with a feasible
    trial, the expected improvement times P(feasible); while none is (or with `violation_only`), minus the
    optimistic predicted violation (random scores while every trial violates alike)."""
    feasible = [] if violation_only else [o for o in observed if o.violation <= 0 and o.score is not None]
    measured = [o for o in observed if o.score is not None]
    xc = np.array([encode(space, c) for c in cands])
    x_all = np.array([encode(space, o.config) for o in observed])
    v_all = np.log1p(np.array([max(0.0, o.violation) for o in observed]))
    if not feasible:
        if v_all.max() - v_all.min() < 1e-12:
            return np.array([rng.random() for _ in cands])
        pv = _per_tree(_forest(x_all, v_all, seed), xc)
        return np.asarray(-(pv.mean(axis=0) - pv.std(axis=0)))
    p_feasible = np.ones(len(cands))
    if any(o.violation > 0 for o in observed):
        pv = _per_tree(_forest(x_all, v_all, seed), xc)
        p_feasible = (pv <= 1e-9).mean(axis=0)
    scores = np.array([o.score for o in measured], dtype=float)
    positive = all(s > 0 for s in scores) or all(s < 0 for s in scores)
    y = np.sign(scores) * np.log(np.abs(scores)) if positive else scores
    if len(y) >= 6:  # the far-worse trials only say "not there": capped at the median, they do not swamp the
        y = np.maximum(y, float(np.median(y)))  # spread the expected improvement reads near the best
    best = max(y[i] for i, o in enumerate(measured) if o in feasible)
    if len(measured) >= 2 and float(np.ptp(y)) > 0:
        po = _per_tree(_forest(np.array([encode(space, o.config) for o in measured]), y, seed + 1), xc)
        acq = _expected_improvement(po.mean(axis=0), po.std(axis=0), best) * p_feasible
    else:
        acq = p_feasible
    if not np.isfinite(acq).all() or float(acq.max()) <= 0:
        acq = p_feasible + 1e-12 * np.array([rng.random() for _ in cands])
    return np.asarray(acq)


def observed_of(trials: Sequence[Any], direction_sign: float, space: SearchSpace) -> list[Observed]:
    """The trials that ran (finished or pruned with a partial measurement; deployed, not a copy) as surrogate
    data."""
    out = []
    for t in trials:
        u = t.user_attrs
        if not t.values or not isinstance(u.get("config"), dict) or u.get("rejected") or u.get("screened") \
                or u.get("duplicate_of") is not None or u.get("repeat_of") is not None:
            continue
        violation = sum(v for v in (t.constraints.values() if isinstance(t.constraints, Mapping)
                                    else t.constraints) if v > 0)
        value = float(t.values[0])
        score = None if "cause" in u or not math.isfinite(value) else direction_sign * value
        params = {p.name: t.params[p.name] for p in space.params if p.name in t.params}
        out.append(Observed(params, score, violation))
    return out
