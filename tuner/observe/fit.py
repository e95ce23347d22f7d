"""Fit what a window showed to a WorkloadSpec, and measure the fit on the load generator's own draws.

Lengths: the candidates are the spec's families (fixed, uniform, normal, lognormal) with the observed mean;
each is drawn by `tuner.measure.workload.sample_lengths` (what a trial sends) and compared with the observed
cumulative distribution at the observed bucket bounds; the smallest largest difference (`bucket_ks`) wins, the
fixed length when it is within `SIMPLER_WITHIN` of the best (a histogram cannot tell shapes inside a bucket).

Arrivals: a closed loop when the requests in the server (running + waiting) sit at a ceiling they never pass
(at least `CLOSED_AT_MAX` of the samples at the maximum: the concurrency is that maximum, since the client's
time between a request's end and the next one's start lowers the server's mean but not its ceiling; and an
open loop at that mean would hardly have shown it: its requests in the server are Poisson (M/G/inf), and the
chance that its samples never pass the ceiling and sit at it as often as seen must be below `CEILING_P`: a
quiet open loop with 0 or 1 requests in the server never passes 1 either) or stay
near one level (coefficient of variation below `CLOSED_CV`: the rounded mean); else an open loop at the observed
rate whose process follows the burstiness (`dispersion`: the squared coefficient of variation of the gaps
between arrivals for a trace, the index of dispersion of the finished requests per scrape interval for /metrics
and Prometheus; 1 for Poisson): constant below `CONSTANT_BELOW`, Poisson inside `POISSON_BAND`, else gamma with
shape 1/dispersion. Completions clump where a batch finishes together, so a server's dispersion overstates
that of its arrivals somewhat (experiments/observation/ measures how often the process is told right).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.stats import binom, poisson

from tuner.errors import ObservationError
from tuner.measure.scrape import histogram_quantile
from tuner.measure.workload import sample_lengths
from tuner.observe.model import LengthHist, ObservedWorkload, WindowCounts
from tuner.spec import Arrival, LengthDist, WorkloadSpec

SIMPLER_WITHIN = 0.02
CLOSED_CV = 0.2
CLOSED_AT_MAX = 0.4
CEILING_P = 0.01
CONSTANT_BELOW = 0.05
POISSON_BAND = (0.5, 2.0)
DRAWS = 8000
ARRIVALS = ("auto", "closed", "poisson", "gamma", "constant")


def observed_cdf(h: LengthHist) -> tuple[np.ndarray, np.ndarray]:
    """The finite bucket bounds and the observed cumulative fraction at each."""
    b = np.asarray(h.bounds, dtype=float)
    c = np.asarray(h.cum, dtype=float) / h.count
    keep = np.isfinite(b)
    return b[keep], c[keep]


def _cdf_at(draws_sorted: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    return np.searchsorted(draws_sorted, bounds, side="right") / len(draws_sorted)


def _candidates(mean: float, lo: int, hi: int) -> list[LengthDist]:
    m = min(max(mean, float(lo)), float(hi))
    out = [LengthDist(dist="fixed", value=max(1, round(m)), min=lo, max=hi)]
    for s in np.geomspace(0.02, 2.5, 40):
        out.append(LengthDist(dist="lognormal", mean=round(m, 2), sigma=round(float(s), 4), min=lo, max=hi))
    for f in np.geomspace(0.01, 1.0, 30):
        out.append(LengthDist(dist="normal", mean=round(m, 2), std=round(float(m * f), 2), min=lo, max=hi))
    for f in np.linspace(0.02, 1.0, 30):
        low, high = max(1, round(m * (1 - f))), max(1, round(m * (1 + f)))
        out.append(LengthDist(dist="uniform", low=low, high=high, min=lo, max=hi))
    return out


def _draw(dist: LengthDist) -> np.ndarray:
    return np.sort(sample_lengths(dist, DRAWS, np.random.default_rng(0)))


def fit_lengths(h: LengthHist, name: str, *, lo: int = 1, hi: int | None = None) -> tuple[LengthDist, dict[str, float]]:
    """The LengthDist nearest the histogram `h` and its errors `<name>_mean_rel_err`, `<name>_bucket_ks`."""
    if not h.count > 0:
        raise ObservationError(f"no {name} lengths were observed in the window")
    mean = h.mean
    bounds, obs = observed_cdf(h)
    if hi is None:  # the highest bucket that holds requests bounds the lengths (unbounded: the spec's default)
        nonempty = [b for b, c0, c1 in zip(h.bounds, [0.0, *h.cum[:-1]], h.cum, strict=True) if c1 > c0]
        hi = int(nonempty[-1]) if nonempty and math.isfinite(nonempty[-1]) else LengthDist().max
    hi = max(hi, lo)
    best: tuple[float, LengthDist] | None = None
    fixed_ks = math.inf
    for dist in _candidates(mean, lo, hi):
        ks = float(np.max(np.abs(_cdf_at(_draw(dist), bounds) - obs))) if len(bounds) else 0.0
        if dist.dist == "fixed":
            fixed_ks = ks
        if best is None or ks < best[0]:
            best = (ks, dist)
    assert best is not None
    ks, dist = best
    if dist.dist != "fixed" and fixed_ks <= ks + SIMPLER_WITHIN:
        ks, dist = fixed_ks, _candidates(mean, lo, hi)[0]
    if dist.dist in ("lognormal", "normal"):  # clipping moves the mean: correct it once on the draws
        drawn = float(np.mean(_draw(dist)))
        if drawn > 0:
            dist = dist.model_copy(update={"mean": round(max(0.01, float(dist.mean or mean) * mean / drawn), 2)})
            ks = float(np.max(np.abs(_cdf_at(_draw(dist), bounds) - obs))) if len(bounds) else 0.0
    drawn = float(np.mean(_draw(dist)))
    return dist, {f"{name}_mean_rel_err": abs(drawn - mean) / mean, f"{name}_bucket_ks": ks}


def dispersion(intervals: Sequence[tuple[float, float]]) -> float | None:
    """Index of dispersion of counts over intervals of any lengths (Pearson's chi-square over its degrees of
    freedom; 1 for a Poisson process): None with fewer than three intervals or no count."""
    iv = [(d, c) for d, c in intervals if d > 0]
    if len(iv) < 3:
        return None
    total_t = sum(d for d, _ in iv)
    total_c = sum(c for _, c in iv)
    if total_c <= 0:
        return None
    r = total_c / total_t
    return sum((c - r * d) ** 2 / (r * d) for d, c in iv) / (len(iv) - 1)


def _open_ceiling_chance(c_max: float, mean: float, n: int, at: int) -> float:
    """The chance that an open loop with `mean` requests in the server (Poisson, M/G/inf) shows, in `n` samples
    taken as independent, none above `c_max` and at least `at` at it."""
    if not mean > 0:
        return 1.0
    under = float(poisson.cdf(c_max, mean))  # at or under the ceiling
    if under <= 0:
        return 0.0
    return under ** n * float(binom.sf(at - 1, n, float(poisson.pmf(c_max, mean)) / under))


def fit_arrival(rate_per_s: float, disp: float | None, conc: Sequence[float], *,
                kind: str = "auto") -> tuple[Arrival, dict[str, float], list[str]]:
    """The arrival process for the observed rate, dispersion and concurrency samples (see the module doc)."""
    if kind not in ARRIVALS:
        raise ObservationError(f"arrival {kind!r}: must be one of {', '.join(ARRIVALS)}")
    notes: list[str] = []
    err: dict[str, float] = {}
    c_mean = float(np.mean(conc)) if len(conc) else math.nan
    c_cv = float(np.std(conc) / c_mean) if len(conc) > 1 and c_mean > 0 else math.inf
    c_max = float(np.max(conc)) if len(conc) else 0.0
    n_at_max = int(np.sum(np.asarray(conc) >= c_max)) if len(conc) else 0
    at_max = n_at_max / len(conc) if len(conc) else 0.0
    ceiling = (len(conc) >= 5 and c_max >= 1 and at_max >= CLOSED_AT_MAX
               and _open_ceiling_chance(c_max, c_mean, len(conc), n_at_max) < CEILING_P)
    level = len(conc) > 1 and c_mean >= 0.9 and c_cv < CLOSED_CV
    if kind == "auto":
        if ceiling or level:
            kind = "closed"
            notes.append(f"closed loop: requests in the server at their maximum {c_max:g} in {100 * at_max:.0f}% "
                         f"of the samples, mean {c_mean:.2f} (CV {c_cv:.2f})")
        elif disp is None:
            kind = "poisson"
            notes.append("poisson: too few intervals to measure the burstiness")
        elif disp < CONSTANT_BELOW:
            kind = "constant"
        elif POISSON_BAND[0] <= disp <= POISSON_BAND[1]:
            kind = "poisson"
        else:
            kind = "gamma"
    if kind == "closed":
        if not c_mean > 0:
            raise ObservationError("a closed loop needs the concurrency, but vllm:num_requests_running / "
                                   "vllm:num_requests_waiting gave no samples above 0 in the window")
        n = max(1, round(c_max if ceiling or not level else c_mean))
        err["concurrency_rel_err"] = abs(n - c_mean) / c_mean  # against the server's mean: see the module doc
        return Arrival(kind="closed", concurrency=n), err, notes
    if not rate_per_s > 0:
        raise ObservationError("no request arrived in the window: nothing to fit a rate to (send traffic or "
                               "widen the window)")
    shape = 1.0
    if kind == "gamma":
        shape = 1.0 / disp if disp else 1.0
        shape = min(max(shape, 0.05), 50.0)
    if disp is not None:
        model = {"constant": 0.0, "poisson": 1.0}.get(kind, 1.0 / shape)
        err["burstiness_abs_err"] = abs(model - disp)
    arrival = Arrival(kind=kind, rate_per_s=float(rate_per_s), burstiness=shape)  # type: ignore[arg-type]
    return arrival, err, notes


def length_stats(name: str, h: LengthHist) -> dict[str, float]:
    buckets = dict(zip(h.bounds, h.cum, strict=True))
    return {f"{name}_mean": h.mean, f"{name}_p50": histogram_quantile(0.5, buckets),
            f"{name}_p90": histogram_quantile(0.9, buckets)}


def gauge_stats(name: str, values: Sequence[float]) -> dict[str, float]:
    return {f"{name}_mean": float(np.mean(values)), f"{name}_max": float(np.max(values))} if len(values) else {}


def from_counts(c: WindowCounts, source: str, *, arrival: str = "auto",
                num_requests: int | None = None) -> ObservedWorkload:
    """The observed workload of a /metrics or Prometheus window."""
    window_s = c.end_s - c.start_s
    if not window_s > 0:
        raise ObservationError(f"the window of {source} is empty (start {c.start_s}, end {c.end_s}): observe "
                               "over at least two scrapes")
    if not c.requests > 0:
        raise ObservationError(f"vllm:request_success_total did not increase over the {window_s:.1f} s window of "
                               f"{source}: no request finished (send traffic or widen the window)")
    for series, h in (("vllm:request_prompt_tokens", c.prompt), ("vllm:request_generation_tokens", c.output)):
        if not h.count > 0:
            raise ObservationError(f"{series}_count did not increase over the window of {source} although "
                                   f"{c.requests:g} requests finished: the histogram is missing or stale")
    rate = c.requests / window_s
    disp = dispersion(c.interval_counts)
    conc = [r + w for r, w in zip(c.running, c.waiting, strict=False)] if c.waiting else list(c.running)
    stats: dict[str, float] = {"requests": c.requests, "window_s": window_s, "rate_per_s": rate}
    if disp is not None:
        stats["burstiness"] = disp
    stats |= gauge_stats("running", c.running) | gauge_stats("waiting", c.waiting) | gauge_stats("concurrency", conc)
    stats |= length_stats("prompt_tokens", c.prompt) | length_stats("output_tokens", c.output)
    if c.prefix_queries is not None and c.prefix_queries > 0:
        stats["prefix_cache_hit_rate"] = (c.prefix_hits or 0.0) / c.prefix_queries
    arr, err, notes = fit_arrival(rate, disp, conc, kind=arrival)
    p_dist, p_err = fit_lengths(c.prompt, "prompt_tokens")
    o_dist, o_err = fit_lengths(c.output, "output_tokens")
    notes.append("burstiness: index of dispersion of the requests finished per scrape interval (1 = Poisson; "
                 "arrivals are not exported, completions stand for them)")
    wl = WorkloadSpec(arrival=arr, prompt_tokens=p_dist, output_tokens=o_dist,
                      num_requests=num_requests or max(1, round(c.requests)))
    return ObservedWorkload(workload=wl, start_s=c.start_s, end_s=c.end_s, source=source, stats=stats,
                            fit_error=err | p_err | o_err, notes=notes)
