"""Coordinate search around the incumbent: the next one-knob move worth a trial.

After the design, the default sampler's local steps ask this first (tuner.search.design). The incumbent is the
best feasible trial, or while none is (WHILE_INFEASIBLE) the least violating one (the violation is comparable
across causes, tuner.study.objectives): the same search then walks down the violation. Each knob's state there
is read from the trials that differ from the incumbent in that knob alone (the knobs a change switches on or off
aside): the moves tried from here, and whether each made it better, worse or changed nothing. The pending moves
come in tiers; the first tier that has one is ranked by the surrogate (tuner.search.surrogate.acquisition) and
its best move is proposed:

0. momentum: the incumbent came from the incumbent before it by moving one numeric knob: on in that direction,
   twice the step (up to MAX_EXPANSION);
1.-2. screening: a move of each knob that no two trials have isolated yet (a numeric one x2 or x1/2 on a log
   range, +-1/4 of the range on a linear one, and the other way too once one way made a difference; a
   categorical one another choice), so that the surrogate knows something of every knob before it ranks; the
   numeric knobs (local moves) come first (tier 1, NUMERIC_FIRST), the categorical ones (jumps) after (tier 2).
   While nothing is feasible, a numeric knob's screening move is x4 or x1/4 on a log range
   (FIRST_STEP_LOG_INFEASIBLE), and each direction no two trials have isolated yet is screened from every new
   incumbent (OPEN_SIDES): a latency quantile is often flat or uneven over a factor of two, so one side that
   changed nothing says nothing of the other;
3. the rest of the poll: the other side of a numeric knob, half the step towards a side that was worse (down to
   STEP_RESOLUTION), the other choices of a categorical knob;
4. twice the step past a side that changed nothing (up to MAX_EXPANSION).
A knob whose every move changed nothing (the same result within SAME_REL: on a noisy target, hardly ever) is
left alone. Before these tiers, once a trial is feasible, comes the repair (REPAIR): a trial that scored well
above the best feasible one but missed the SLOs a little (the best layout of the sweep, say, while the feasible
incumbent is a design point far from it) gets its numeric screening moves as while nothing is feasible, ranked by
the predicted violation, so the search climbs from where the objective is high rather than from the first trial
that happened to meet the SLOs.

None when no move is pending (the incumbent is a coordinate-wise optimum at the finest step): the caller ranks
broader candidates. Chosen on experiments/search-suite (its README, steps 4 and 5).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tuner.search.points import with_defaults
from tuner.search.surrogate import MIN_TRIALS, Observed, acquisition, order_key

if TYPE_CHECKING:
    from tuner.search.space import Param, SearchSpace

# a screening move's step: x2 on a log-scaled range, a quarter of a linear one (in the units of _position)
FIRST_STEP_LOG = math.log(2.0)
FIRST_STEP_LINEAR = 0.25
# while nothing is feasible (WHILE_INFEASIBLE), a screening move on a log range is this large (x4): a quantile SLO
# is often flat or uneven over a factor of two (on the suite, a token budget halved changed the p99 inter-token
# latency not at all, or for the worse, where a quarter of it met the SLO), so the first look takes a larger step
FIRST_STEP_LOG_INFEASIBLE = math.log(4.0)
# while nothing is feasible, a numeric knob's direction that no two trials have isolated is part of the screening
OPEN_SIDES = True
# the finest step a worse side is bisected to (x1.3 on a log range, a tenth of a linear one)
STEP_RESOLUTION_LOG = math.log(1.3)
STEP_RESOLUTION_LINEAR = 0.1
# the farthest a side that changed nothing is expanded to (x8 on a log range, the whole of a linear one)
MAX_EXPANSION_LOG = math.log(8.0)
MAX_EXPANSION_LINEAR = 1.0
# results this close (relative) are the same: the move changed nothing
SAME_REL = 1e-9
# the tiers of the poll (module docstring); tiers up to SCREEN are the screening
MOMENTUM, SCREEN_FIRST, SCREEN, POLL, EXPAND = 0, 1, 2, 3, 4
# numeric knobs are screened before the categorical ones also once a trial is feasible
NUMERIC_FIRST = True
# the coordinate search proposes while nothing is feasible too, from the least violating trial (False: only once a
# trial is feasible, the surrogate's violation ranking of broader candidates before: on the suite, fewer seeds
# feasible by trial 20; with x2 steps and no open sides, a descent found feasibility still less often)
WHILE_INFEASIBLE = True
# once a trial is feasible, a trial that scored at least REPAIR_GAIN (relative) better than the best feasible one
# but missed the SLOs by at most REPAIR_MAX_VIOLATION (in total, relative excess) is repaired first: its numeric
# screening moves as while nothing is feasible, ranked by the surrogate fitted to every trial
REPAIR = True
REPAIR_GAIN = 0.05
REPAIR_MAX_VIOLATION = 1.0
# the repair's moves are ranked by the optimistic predicted violation alone (False: as the search's other moves)
REPAIR_BY_VIOLATION = True


@dataclass(frozen=True)
class Move:
    """A pending one-knob move of the incumbent: the configuration it gives, the knob and the tier."""

    config: dict[str, Any]
    knob: str
    tier: int


def knob_moved(space: SearchSpace, a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    """The one knob that differs between `a` and `b` where both have it (those it switches on or off aside),
    or None when that is not exactly one."""
    both = [p.name for p in space.params if p.name in a and p.name in b and a[p.name] != b[p.name]]
    return both[0] if len(both) == 1 else None


def _close(x: float | None, y: float | None) -> bool:
    if x is None or y is None:
        return x is None and y is None
    return abs(x - y) <= SAME_REL * max(abs(x), abs(y), 1e-300)


def outcome(o: Observed, inc: Observed) -> int:
    """1: `o` is better than the incumbent, 0: the same, -1: worse (feasible by score, else by violation)."""
    if inc.violation <= 0 and inc.score is not None:
        if o.violation > 0 or o.score is None:
            return -1
        if _close(o.score, inc.score):
            return 0
        return 1 if o.score > inc.score else -1
    if _close(o.violation, inc.violation) and _close(o.score, inc.score):
        return 0
    return 1 if o.violation < inc.violation else -1


def _position(p: Param, v: Any) -> float:
    """A numeric value on the scale the steps are measured in: its log on a log range, else its share of the
    range."""
    s = p.spec
    assert s.low is not None and s.high is not None
    if s.log:
        return math.log(float(v))
    return float(v) / (float(s.high) - float(s.low))


def _value(p: Param, pos: float) -> Any:
    """The value at `pos` (the inverse of _position), clipped to the range, on its step."""
    s = p.spec
    assert s.low is not None and s.high is not None
    lo, hi = float(s.low), float(s.high)
    v = math.exp(pos) if s.log else pos * (hi - lo)
    v = min(max(v, lo), hi)
    if s.type == "int":
        step = int(s.step or 1)
        return int(lo) + min(int(round((v - lo) / step)), int((hi - lo) // step)) * step
    if s.step:
        return lo + min(round((v - lo) / s.step), int((hi - lo) // s.step)) * s.step
    return v


def _steps(p: Param, feasible: bool = True) -> tuple[float, float, float]:
    if p.spec.log:
        return FIRST_STEP_LOG if feasible else FIRST_STEP_LOG_INFEASIBLE, STEP_RESOLUTION_LOG, MAX_EXPANSION_LOG
    return FIRST_STEP_LINEAR, STEP_RESOLUTION_LINEAR, MAX_EXPANSION_LINEAR


def _numeric_moves(p: Param, x: Any, tried: Sequence[tuple[Any, int]], screening_tier: int,
                   both_ways_tier: int, feasible: bool = True,
                   open_sides: frozenset[int] = frozenset()) -> list[tuple[Any, int]]:
    """(value, tier) of the pending moves of numeric knob `p` at incumbent value `x`, given the values tried
    from there and their outcomes: the screening moves at `screening_tier`, the other side of a side that was
    worse at `both_ways_tier`, as is a side in `open_sides` (1: up, -1: down) not tried from here; `feasible`:
    whether the incumbent is (else the screening step is larger)."""
    first, resolution, expansion = _steps(p, feasible)
    px = _position(p, x)
    lo, hi = float(p.spec.low or 0), float(p.spec.high or 0)
    sides: dict[int, list[tuple[float, int]]] = {1: [], -1: []}
    for v, out in tried:
        d = _position(p, v) - px
        if d:
            sides[1 if d > 0 else -1].append((abs(d), out))
    possible = [s for s in (1, -1) if (float(x) < hi if s > 0 else float(x) > lo)]
    if not any(sides[s] for s in possible) and not open_sides:  # never moved from here: the screening move
        return [(_value(p, px + s * first), screening_tier) for s in possible]
    if all(sides[s] and all(out == 0 for _, out in sides[s]) for s in possible):
        return []  # every move changed nothing: the knob does not matter here
    out_moves = []
    for s in possible:
        found = sorted(sides[s])
        if not found:  # the other way of a side that made a difference is part of screening the knob
            other = sorted(sides[-s])
            if s in open_sides:
                tier = both_ways_tier
            elif not other:
                tier = screening_tier
            else:
                tier = both_ways_tier if other[0][1] != 0 else POLL
            out_moves.append((_value(p, px + s * first), tier))
            continue
        same = 0.0  # the farthest distance of the leading run of moves that changed nothing
        worse = None
        for d, out in found:
            if out != 0:
                worse = d
                break
            same = d
        if worse is None:
            if same < expansion:
                out_moves.append((_value(p, px + s * min(2 * same, expansion)), EXPAND))
        elif (worse - same) / 2 >= resolution - 1e-12:
            out_moves.append((_value(p, px + s * (same + worse) / 2), POLL))
    return out_moves


def _incumbent(observed: Sequence[Observed]) -> int:
    """The index of the best (surrogate.order_key), the earliest of those with the same result: a move that
    changed nothing does not move the incumbent."""
    best = observed[min(range(len(observed)), key=lambda i: (order_key(observed[i]), i))]
    return next(i for i, o in enumerate(observed) if o is best or outcome(o, best) == 0)


def pending(space: SearchSpace, observed: Sequence[Observed]) -> list[Move]:
    """Every pending move of the incumbent, with its tier (module docstring); the incumbent is observed's best
    (surrogate.order_key), the earliest of those with the same result."""
    if not observed:
        return []
    k_inc = _incumbent(observed)
    inc = observed[k_inc]
    base = inc.config
    feasible = inc.violation <= 0 and inc.score is not None
    isolated: set[str] = set()
    isolated_sides: dict[str, set[int]] = {}  # numeric knob -> the directions (later trial less earlier) isolated
    for i in range(len(observed)):
        for j in range(i):
            k = knob_moved(space, observed[i].config, observed[j].config)
            if k is None:
                continue
            isolated.add(k)
            p = space.by_name[k]
            if p.spec.type in ("int", "float"):
                d = _position(p, observed[i].config[k]) - _position(p, observed[j].config[k])
                isolated_sides.setdefault(k, set()).add(1 if d > 0 else -1)
    tried: dict[str, list[tuple[Any, int]]] = {}
    for i, o in enumerate(observed):
        if i == k_inc:
            continue
        k = knob_moved(space, base, o.config)
        if k is not None:
            tried.setdefault(k, []).append((o.config[k], outcome(o, inc)))
    parent: tuple[str, Any] | None = None  # the knob and value of the incumbent before, one knob away
    if k_inc > 0:
        prev = observed[_incumbent(observed[:k_inc])].config
        k = knob_moved(space, base, prev)
        if k is not None:
            parent = (k, prev[k])
    moves: list[Move] = []

    def add(name: str, value: Any, tier: int) -> None:
        if value != base[name]:
            moves.append(Move(with_defaults(space, {**base, name: value}), name, tier))

    if parent is not None and space.by_name[parent[0]].spec.type in ("int", "float"):
        p = space.by_name[parent[0]]
        if float(parent[1]) > 0 or not p.spec.log:
            px = _position(p, base[p.name])
            step = px - _position(p, parent[1])
            ahead = [v for v, _ in tried.get(p.name, []) if (_position(p, v) - px) * step > 0]
            if not ahead:  # twice the step that helped, as a pattern search expands after a success
                add(p.name, _value(p, px + math.copysign(min(2 * abs(step), _steps(p)[2]), step)), MOMENTUM)
    for p in space.params:
        if p.name not in base:
            continue
        s = p.spec
        if s.type in ("int", "float"):
            unscreened = SCREEN_FIRST if NUMERIC_FIRST or not feasible else SCREEN
            tier = unscreened if p.name not in isolated else POLL
            # while nothing is feasible, a direction no two trials have isolated is screened from every incumbent
            open_sides = frozenset() if feasible or not OPEN_SIDES else \
                frozenset({1, -1} - isolated_sides.get(p.name, set()))
            for value, t in _numeric_moves(p, base[p.name], tried.get(p.name, []), tier, unscreened, feasible,
                                           open_sides):
                add(p.name, value, t)
        else:
            done = {v for v, _ in tried.get(p.name, [])}
            tier = SCREEN if p.name not in isolated else POLL
            for c in ([False, True] if s.type == "bool" else list(s.choices or [])):
                if c not in done:
                    add(p.name, c, tier)
    return moves


def step(space: SearchSpace, observed: Sequence[Observed], rng: random.Random, *,
         seen: Sequence[Mapping[str, Any]], seed: int = 0, max_tier: int = EXPAND,
         while_infeasible: bool | None = None) -> Move | None:
    """The move to try next: of the first tier with an unseen, constraint-honouring move, the one the surrogate
    scores best; None with too few trials, none feasible (unless `while_infeasible`, default
    WHILE_INFEASIBLE) or no move pending up to
    `max_tier`."""
    if len(observed) < MIN_TRIALS:
        return None
    descend = WHILE_INFEASIBLE if while_infeasible is None else while_infeasible
    if not descend and not any(o.violation <= 0 and o.score is not None for o in observed):
        return None
    seen_keys = {repr(sorted(c.items())) for c in seen}
    view = _repair_view(observed) if REPAIR else None
    if view:
        fixes = _fresh(space, [m for m in pending(space, view) if m.tier <= SCREEN_FIRST], seen_keys)
        if fixes:  # ranked as while nothing is feasible: by the optimistic predicted violation
            return _best(space, observed, fixes, rng, seed, violation_only=REPAIR_BY_VIOLATION)
    by_tier: dict[int, list[Move]] = {}
    for m in _fresh(space, pending(space, observed), seen_keys):
        by_tier.setdefault(m.tier, []).append(m)
    if not by_tier or min(by_tier) > max_tier:
        return None
    return _best(space, observed, by_tier[min(by_tier)], rng, seed)


def _fresh(space: SearchSpace, moves: Sequence[Move], seen_keys: set[str]) -> list[Move]:
    """The moves to a configuration no trial had, honouring the constraints, each configuration once."""
    out = []
    keys: set[str] = set()
    for m in moves:
        k = repr(sorted(m.config.items()))
        if k in seen_keys or k in keys or space.violations(m.config):
            continue
        keys.add(k)
        out.append(m)
    return out


def _best(space: SearchSpace, observed: Sequence[Observed], moves: list[Move], rng: random.Random,
          seed: int, *, violation_only: bool = False) -> Move:
    """The move the surrogate scores best (ties broken at random)."""
    if len(moves) == 1:
        return moves[0]
    rng.shuffle(moves)
    scores = acquisition(space, observed, [m.config for m in moves], rng, seed=seed, violation_only=violation_only)
    return moves[int(np.argmax(scores))]


def _repair_view(observed: Sequence[Observed]) -> list[Observed] | None:
    """The trials that scored at least REPAIR_GAIN better than the best feasible one and missed the SLOs by at most
    REPAIR_MAX_VIOLATION (None: none, or nothing feasible yet)."""
    feasible = [o.score for o in observed if o.violation <= 0 and o.score is not None]
    if not feasible:
        return None
    bar = max(feasible) + REPAIR_GAIN * abs(max(feasible))
    view = [o for o in observed if o.score is not None and 0 < o.violation <= REPAIR_MAX_VIOLATION
            and o.score >= bar]
    return view or None
