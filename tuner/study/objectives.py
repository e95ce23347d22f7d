"""Measurement + objectives + SLOs -> objective values and constraint violations (<= 0 is feasible)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tuner import catalog
from tuner.measure.measurement import Measurement
from tuner.spec import SLO, AgentSpec, Objective

# A value for a constraint whose metric is missing or undefined (NaN): clearly infeasible.
MISSING_VIOLATION = 1e6
# Constraint key recorded on trials that never produced a measurement.
FAILURE_CONSTRAINT = "deployed_and_measured"


@dataclass(frozen=True)
class Evaluation:
    values: list[float]
    constraints: dict[str, float]  # key -> violation (<= 0 feasible)

    @property
    def feasible(self) -> bool:
        return all(v <= 0 for v in self.constraints.values())


def violation(slo: SLO, value: float) -> float:
    """Relative violation: (value - max) / max, or (min - value) / min; <= 0 when the SLO holds."""
    if math.isnan(value):
        return MISSING_VIOLATION
    if slo.max is not None:
        return (value - slo.max) / abs(slo.max) if slo.max else value
    assert slo.min is not None
    return (slo.min - value) / abs(slo.min) if slo.min else -value


def goodput_thresholds_ms(slos: Sequence[SLO]) -> dict[str, float]:
    """Per-request goodput thresholds from the latency SLOs (as `vllm bench serve --goodput`).

    The catalog's goodput key of each metric: ttft_ms.* -> ttft; tpot_ms.* and itl_ms.* -> tpot; e2el_ms.* ->
    e2el. The tightest bound wins.
    """
    out: dict[str, float] = {}
    for slo in slos:
        key = catalog.goodput_key(slo.metric)
        if key is not None and slo.max is not None:
            out[key] = min(out.get(key, math.inf), slo.max)
    return out


def evaluate(m: Measurement, objectives: Sequence[Objective], slos: Sequence[SLO]) -> Evaluation:
    values = []
    for obj in objectives:
        v = m.value(obj.metric)
        if math.isnan(v):
            v = pessimistic(obj)
        values.append(float(v))
    cons = {f"slo:{slo.metric}": violation(slo, m.value(slo.metric)) for slo in slos}
    cons[FAILURE_CONSTRAINT] = 0.0
    return Evaluation(values=values, constraints=cons)


def pessimistic(obj: Objective) -> float:
    """The value recorded for a trial that produced no measurement (infeasible anyway)."""
    return 0.0 if obj.direction == "maximize" else 1e9


def failed_evaluation(spec: AgentSpec) -> Evaluation:
    cons = {f"slo:{slo.metric}": MISSING_VIOLATION for slo in spec.slos}
    cons[FAILURE_CONSTRAINT] = 1.0
    return Evaluation(values=[pessimistic(o) for o in spec.objectives], constraints=cons)


def improvement(candidate: float, reference: float, direction: str) -> float:
    """Relative improvement of `candidate` over `reference` (positive is better)."""
    if reference == 0:
        return math.inf if (candidate > 0) == (direction == "maximize") and candidate != 0 else 0.0
    r = (candidate - reference) / abs(reference)
    return r if direction == "maximize" else -r
