"""Stopping a run early: its partial measurement already breaks an upper-bound latency SLO by far.

While a run goes on, every `check_every` completed measured requests (less often in a long run: `due`) the
rule summarises the measured requests completed so far (tuner.measure.metrics.summarise, the same figures as
the whole run's) and, once at least `min_requests` of them are done, stops the run when a latency SLO's value
exceeds `factor` x its max. Only upper bounds on latencies are judged: over the completed requests a latency
quantile is a lower estimate (the slow requests still in flight are not in it), so a partial value far above
the limit means the whole run's would be too; a throughput or a lower bound on a partial run says nothing of
the whole one.

The load generator (tuner.measure.loadgen) calls `judge` as requests complete and the simulator target replays
its requests in completion order; neither knows studies: the loop turns a stop into a PRUNED trial.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tuner.measure.measurement import Measurement
from tuner.measure.metrics import summarise
from tuner.measure.records import RequestRecord


@dataclass(frozen=True)
class EarlyStop:
    """Why a run was stopped: `metric` was `value` over its first `completed` requests, > factor x `limit`."""

    metric: str
    value: float
    limit: float
    factor: float
    completed: int
    at_s: float = 0.0  # the run's clock (its records' time base) when it was stopped

    def text(self) -> str:
        return (f"{self.metric} {self.value:.4g} > {self.factor:g} x its limit {self.limit:g} over the first "
                f"{self.completed} completed requests")

    def to_attr(self) -> dict[str, Any]:
        return {**asdict(self), "reason": self.text()}


@dataclass(frozen=True)
class EarlyStopRule:
    """`limits`: spec metric name -> max, the upper-bound latency SLOs the rule judges."""

    limits: Mapping[str, float]
    factor: float = 3.0
    min_requests: int = 20
    check_every: int = 5

    def due(self, completed: int) -> bool:
        """Whether the partial measurement is judged after `completed` measured requests: from `min_requests`
        on, every `check_every` of them up to 64 x check_every, then every 2 x check_every up to twice that, and
        so on (each judgement summarises every completed request: a long run is judged 32 times per doubling of
        its completed requests, not n / check_every times)."""
        ratio = completed // (self.check_every * 64)
        step = self.check_every << ratio.bit_length()
        return completed >= self.min_requests and completed % step == 0

    def judge(self, records: Sequence[RequestRecord], at_s: float = 0.0) -> EarlyStop | None:
        """The stop `records` (those completed so far; warm-up ones are left out) call for, or None."""
        measured = [r for r in records if not r.warmup]
        if len(measured) < self.min_requests or not self.limits:
            return None
        m = Measurement(summary=summarise(measured))
        worst: EarlyStop | None = None
        for metric, limit in self.limits.items():
            v = m.value(metric)
            if limit > 0 and math.isfinite(v) and v > self.factor * limit:
                stop = EarlyStop(metric, float(v), float(limit), self.factor, len(measured), at_s)
                if worst is None or v / limit > worst.value / worst.limit:
                    worst = stop
        return worst


def replay(records: Sequence[RequestRecord], rule: EarlyStopRule) -> tuple[list[RequestRecord], EarlyStop | None]:
    """What a run of `records` (all its requests, as a simulator gives them) would have kept had `rule` watched
    it live: the records completed by the moment it stopped the run (requests in flight then are dropped), and
    the stop; `records` as they are and None when it would have run to its end."""
    done = sorted(records, key=lambda r: (r.done_s, r.index))
    seen: list[RequestRecord] = []
    measured = 0
    total = sum(1 for r in records if not r.warmup)
    for r in done:
        seen.append(r)
        if r.warmup:
            continue
        measured += 1
        if measured >= total or not rule.due(measured):
            continue
        stop = rule.judge(seen, at_s=r.done_s)
        if stop is not None:
            return sorted(seen, key=lambda x: x.index), stop
    return list(records), None
