"""Where an observed workload falls among the scenarios (pure: tuner.spec only).

A workload is a point of four statistics (SCENARIO_DIMS): concurrency (requests in flight), request rate per
second, mean prompt and mean output length in tokens. Margins are relative and act on each bound: a margin m
moves a lower bound to min * (1 + m) and an upper bound to max / (1 + m) (m > 0: inside, the enter region) or
to min / (1 + m) and max * (1 + m) (the exit region). Distances are in log space, so 10 -> 20 concurrent
requests counts as far as 100 -> 200.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from tuner.spec import SCENARIO_DIMS, Bounds, ScenarioSpec

# the keys an ObservedWorkload's stats (tuner.observe) give for each dimension, first found wins
STAT_KEYS: dict[str, tuple[str, ...]] = {
    "concurrency": ("concurrency", "concurrency_mean"),
    "rate_per_s": ("rate_per_s",),
    "prompt_tokens": ("prompt_tokens_mean", "prompt_tokens"),
    "output_tokens": ("output_tokens_mean", "output_tokens"),
}


def point_of(stats: Mapping[str, float]) -> dict[str, float]:
    """The scenario dimensions of an observation's statistics (a dimension it lacks is left out)."""
    out: dict[str, float] = {}
    for dim, keys in STAT_KEYS.items():
        for k in keys:
            v = stats.get(k)
            if v is not None and math.isfinite(float(v)):
                out[dim] = float(v)
                break
    return out


def _edge(b: Bounds, margin: float) -> tuple[float, float]:
    """Bounds moved by a relative margin (> 0 inward, < 0 outward); an empty inner region shrinks to its middle."""
    f = 1.0 + abs(margin)
    lo = 0.0 if b.min is None else (b.min * f if margin > 0 else b.min / f)
    hi = math.inf if b.max is None else (b.max / f if margin > 0 else b.max * f)
    if lo > hi:  # a narrow scenario: its enter region is its geometric middle
        mid = math.sqrt(max(b.min or 0.0, 1e-12) * (b.max or 0.0))
        return mid, mid
    return lo, hi


def contains(scn: ScenarioSpec, point: Mapping[str, float], margin: float = 0.0) -> bool:
    """Whether the point lies in the scenario's bounds moved by `margin` (> 0: the enter region, < 0: the exit
    region). A dimension the point lacks does not count against it."""
    for dim, b in scn.bounds().items():
        if dim not in point:
            continue
        lo, hi = _edge(b, margin)
        if not (lo <= point[dim] <= hi):
            return False
    return True


def distance(scn: ScenarioSpec, point: Mapping[str, float]) -> float:
    """How far outside the scenario the point lies (0 inside): the largest log-ratio past a bound."""
    worst = 0.0
    for dim, b in scn.bounds().items():
        v = point.get(dim)
        if v is None:
            continue
        v = max(v, 1e-9)
        if b.min is not None and v < b.min:
            worst = max(worst, math.log(max(b.min, 1e-9) / v))
        if b.max is not None and v > b.max:
            worst = max(worst, math.log(v / b.max))
    return worst


def centre(scn: ScenarioSpec) -> dict[str, float]:
    """A representative point of the scenario: the geometric middle of each bounded dimension (an open end:
    twice the lower or half the upper bound)."""
    out: dict[str, float] = {}
    for dim, b in scn.bounds().items():
        if b.min is not None and b.max is not None:
            out[dim] = math.sqrt(max(b.min, 1e-9) * b.max)
        elif b.min is not None:
            out[dim] = max(b.min, 1e-9) * 2
        elif b.max is not None:
            out[dim] = b.max / 2
    return out


def classify(scenarios: Sequence[ScenarioSpec], point: Mapping[str, float], margin: float = 0.0) -> str | None:
    """The scenario whose (margin-moved) region holds the point; of several, the one whose centre is nearest
    (log space over the dimensions both have), then the first declared. None: outside every scenario."""
    inside = [s for s in scenarios if contains(s, point, margin)]
    if not inside:
        return None
    return min(inside, key=lambda s: (_log_gap(centre(s), point), scenarios.index(s))).name


def nearest(scenarios: Sequence[ScenarioSpec], to: ScenarioSpec) -> ScenarioSpec | None:
    """The other scenario nearest to `to` (by centres, log space): the one a new scenario is warm-started from."""
    others = [s for s in scenarios if s.name != to.name]
    if not others:
        return None
    c = centre(to)
    return min(others, key=lambda s: (_log_gap(centre(s), c), others.index(s)))


def _log_gap(a: Mapping[str, float], b: Mapping[str, float]) -> float:
    common = [d for d in SCENARIO_DIMS if d in a and d in b]
    if not common:
        return math.inf
    return math.sqrt(sum(math.log(max(a[d], 1e-9) / max(b[d], 1e-9)) ** 2 for d in common))


def traffic_dims(arrival_kind: str) -> tuple[str, ...]:
    """The dimensions the traffic itself sets. In a closed loop (a fixed number of clients, each sending its
    next request when the last one ends) the request rate is the server's answer and moves with the
    configuration in service, so it does not describe the traffic."""
    return tuple(d for d in SCENARIO_DIMS if not (arrival_kind == "closed" and d == "rate_per_s"))


def propose(point: Mapping[str, float], name: str, width: float,
            dims: Sequence[str] = SCENARIO_DIMS) -> ScenarioSpec:
    """A scenario around an observed point: each statistic of `dims` divided and multiplied by `width`."""
    bounds = {d: {"min": round(point[d] / width, 3), "max": round(point[d] * width, 3)}
              for d in SCENARIO_DIMS if d in dims and d in point and point[d] > 0}
    return ScenarioSpec.model_validate({"name": name, "description": "proposed by the daemon from observed traffic",
                                        **bounds})


def relative_change(a: Mapping[str, float], b: Mapping[str, float]) -> float:
    """The largest relative change between two points over the dimensions both have (0 when none)."""
    out = 0.0
    for d in SCENARIO_DIMS:
        if d in a and d in b:
            ref = max(abs(a[d]), 1e-9)
            out = max(out, abs(b[d] - a[d]) / ref)
    return out
