"""Server telemetry: scrape a Prometheus /metrics endpoint (vLLM 0.33 names) before, during and after a run.

Counters and histograms are differenced over the run; histogram percentiles are estimated from the bucket
deltas (linear within a bucket, as Prometheus' histogram_quantile). Gauges are sampled during the run.
Keys (unit-suffixed, `server_` prefix): server_kv_cache_usage_frac (mean), server_kv_cache_usage_frac_max,
server_num_requests_running_max, server_num_requests_waiting_max, server_preemptions, server_prompt_tokens,
server_generation_tokens, server_prefix_cache_hit_rate, server_ttft_ms_{mean,p50,p90,p99},
server_itl_ms_{mean,p50,p90,p99}, server_e2el_ms_{mean,p99}, server_queue_time_ms_{mean,p99}.
A Snapshot also counts `request_failed`: the finished requests whose reason was abort or error.
"""

from __future__ import annotations

import logging
import math
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from tuner.base.redact import redact_text, redact_url

log = logging.getLogger(__name__)

_GAUGES = {
    "vllm:kv_cache_usage_perc": "kv_cache_usage_frac",
    "vllm:num_requests_running": "num_requests_running",
    "vllm:num_requests_waiting": "num_requests_waiting",
}
_COUNTERS = {
    "vllm:num_preemptions": "preemptions",
    "vllm:prompt_tokens": "prompt_tokens",
    "vllm:generation_tokens": "generation_tokens",
    "vllm:prefix_cache_queries": "prefix_cache_queries",
    "vllm:prefix_cache_hits": "prefix_cache_hits",
    "vllm:request_success": "request_success",
}
_FAILED_REASONS = ("abort", "error")
_HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": "ttft_ms",
    "vllm:inter_token_latency_seconds": "itl_ms",
    "vllm:e2e_request_latency_seconds": "e2el_ms",
    "vllm:request_queue_time_seconds": "queue_time_ms",
    # lengths per finished request (tokens, not times: telemetry() leaves them out; tuner.observe reads them)
    "vllm:request_prompt_tokens": "request_prompt_tokens",
    "vllm:request_generation_tokens": "request_generation_tokens",
}
_LATENCY_HISTS = ("ttft_ms", "itl_ms", "e2el_ms", "queue_time_ms")


@dataclass
class Hist:
    buckets: dict[float, float] = field(default_factory=dict)  # upper bound -> cumulative count
    sum: float = 0.0
    count: float = 0.0


def window_buckets(before: Hist, after: Hist) -> dict[float, float]:
    """A histogram's cumulative bucket counts (upper bound -> count) of the observations between two scrapes."""
    return {le: c - before.buckets.get(le, 0.0) for le, c in after.buckets.items()}


@dataclass
class Snapshot:
    """One scrape: gauges summed over label sets (kv usage averaged), counters and histograms summed."""

    gauges: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    hists: dict[str, Hist] = field(default_factory=dict)


def parse(text: str) -> Snapshot:
    snap = Snapshot()
    kv_n = 0
    for fam in text_string_to_metric_families(text):
        name = fam.name
        if name in _GAUGES:
            key = _GAUGES[name]
            for s in fam.samples:
                if s.name == name:
                    snap.gauges[key] = snap.gauges.get(key, 0.0) + float(s.value)
                    if key == "kv_cache_usage_frac":
                        kv_n += 1
        elif name in _COUNTERS or name.removesuffix("_total") in _COUNTERS:
            base = name.removesuffix("_total")
            key = _COUNTERS[base]
            for s in fam.samples:
                if s.name == base + "_total":
                    snap.counters[key] = snap.counters.get(key, 0.0) + float(s.value)
                    if key == "request_success":  # the failed share: aborted or errored (vLLM's reasons)
                        failed = float(s.value) if s.labels.get("finished_reason") in _FAILED_REASONS else 0.0
                        snap.counters["request_failed"] = snap.counters.get("request_failed", 0.0) + failed
        elif name in _HISTOGRAMS:
            h = snap.hists.setdefault(_HISTOGRAMS[name], Hist())
            for s in fam.samples:
                if s.name == name + "_bucket":
                    le = float(s.labels["le"])
                    h.buckets[le] = h.buckets.get(le, 0.0) + float(s.value)
                elif s.name == name + "_sum":
                    h.sum += float(s.value)
                elif s.name == name + "_count":
                    h.count += float(s.value)
    if kv_n > 1:
        snap.gauges["kv_cache_usage_frac"] /= kv_n
    return snap


def fetch(url: str, timeout_s: float = 5.0) -> Snapshot:
    """Fetch and parse `url`; OSError when it cannot be read, ValueError when it is not the text format."""
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return parse(r.read().decode("utf-8", "replace"))


def scrape(url: str, timeout_s: float = 5.0) -> Snapshot | None:
    """Fetch and parse `url`; None (logged) when it cannot be read."""
    try:
        return fetch(url, timeout_s)
    except (OSError, ValueError) as exc:
        log.warning("could not scrape %s: %s", redact_url(url), redact_text(str(exc)))
        return None


def histogram_quantile(q: float, buckets: dict[float, float]) -> float:
    """Prometheus-style quantile from cumulative bucket counts (upper bound -> count)."""
    found = _quantile_bucket(q, buckets)
    if found is None:
        return math.nan
    lo, le, prev_c, c, rank = found
    if math.isinf(le):
        return lo  # in the +Inf bucket: the highest finite bound
    if c == prev_c:
        return le
    return lo + (le - lo) * (rank - prev_c) / (c - prev_c)


def histogram_bucket(q: float, buckets: dict[float, float]) -> tuple[float, float] | None:
    """The (lower, upper) bounds of the bucket that holds the q-quantile (the first bucket's lower bound 0, the
    last one's upper +Inf): histogram_quantile's value is interpolated inside it, so it is known no better."""
    found = _quantile_bucket(q, buckets)
    return None if found is None else (found[0], found[1])


def _quantile_bucket(q: float, buckets: dict[float, float]) -> tuple[float, float, float, float, float] | None:
    """(lower bound, upper bound, count below, count up to the upper bound, rank) of the q-quantile's bucket."""
    bs = sorted(buckets.items())
    if not bs or bs[-1][1] <= 0:
        return None
    rank = q * bs[-1][1]
    prev_le, prev_c = 0.0, 0.0
    for le, c in bs:
        if c >= rank:
            return prev_le, le, prev_c, c, rank
        prev_le, prev_c = le, c
    return prev_le, bs[-1][0], prev_c, bs[-1][1], rank  # q > 1: the last bucket


# a finished request's length: vLLM's per-request histogram of it; its token counter counts a prompt at its
# prefill and an output token as it is made, so between two scrapes it also holds requests finished later
LENGTH_HISTS = {"prompt_tokens": "request_prompt_tokens", "generation_tokens": "request_generation_tokens"}


def finished_mean_length(before: Snapshot, after: Snapshot, key: str) -> float | None:
    """The mean `key` ("prompt_tokens" or "generation_tokens") of the requests finished between two scrapes: from
    the per-request histogram where the server exports it, else its token counter over the requests finished
    (request_success); None when none finished or neither series is there."""
    hist = LENGTH_HISTS[key]
    if hist in after.hists:
        h, b = after.hists[hist], before.hists.get(hist, Hist())
        n = h.count - b.count
        return (h.sum - b.sum) / n if n > 0 else None
    done = after.counters.get("request_success", 0.0) - before.counters.get("request_success", 0.0)
    if key in after.counters and done > 0:
        return (after.counters[key] - before.counters.get(key, 0.0)) / done
    return None


def telemetry(before: Snapshot | None, after: Snapshot | None,
              during: Sequence[Snapshot] = ()) -> dict[str, float]:
    """server_* keys from the scrapes around (and during) one run."""
    out: dict[str, float] = {}
    if after is None:
        return out
    base = before or Snapshot()
    for key in ("preemptions", "prompt_tokens", "generation_tokens", "request_success"):
        if key in after.counters:
            out[f"server_{key}"] = after.counters[key] - base.counters.get(key, 0.0)
    q = after.counters.get("prefix_cache_queries", 0.0) - base.counters.get("prefix_cache_queries", 0.0)
    if q > 0:
        hits = after.counters.get("prefix_cache_hits", 0.0) - base.counters.get("prefix_cache_hits", 0.0)
        out["server_prefix_cache_hit_rate"] = hits / q
    samples = list(during) or [after]
    for key in ("kv_cache_usage_frac", "num_requests_running", "num_requests_waiting"):
        vals = [s.gauges[key] for s in samples if key in s.gauges]
        if vals:
            if key == "kv_cache_usage_frac":
                out["server_kv_cache_usage_frac"] = sum(vals) / len(vals)
            out[f"server_{key}_max"] = max(vals)
    for key, h in after.hists.items():
        if key not in _LATENCY_HISTS:
            continue
        b = base.hists.get(key, Hist())
        n = h.count - b.count
        if n <= 0:
            continue
        delta = window_buckets(b, h)
        out[f"server_{key}_mean"] = (h.sum - b.sum) / n * 1000.0
        for q_ in (50, 90, 99):
            if key in ("e2el_ms", "queue_time_ms") and q_ != 99:
                continue
            out[f"server_{key}_p{q_}"] = histogram_quantile(q_ / 100.0, delta) * 1000.0
    return out
