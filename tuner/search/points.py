"""Points of a search space as configurations: a unit coordinate to a value, a point to a configuration, the
baseline with some values applied, and the factors of a local step. Used by the initial design
(tuner.search.design) and the surrogate's candidates (tuner.search.surrogate), which import this, not each
other."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tuner.search.space import Param, SearchSpace

LOCAL_FACTORS = (0.8, 0.9, 1.1, 1.25)  # a local step's factors on a linear range


def unit_to_value(param: Param, u: float) -> Any:
    """The value of `param` at unit coordinate u in [0, 1): a choice, or a point of its (log) range."""
    s = param.spec
    if s.type == "bool":
        return bool(u >= 0.5)
    if s.type == "categorical":
        assert s.choices is not None
        return s.choices[min(int(u * len(s.choices)), len(s.choices) - 1)]
    assert s.low is not None and s.high is not None
    if s.log:
        v = math.exp(math.log(s.low) + u * (math.log(s.high) - math.log(s.low)))
    else:
        v = s.low + u * (s.high - s.low)
    if s.type == "int":
        step = int(s.step or 1)
        n = int((int(s.high) - int(s.low)) // step)
        return int(s.low) + min(int(round((v - s.low) / step)), n) * step
    if s.step:
        n = int(round((s.high - s.low) / s.step))
        return float(s.low + min(int(round((v - s.low) / s.step)), n) * s.step)
    return float(min(max(v, s.low), s.high))


def point_to_config(space: SearchSpace, point: Sequence[float], *, around_defaults: bool = False) -> dict[str, Any]:
    """The active parameters of `point` (one coordinate per parameter, in the space's order).

    around_defaults: the point has two coordinates per parameter; the second keeps the parameter at its
    default when below 1/2, so a configuration differs from the baseline in about half of its knobs.
    """
    out: dict[str, Any] = {}
    n = len(space.params)
    for i, p in enumerate(space.params):
        if space.active(p, out):
            keep = around_defaults and float(point[n + i]) < 0.5
            out[p.name] = p.default if keep else unit_to_value(p, float(point[i]))
    return out


def with_defaults(space: SearchSpace, values: dict[str, Any]) -> dict[str, Any]:
    """The baseline with `values` applied, conditions re-applied in order."""
    out: dict[str, Any] = {}
    for p in space.params:
        if space.active(p, out):
            out[p.name] = values.get(p.name, p.default)
    return out
