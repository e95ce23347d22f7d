"""The statistics of a verification: a one-sided paired test on per-pair log-ratios and the greedy-token
agreement of two arms. Shared by the testbed's A/B verification and anything else that compares two
configurations on paired runs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


# ---------------------------------------------------------------- statistics
@dataclass(frozen=True)
class PairedTest:
    n: int
    improvement: float  # point estimate of the relative improvement (geometric mean of the ratios - 1)
    improvement_low: float  # one-sided lower confidence bound of the relative improvement
    p_value: float  # H0: improvement <= min_improvement
    passed: bool
    method: str


def paired_test(reference: Sequence[float], candidate: Sequence[float], *, direction: str,
                min_improvement: float, confidence: float, method: str = "t", n_boot: int = 4000,
                seed: int = 0) -> PairedTest:
    """One-sided paired test on d_i = log(candidate_i / reference_i) (inverted for minimised metrics)."""
    import numpy as np
    from scipy import stats

    a = np.asarray(reference, dtype=float)
    b = np.asarray(candidate, dtype=float)
    if len(a) != len(b) or len(a) < 2:
        raise ValueError("a paired test needs at least two pairs of equal length")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b)) and np.all(a > 0) and np.all(b > 0)):
        return PairedTest(len(a), math.nan, math.nan, 1.0, False, method)
    d = np.log(b / a) if direction == "maximize" else np.log(a / b)
    n = len(d)
    mean = float(d.mean())
    threshold = math.log1p(min_improvement)
    if method == "bootstrap":
        rng = np.random.default_rng(seed)
        means = rng.choice(d, size=(n_boot, n), replace=True).mean(axis=1)
        low = float(np.quantile(means, 1 - confidence))
        p = float((means <= threshold).mean())
    else:
        sd = float(d.std(ddof=1))
        se = sd / math.sqrt(n)
        if se == 0:
            low = mean
            p = 0.0 if mean > threshold else 1.0
        else:
            low = mean - float(stats.t.ppf(confidence, n - 1)) * se
            p = float(stats.t.sf((mean - threshold) / se, n - 1))
    return PairedTest(n=n, improvement=math.expm1(mean), improvement_low=math.expm1(low), p_value=p,
                      passed=low >= threshold, method=method)


def token_agreement(reference: Sequence[Sequence[int]], other: Sequence[Sequence[int]]) -> float:
    """Share of the reference's greedy tokens reproduced at the same position (over all probe prompts)."""
    total = matched = 0
    for i, ref in enumerate(reference):
        got = other[i] if i < len(other) else []
        total += len(ref)
        matched += sum(1 for j, tok in enumerate(ref) if j < len(got) and got[j] == tok)
    return matched / total if total else 1.0


def paired_interval(reference: Sequence[float], candidate: Sequence[float], *, direction: str,
                    confidence: float) -> tuple[float, float, float]:
    """The relative improvement of `candidate` over `reference` on paired runs (the geometric mean of the
    ratios - 1) with its two-sided `confidence` interval: (estimate, low, high), from two one-sided tests."""
    one_sided = (1 + confidence) / 2
    up = paired_test(reference, candidate, direction=direction, min_improvement=0.0, confidence=one_sided)
    down = paired_test(candidate, reference, direction=direction, min_improvement=0.0, confidence=one_sided)
    high = 1.0 / (1.0 + down.improvement_low) - 1.0 if down.improvement_low > -1 else math.inf
    return up.improvement, up.improvement_low, high


def proportion_test(reference: tuple[float, float], candidate: tuple[float, float], *, min_improvement: float,
                    confidence: float) -> PairedTest:
    """One-sided test on the ratio of two shares (good, n) each: H0 candidate/reference - 1 <= min_improvement.
    The delta method on log(share) (variance (1 - p) / (n p)), shares with a continuity correction ((good + 0.5) /
    (n + 1)) in the variance only, so that a share of 1 or 0 still has an interval. For counts pooled over a
    period (goodput on live traffic), where per-pair shares of a few requests would be too coarse to pair."""
    from scipy import stats

    (g_a, n_a), (g_b, n_b) = reference, candidate
    if n_a <= 0 or n_b <= 0:
        return PairedTest(0, math.nan, math.nan, 1.0, False, "proportions")
    p_a, p_b = g_a / n_a, g_b / n_b
    c_a, c_b = (g_a + 0.5) / (n_a + 1), (g_b + 0.5) / (n_b + 1)
    mean = math.log(max(p_b, 1e-9) / max(p_a, 1e-9)) if p_a > 0 or p_b > 0 else 0.0
    se = math.sqrt((1 - c_a) / (n_a * c_a) + (1 - c_b) / (n_b * c_b))
    threshold = math.log1p(min_improvement)
    low = mean - float(stats.norm.ppf(confidence)) * se
    p = float(stats.norm.sf((mean - threshold) / se)) if se > 0 else (0.0 if mean > threshold else 1.0)
    return PairedTest(n=int(n_a + n_b), improvement=math.expm1(mean), improvement_low=math.expm1(low), p_value=p,
                      passed=low >= threshold, method="proportions")
