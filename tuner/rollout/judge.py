"""Judging a canary on live traffic: per-replica figures of one window from each replica's /metrics, and a
stage's verdict with the verification's paired one-sided test.

Canary and stable replicas serve the same requests stream at the same time, so a window (a few seconds) is a
pair: the canary's figure and the stable replicas' figure (their histograms summed) over the same seconds,
which slow drift of the machine or the traffic hits alike. Over a stage's windows two one-sided paired tests
on the log-ratios (tuner.promotion.stats.paired_test) decide, per judged metric:

- passed: the canary is not worse than stable by more than `max_regression` (non-inferiority: the lower
  `confidence` bound of its relative improvement is >= -max_regression);
- regressed: stable is better than the canary by at least `max_regression` with the same confidence.

Latencies come from the vLLM-named histograms (`vllm:time_to_first_token_seconds`, ...; tuner.measure.scrape,
quantiles interpolated within buckets as Prometheus does); `goodput_fraction` is the share of a window's
requests under the per-request goodput thresholds of the SLOs (TTFT and end-to-end; the smaller share of the
two, an upper bound of the share meeting both, as each histogram counts on its own; TPOT has no per-request
series on the servers and is left out). A window holds a few canary requests, too few for a share to pair
(a share of 0 has no log-ratio; one of 1 of 1 request is no evidence), so goodput is judged on the stage's
pooled counts instead, with a one-sided test on the ratio of the two shares (tuner.promotion.stats.
proportion_test; the same margin and confidence).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tuner import catalog
from tuner.measure.scrape import Hist, Snapshot, telemetry
from tuner.promotion.stats import paired_test, proportion_test
from tuner.spec import SLO

GOODPUT = "goodput_fraction"
_GOODPUT_HISTS = {"ttft": "ttft_ms", "e2el": "e2el_ms"}


def merge(snaps: Sequence[Snapshot | None]) -> Snapshot | None:
    """Several replicas' scrapes as one (counters and histograms summed); None if any is missing."""
    if not snaps or any(s is None for s in snaps):
        return None
    out = Snapshot()
    for s in snaps:
        assert s is not None
        for k, v in s.counters.items():
            out.counters[k] = out.counters.get(k, 0.0) + v
        for k, h in s.hists.items():
            m = out.hists.setdefault(k, Hist())
            m.sum += h.sum
            m.count += h.count
            for le, c in h.buckets.items():
                m.buckets[le] = m.buckets.get(le, 0.0) + c
    return out


def share_below(before: Snapshot | None, after: Snapshot, hist: str, limit_s: float) -> tuple[float, float]:
    """(requests, share of them at or under `limit_s`) of one histogram between two scrapes (linear within a
    bucket)."""
    h = after.hists.get(hist)
    if h is None:
        return 0.0, math.nan
    b = (before.hists.get(hist) if before is not None else None) or Hist()
    n = h.count - b.count
    if n <= 0:
        return 0.0, math.nan
    prev_le, prev_c = 0.0, 0.0
    for le, c in sorted(h.buckets.items()):
        c -= b.buckets.get(le, 0.0)
        if le >= limit_s:
            if math.isinf(le) or le == prev_le:
                return n, prev_c / n
            return n, (prev_c + (c - prev_c) * (limit_s - prev_le) / (le - prev_le)) / n
        prev_le, prev_c = le, c
    return n, prev_c / n


@dataclass
class Window:
    """One replica group's figures over one window (judged metric -> value; ms for latencies)."""

    requests: float
    figures: dict[str, float] = field(default_factory=dict)


def figures(before: Snapshot | None, after: Snapshot | None, metrics: Sequence[str],
            goodput_ms: Mapping[str, float]) -> Window:
    """The judged metrics between two scrapes of one replica (or of several, merged)."""
    if after is None:
        return Window(requests=0.0)
    tel = telemetry(before, after)
    b = (before.hists.get("e2el_ms") if before is not None else None) or Hist()
    e2e = after.hists.get("e2el_ms")
    n = (e2e.count - b.count) if e2e is not None else 0.0
    out: dict[str, float] = {}
    for m in metrics:
        if m == GOODPUT:
            shares = [share_below(before, after, _GOODPUT_HISTS[k], ms / 1000.0)[1]
                      for k, ms in goodput_ms.items() if k in _GOODPUT_HISTS]
            shares = [s for s in shares if s == s]
            if shares:
                out[m] = min(shares)
        else:
            key = catalog.server_key(m)
            if key is not None and key in tel and tel[key] == tel[key]:
                out[m] = tel[key]
    return Window(requests=n, figures=out)


def slo_breaking(before: Snapshot | None, after: Snapshot | None, goodput_ms: Mapping[str, float]) -> float:
    """How many requests between two scrapes broke a per-request SLO threshold (TTFT or end-to-end; the larger
    count of the two: a lower bound of the requests that broke at least one)."""
    if after is None:
        return 0.0
    worst = 0.0
    for k, ms in goodput_ms.items():
        if k in _GOODPUT_HISTS:
            n, share = share_below(before, after, _GOODPUT_HISTS[k], ms / 1000.0)
            if n > 0 and share == share:
                worst = max(worst, n * (1.0 - share))
    return worst


def direction(metric: str) -> str:
    return "maximize" if metric == GOODPUT else "minimize"


def judged_metrics(objective: str, slos: Sequence[SLO], chosen: Sequence[str] | None) -> list[str]:
    """The rollout's judged metrics: as chosen, else the objective and the SLO metrics a server exports, and
    goodput_fraction where the SLOs set a TTFT or end-to-end threshold."""
    if chosen:
        return list(dict.fromkeys(chosen))
    out = [m for m in [objective, *(s.metric for s in slos)] if catalog.server_key(m) is not None]
    if any(catalog.goodput_key(s.metric) in _GOODPUT_HISTS and s.max is not None for s in slos):
        out.append(GOODPUT)
    return list(dict.fromkeys(out)) or ["ttft_ms.mean", "e2el_ms.mean"]


# ---------------------------------------------------------------- a stage's verdict
@dataclass
class MetricVerdict:
    metric: str
    pairs: int
    canary: float  # the mean over the windows
    stable: float
    improvement: float  # the canary's relative improvement over stable (geometric mean of the ratios - 1)
    improvement_low: float  # its one-sided lower confidence bound
    passed: bool  # not worse than stable by more than the margin
    regressed: bool  # worse than stable by at least the margin


@dataclass
class StageVerdict:
    passed: bool
    regressed: bool
    reason: str
    metrics: list[MetricVerdict] = field(default_factory=list)


def judge(pairs: Sequence[tuple[Window, Window]], metrics: Sequence[str], *, max_regression: float,
          confidence: float, totals: tuple[Window, Window] | None = None) -> StageVerdict:
    """pairs: (stable, canary) per window; totals: (stable, canary) over the stage so far (for goodput). Passed
    when every metric is shown not worse within the margin; regressed when any is shown worse by at least the
    margin; else undecided (both False)."""
    out: list[MetricVerdict] = []
    worse_by = max_regression / (1 - max_regression) if max_regression else 0.0
    for m in metrics:
        if m == GOODPUT:
            s_t, c_t = totals or (Window(0.0), Window(0.0))
            if m not in s_t.figures or m not in c_t.figures:
                out.append(MetricVerdict(m, 0, math.nan, math.nan, math.nan, math.nan, False, False))
                continue
            ref = (s_t.figures[m] * s_t.requests, s_t.requests)
            cand = (c_t.figures[m] * c_t.requests, c_t.requests)
            ni = proportion_test(ref, cand, min_improvement=-max_regression, confidence=confidence)
            worse = proportion_test(cand, ref, min_improvement=worse_by, confidence=confidence)
            out.append(MetricVerdict(m, int(c_t.requests), c_t.figures[m], s_t.figures[m], ni.improvement,
                                     ni.improvement_low, ni.passed, worse.passed))
            continue
        st = [(s.figures[m], c.figures[m]) for s, c in pairs
              if s.requests > 0 and c.requests > 0 and m in s.figures and m in c.figures]
        if len(st) < 2:
            out.append(MetricVerdict(m, len(st), math.nan, math.nan, math.nan, math.nan, False, False))
            continue
        a, b = [x for x, _ in st], [y for _, y in st]
        d = direction(m)
        ni = paired_test(a, b, direction=d, min_improvement=-max_regression, confidence=confidence)
        worse = paired_test(b, a, direction=d, min_improvement=worse_by, confidence=confidence)
        out.append(MetricVerdict(m, ni.n, sum(b) / len(b), sum(a) / len(a), ni.improvement, ni.improvement_low,
                                 ni.passed, worse.passed))
    regressed = [v for v in out if v.regressed]
    if regressed:
        why = "; ".join(f"{v.metric} {v.improvement:+.1%} vs stable (shown worse than -{max_regression:.0%}, "
                        f"{v.pairs} {'requests' if v.metric == GOODPUT else 'windows'})" for v in regressed)
        return StageVerdict(False, True, f"significant regression: {why}", out)
    if out and all(v.passed for v in out):
        why = ", ".join(f"{v.metric} {v.improvement:+.1%} (lower bound {v.improvement_low:+.1%})" for v in out)
        return StageVerdict(True, False, f"not worse than stable within {max_regression:.0%}: {why}", out)
    open_ = ", ".join(f"{v.metric} ({v.pairs} {'requests' if v.metric == GOODPUT else 'windows'}, lower bound "
                      f"{v.improvement_low:+.1%})"
                      for v in out if not v.passed)
    return StageVerdict(False, False, f"undecided: {open_}", out)
