"""Run-to-run noise: estimated from repeated measurements, a confidence interval on the best, and ranking by a
lower confidence bound (LCB) where the noise is material.

A trial's measurements are its own value plus the values of its repeats (trial user attribute `repeats`,
written by the loop when the agent's `noise.repeats` asks for them). The noise is the pooled coefficient of
variation of every trial measured more than once (the baseline and the incumbent bests): one CV for the study,
so a trial measured once is ranked with the same relative noise.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats


@dataclass(frozen=True)
class Estimate:
    """A configuration's mean over its n measurements, with a two-sided interval at `confidence`."""

    mean: float
    n: int
    low: float
    high: float

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


def pooled_cv(samples: Sequence[Sequence[float]]) -> float | None:
    """Pooled coefficient of variation of the samples with 2+ measurements and a non-zero mean (None: none)."""
    num = 0.0
    dof = 0
    for xs in samples:
        if len(xs) < 2:
            continue
        m = statistics.fmean(xs)
        if m == 0:
            continue
        num += sum(((x - m) / m) ** 2 for x in xs)
        dof += len(xs) - 1
    return math.sqrt(num / dof) if dof else None


def estimate(xs: Sequence[float], cv: float | None, confidence: float = 0.95) -> Estimate:
    """Mean of `xs` with the interval mean +- z * sd / sqrt(n), sd = cv x |mean| (the study's pooled noise).

    With no noise estimate (cv None) the interval is the point: nothing says how far a single run may be off.
    """
    if not xs:
        raise ValueError("no measurements")
    m = statistics.fmean(xs)
    n = len(xs)
    if cv is None:
        return Estimate(m, n, m, m)
    z = float(stats.norm.ppf(0.5 + confidence / 2))  # the noise comes from the pool, not from these n alone
    half = z * cv * abs(m) / math.sqrt(n)
    return Estimate(m, n, m - half, m + half)


def lcb(xs: Sequence[float], cv: float | None, confidence: float = 0.95, *, maximize: bool = True) -> float:
    """The pessimistic end of the interval: the low end when maximising, the high end when minimising."""
    e = estimate(xs, cv, confidence)
    return e.low if maximize else e.high


def within_noise(best: Estimate, reference: Estimate, *, maximize: bool = True) -> bool:
    """True when the intervals of `best` and `reference` overlap: the gain may be noise."""
    if maximize:
        return best.low <= reference.high
    return best.high >= reference.low
