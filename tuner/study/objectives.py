"""Measurement + objectives + SLOs -> objective values and constraint violations (<= 0 is feasible)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tuner import catalog
from tuner.measure.early_stop import EarlyStopRule
from tuner.measure.measurement import Measurement
from tuner.spec import SLO, AgentSpec, Objective

# One scale of violation for every cause, so that while nothing is feasible the sampler (Optuna ranks infeasible
# trials by the sum of their positive constraint values) prefers the nearest miss: a measured SLO miss counts its
# relative excess, capped at MEASURED_CAP; a metric missing or undefined (NaN) counts MISSING_VIOLATION; a
# configuration that produced no measurement (refused, out of memory, never deployed because it breaks a
# declared constraint or the target's resources) counts MISSING_VIOLATION for every SLO plus its cause's rank
# (FAILURE_RANK), so it ranks below every measured miss whatever its cause. A trial pruned for its partial
# measurement (pruned_evaluation) counts the relative excess of the SLOs the partial run judged, as a measured miss.
MISSING_VIOLATION = 1e6
MEASURED_CAP = 1e4
# Constraint key recorded on trials that never produced a measurement.
FAILURE_CONSTRAINT = "deployed_and_measured"
# the failure constraint's value by cause: a configuration that started but ran out of memory is nearer to a
# feasible one than one the engine refuses, which is nearer than one that was never deployed
FAILURE_RANK: dict[str, float] = {"out_of_memory": 1.0, "constraint": 3.0, "resources": 3.0,
                                  "infeasible_config": 3.0}
FAILURE_RANK_DEFAULT = 2.0


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
        v = (value - slo.max) / abs(slo.max) if slo.max else value
    else:
        assert slo.min is not None
        v = (slo.min - value) / abs(slo.min) if slo.min else -value
    return min(v, MEASURED_CAP)


def total_violation(constraints: dict[str, float]) -> float:
    """The sum of the positive constraint values: how Optuna's samplers rank infeasible trials (0: feasible)."""
    return sum(v for v in constraints.values() if v > 0)


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


def early_stop_rule(spec: AgentSpec) -> EarlyStopRule | None:
    """The rule that prunes a running trial of `spec` (its `pruning:` section over its upper-bound latency SLOs),
    or None when pruning is off or no SLO can be judged on a partial run (tuner.measure.early_stop)."""
    p = spec.pruning
    limits = {s.metric: float(s.max) for s in spec.slos if s.max is not None and catalog.is_latency(s.metric)}
    if not p.enabled or not limits:
        return None
    return EarlyStopRule(limits=limits, factor=p.factor, min_requests=p.min_requests, check_every=p.check_every)


def pruned_evaluation(m: Measurement, spec: AgentSpec) -> Evaluation:
    """What a pruned trial scores: its partial measurement's values, and the violations of the SLOs a partial
    run can judge (the upper-bound latency ones: each at least factor - 1, so the trial is infeasible, ranked
    with the measured misses by the same relative excess); an SLO a partial run cannot judge counts 0."""
    ev = evaluate(m, spec.objectives, spec.slos)
    rule = early_stop_rule(spec)
    judged = set(rule.limits) if rule is not None else set()
    cons = {k: (v if k.split(":", 1)[1] in judged else 0.0) for k, v in ev.constraints.items()
            if k.startswith("slo:")}
    cons[FAILURE_CONSTRAINT] = 0.0
    return Evaluation(values=ev.values, constraints=cons)


def pessimistic(obj: Objective) -> float:
    """The value recorded for a trial that produced no measurement (infeasible anyway)."""
    return 0.0 if obj.direction == "maximize" else 1e9


def failed_evaluation(spec: AgentSpec, cause: str | None = None) -> Evaluation:
    """What a trial that produced no measurement scores: pessimistic values, every SLO missing, and the failure
    constraint at its cause's rank (FAILURE_RANK)."""
    cons = {f"slo:{slo.metric}": MISSING_VIOLATION for slo in spec.slos}
    cons[FAILURE_CONSTRAINT] = FAILURE_RANK.get(cause or "", FAILURE_RANK_DEFAULT)
    return Evaluation(values=[pessimistic(o) for o in spec.objectives], constraints=cons)


def improvement(candidate: float, reference: float, direction: str) -> float:
    """Relative improvement of `candidate` over `reference` (positive is better)."""
    if reference == 0:
        return math.inf if (candidate > 0) == (direction == "maximize") and candidate != 0 else 0.0
    r = (candidate - reference) / abs(reference)
    return r if direction == "maximize" else -r
