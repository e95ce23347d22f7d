"""The monitor's signals: one window (the scrapes at its start and its end) -> a value per signal.

Inputs (what the users send): rate_per_s (arrivals: finished requests plus the growth of running + waiting),
prompt_tokens_mean, output_tokens_mean (of the requests finished in the window: vLLM's per-request histograms
vllm:request_prompt_tokens and vllm:request_generation_tokens; its token counters count a prompt at its prefill
and an output token as it is made, so over a window they mix requests that finish in other windows, and read a
fixed 64-token prompt as 48-80 in 3-s windows of a real vLLM: tests/integration/observe; the counters only where
a server has no such histograms). Outputs (how the server
answers): ttft_ms_p50/p90, itl_ms_mean/p90, e2el_ms_p50/p90 (quantiles from the histograms' bucket deltas over
the window, each with its bucket's bounds: bucket_keys), token_throughput_per_s, error_frac (aborted or failed
share of the finished requests). State: running, waiting (gauges at the window's end), kv_cache_usage_frac,
preemptions_per_s, finished_per_s, in_server_mean (the mean number of requests in the server over the window by
Little's law: the seconds its finished requests spent there, the end-to-end histogram's sum, per second of the
window; what tells a closed loop's slower answers from fewer users, tuner.monitor.classify). GPU signals come
from tuner.monitor.telemetry, the environment's
(cpu_wait_frac: the share of the window the server waited for a CPU; cpu_ready_wait_frac: the share of the time
it was ready to run that it waited; host_probe_us: the geometric mean of the CPU time three fixed tasks took on
the host, on the server's own CPU where followed (tuner.monitor.hostspeed: the host's own speed);
cpu_steal_frac: the share of its host's CPU time the hypervisor gave other guests) from tuner.monitor.contention;
the caller merges them in.

A counter that went down (the server restarted) makes the window unusable: None. A signal whose series the
server does not export is named once in the log and left out, never fatal.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

from tuner.measure.scrape import (
    LENGTH_HISTS,
    Hist,
    Snapshot,
    finished_mean_length,
    histogram_bucket,
    histogram_quantile,
    window_buckets,
)

log = logging.getLogger(__name__)

INPUTS = ("rate_per_s", "prompt_tokens_mean", "output_tokens_mean")
LATENCIES = ("ttft_ms_p50", "ttft_ms_p90", "itl_ms_mean", "itl_ms_p90", "e2el_ms_p50", "e2el_ms_p90")
STATE = ("running", "waiting", "kv_cache_usage_frac", "preemptions_per_s", "finished_per_s", "in_server_mean")
OUTPUTS = (*LATENCIES, "token_throughput_per_s", "error_frac")
GPU = ("gpu_util_pct", "gpu_power_w", "gpu_sm_clock_mhz", "gpu_dram_active_frac", "gpu_fb_used_mb",
       "gpu_throttled")
# the environment: explains the outputs, never alarms on its own (tuner.monitor.contention)
ENVIRONMENT = ("cpu_wait_frac", "cpu_ready_wait_frac", "cpu_steal_frac", "host_probe_us")
SIGNALS = (*INPUTS, *OUTPUTS, *STATE, *GPU, *ENVIRONMENT)

# which series each server signal needs (the names the scraper maps vLLM's series to)
_NEEDS = {
    "rate_per_s": ("counter", "request_success"),
    "prompt_tokens_mean": ("length", "prompt_tokens"),
    "output_tokens_mean": ("length", "generation_tokens"),
    "token_throughput_per_s": ("counter", "generation_tokens"),
    "error_frac": ("counter", "request_failed"),
    "preemptions_per_s": ("counter", "preemptions"),
    "ttft_ms_p50": ("hist", "ttft_ms"), "ttft_ms_p90": ("hist", "ttft_ms"),
    "itl_ms_mean": ("hist", "itl_ms"), "itl_ms_p90": ("hist", "itl_ms"),
    "e2el_ms_p50": ("hist", "e2el_ms"), "e2el_ms_p90": ("hist", "e2el_ms"), "in_server_mean": ("hist", "e2el_ms"),
    "running": ("gauge", "num_requests_running"), "waiting": ("gauge", "num_requests_waiting"),
    "kv_cache_usage_frac": ("gauge", "kv_cache_usage_perc"),
}
_GAUGE_KEYS = {"kv_cache_usage_perc": "kv_cache_usage_frac"}


@dataclass
class MissingSeries:
    """Names each missing series once (a log line and the set `named`), then stays quiet about it."""

    source: str = "server"
    named: set[str] = field(default_factory=set)

    def note(self, what: str) -> None:
        if what not in self.named:
            self.named.add(what)
            log.warning("monitor: the %s exports no %s: that signal is left out", self.source, what)


def _has(snap: Snapshot, kind: str, key: str) -> bool:
    if kind == "length":
        return LENGTH_HISTS[key] in snap.hists or key in snap.counters
    if kind == "counter":
        return key in snap.counters
    if kind == "hist":
        return key in snap.hists
    return _GAUGE_KEYS.get(key, key) in snap.gauges


def bucket_keys(name: str) -> tuple[str, str]:
    """The keys of a histogram quantile's bucket bounds (ms) in a window's signals: its value is interpolated
    inside that bucket (vLLM's TTFT buckets jump from 100 to 250 ms, its end-to-end ones from 100 to 300)."""
    return f"{name}_bucket_lo", f"{name}_bucket_hi"


def _quantile_ms(q: float, before: Hist, after: Hist) -> tuple[float, tuple[float, float] | None]:
    delta = window_buckets(before, after)
    bucket = histogram_bucket(q, delta)
    return histogram_quantile(q, delta) * 1000.0, None if bucket is None else (bucket[0] * 1000.0, bucket[1] * 1000.0)


def window_signals(before: Snapshot, after: Snapshot, seconds: float,
                   missing: MissingSeries | None = None) -> dict[str, float] | None:
    """The server signals of the window between two scrapes `seconds` apart; None after a counter reset.

    A latency signal needs at least one request observed in the window; without one it is absent (no
    evidence either way), as are the lengths without a finished request."""
    if seconds <= 0:
        raise ValueError(f"window length must be > 0 s, got {seconds}")
    for key, v in after.counters.items():
        if v < before.counters.get(key, 0.0):
            log.info("monitor: counter %s went down (a server restart): window skipped", key)
            return None
    for key, h in after.hists.items():
        if h.count < before.hists.get(key, Hist()).count:
            log.info("monitor: histogram %s went down (a server restart): window skipped", key)
            return None
    if missing is not None:
        lost: dict[tuple[str, str], list[str]] = {}
        for sig, (kind, key) in _NEEDS.items():
            if not _has(after, kind, key):
                lost.setdefault((kind, key), []).append(sig)
        for (kind, key), sigs in lost.items():
            what = f"histogram {LENGTH_HISTS[key]} or counter {key}" if kind == "length" else f"{kind} {key}"
            missing.note(f"{what} (signals {', '.join(sigs)})")

    def d(key: str) -> float | None:
        if key not in after.counters:
            return None
        return after.counters[key] - before.counters.get(key, 0.0)

    out: dict[str, float] = {}
    done = d("request_success")
    if done is not None:
        # arrivals, by flow balance: finished + the growth of the requests in the server (a saturated server
        # finishes fewer than arrive; counting finishes alone would hide that the load went up)
        inside = ["num_requests_running", "num_requests_waiting"]
        grew = (sum(after.gauges[g] - before.gauges[g] for g in inside)
                if all(g in after.gauges and g in before.gauges for g in inside) else 0.0)
        out["rate_per_s"] = max(0.0, done + grew) / seconds
        out["finished_per_s"] = done / seconds  # how much evidence the window's mean lengths carry
        failed = d("request_failed")
        if failed is not None and done > 0:
            out["error_frac"] = failed / done
    gen = d("generation_tokens")
    if gen is not None:
        out["token_throughput_per_s"] = gen / seconds
    for key, name in (("prompt_tokens", "prompt_tokens_mean"), ("generation_tokens", "output_tokens_mean")):
        mean = finished_mean_length(before, after, key)
        if mean is not None:
            out[name] = mean
    pre = d("preemptions")
    if pre is not None:
        out["preemptions_per_s"] = pre / seconds
    for key, name in (("num_requests_running", "running"), ("num_requests_waiting", "waiting"),
                      ("kv_cache_usage_frac", "kv_cache_usage_frac")):
        if key in after.gauges:
            out[name] = after.gauges[key]
    for key, qs in (("ttft_ms", (0.5, 0.9)), ("itl_ms", (0.9,)), ("e2el_ms", (0.5, 0.9))):
        if key not in after.hists:
            continue
        h, b = after.hists[key], before.hists.get(key, Hist())
        n = h.count - b.count
        if n <= 0:
            continue
        if key == "itl_ms":
            out["itl_ms_mean"] = (h.sum - b.sum) / n * 1000.0
        if key == "e2el_ms":  # Little's law: request-seconds in the server per second of the window
            out["in_server_mean"] = max(0.0, h.sum - b.sum) / seconds
        for q in qs:
            v, bucket = _quantile_ms(q, b, h)
            if math.isfinite(v):
                name = f"{key}_p{round(q * 100)}"
                out[name] = v
                if bucket is not None:
                    out.update(zip(bucket_keys(name), bucket, strict=True))
    return out
