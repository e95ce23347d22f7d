"""The metric catalog: every metric a spec may name, one row each.

One row per metric: its name, its unit, which direction is better, where it comes from, and whether it is a
latency that takes a statistic (`ttft_ms.p99`). Spec loading (objectives, SLOs), the goodput thresholds, the
production watch, `tuner metrics` and the docs all read this table. Pure data: imports nothing of the tuner.

Names are those of `vllm bench serve`'s summary (request_throughput, output_throughput, ...), the latencies as
`<latency>_ms.<stat>`, the server's Prometheus telemetry as `server_*`, NVML samples as `gpu_*` and the
simulator's internals as `sim_*` (the last two are families: any name with the prefix that a target reports).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Literal

Better = Literal["higher", "lower", "none"]

LOADGEN = "loadgen"
SERVER = "server /metrics"
DEPLOYMENT = "deployment"
CAPACITY = "capacity search"

LATENCY_STATS = ("mean", "median", "std", "p50", "p90", "p95", "p99")
ERROR_KINDS = ("connect", "timeout", "http_4xx", "http_5xx", "overload_503", "stream_broken", "rejected")


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    better: Better
    source: str
    doc: str
    latency: bool = False  # takes a statistic: <name>.<stat>, e.g. ttft_ms.p99
    goodput_key: str | None = None  # a max SLO on it is also each request's goodput threshold
    server_key: str | None = None  # the server telemetry the production watch compares it with
    needs_latency_slo: bool = False  # counts requests that meet the latency SLOs
    streamed_only: bool = False  # measured only on streamed responses


_ROWS = [
    Metric("request_throughput", "req/s", "higher", LOADGEN, "completed requests per second"),
    Metric("output_throughput", "tok/s", "higher", LOADGEN, "generated tokens per second"),
    Metric("total_token_throughput", "tok/s", "higher", LOADGEN, "prompt and generated tokens per second"),
    Metric("max_output_tokens_per_s", "tok/s", "higher", LOADGEN, "peak generated tokens in a 1-s bucket"),
    Metric("request_goodput", "req/s", "higher", LOADGEN, "requests per second that meet every latency SLO",
           needs_latency_slo=True),
    Metric("goodput_fraction", "fraction", "higher", LOADGEN, "share of requests that meet every latency SLO",
           needs_latency_slo=True),
    Metric("error_rate", "fraction", "lower", LOADGEN, "failed requests / measured requests"),
    Metric("completed", "requests", "higher", LOADGEN, "measured requests that completed"),
    Metric("failed", "requests", "lower", LOADGEN, "measured requests that failed"),
    Metric("duration", "s", "none", LOADGEN, "first measured send to last completion"),
    Metric("total_input_tokens", "tokens", "none", LOADGEN, "prompt tokens of completed requests"),
    Metric("total_output_tokens", "tokens", "none", LOADGEN, "generated tokens of completed requests"),
    Metric("prompt_tokens_exact", "0/1", "none", LOADGEN, "1 when every prompt had its exact token count"),
    *[Metric(f"errors_{k}", "requests", "lower", LOADGEN, f"failed requests of kind {k}") for k in ERROR_KINDS],
    Metric("ttft_ms", "ms", "lower", LOADGEN, "time to first token", latency=True, goodput_key="ttft",
           server_key="server_ttft_ms", streamed_only=True),
    Metric("tpot_ms", "ms", "lower", LOADGEN, "time per output token after the first", latency=True,
           goodput_key="tpot", streamed_only=True),
    Metric("itl_ms", "ms", "lower", LOADGEN, "inter-token latency", latency=True, goodput_key="tpot",
           server_key="server_itl_ms", streamed_only=True),
    Metric("e2el_ms", "ms", "lower", LOADGEN, "end-to-end request latency", latency=True, goodput_key="e2el",
           server_key="server_e2el_ms"),
    Metric("cold_start_s", "s", "lower", DEPLOYMENT, "start of the deployment until it served"),
    Metric("max_rate_under_slo", "req/s", "higher", CAPACITY, "highest open-loop request rate at which the "
           "configuration meets every upper-bound SLO (an objective only: a bounded capacity search per trial)"),
    Metric("server_kv_cache_usage_frac", "fraction", "none", SERVER, "mean KV-cache usage during the run"),
    Metric("server_kv_cache_usage_frac_max", "fraction", "none", SERVER, "peak KV-cache usage"),
    Metric("server_num_requests_running_max", "requests", "none", SERVER, "peak running requests"),
    Metric("server_num_requests_waiting_max", "requests", "lower", SERVER, "peak queued requests"),
    Metric("server_preemptions", "count", "lower", SERVER, "preemptions during the run"),
    Metric("server_prompt_tokens", "tokens", "none", SERVER, "prompt tokens the server counted"),
    Metric("server_generation_tokens", "tokens", "none", SERVER, "generated tokens the server counted"),
    Metric("server_request_success", "requests", "none", SERVER, "requests the server finished"),
    Metric("server_prefix_cache_hit_rate", "fraction", "higher", SERVER, "prefix-cache hits / queries"),
    *[Metric(f"server_{m}_ms_{s}", "ms", "lower", SERVER, f"{m} from the server's histogram ({s})")
      for m in ("ttft", "itl") for s in ("mean", "p50", "p90", "p99")],
    *[Metric(f"server_{m}_ms_{s}", "ms", "lower", SERVER, f"{m} from the server's histogram ({s})")
      for m in ("e2el", "queue_time") for s in ("mean", "p99")],
]

CATALOG: dict[str, Metric] = {m.name: m for m in _ROWS}

# families: target-specific telemetry, any name with the prefix
FAMILIES: dict[str, Metric] = {
    "gpu_": Metric("gpu_*", "(in the name)", "none", "NVML",
                   "GPU utilisation, memory, power, clocks, throttling, energy"),
    "sim_": Metric("sim_*", "(in the name)", "none", "simulator", "the simulated engine's internals"),
}


def split(name: str) -> tuple[str, str | None]:
    """`ttft_ms.p99` -> (`ttft_ms`, `p99`); `error_rate` -> (`error_rate`, None)."""
    base, _, stat = name.partition(".")
    return base, (stat or None)


def lookup(name: str) -> Metric | None:
    """The catalog row of a spec metric name (a latency with its statistic), or None if unknown."""
    base, stat = split(name)
    row = CATALOG.get(base)
    if row is not None:
        if row.latency:
            return row if stat in LATENCY_STATS else None
        return row if stat is None else None
    if stat is None:
        for prefix, fam in FAMILIES.items():
            if base.startswith(prefix) and len(base) > len(prefix):
                return fam
    return None


def names() -> list[str]:
    """Every spec name the catalog accepts, latencies with each statistic (families left out)."""
    out: list[str] = []
    for m in _ROWS:
        out += [f"{m.name}.{s}" for s in LATENCY_STATS] if m.latency else [m.name]
    return out


def unknown_message(name: str) -> str | None:
    """None when `name` is a known metric, else `unknown metric 'x'` with the nearest spelling."""
    if lookup(name) is not None:
        return None
    base, stat = split(name)
    row = CATALOG.get(base)
    if row is not None and row.latency:
        return (f"{base} needs a statistic: {base}.<stat> with <stat> one of {', '.join(LATENCY_STATS)}"
                + (f" (got {stat!r})" if stat else ""))
    if row is not None:
        return f"{base} takes no statistic (got {name!r})"
    near = difflib.get_close_matches(name, names(), n=1, cutoff=0.6)
    hint = f" (did you mean {near[0]!r}?)" if near else " (`tuner metrics` lists them)"
    return f"unknown metric {name!r}{hint}"


def is_latency(name: str) -> bool:
    row = lookup(name)
    return row is not None and row.latency


def goodput_key(name: str) -> str | None:
    """The per-request goodput threshold a max SLO on `name` sets (ttft, tpot or e2el), if any."""
    row = lookup(name)
    return row.goodput_key if row is not None else None


def server_key(name: str) -> str | None:
    """The server telemetry key the watch compares an SLO on `name` with (`ttft_ms.p99` -> server_ttft_ms_p99)."""
    row = lookup(name)
    _, stat = split(name)
    if row is None or row.server_key is None or stat is None:
        return None
    key = f"{row.server_key}_{stat}"
    return key if key in CATALOG else None


def summary_key(name: str) -> str:
    """The key of a measurement's summary for a spec name: `ttft_ms.p99` -> `p99_ttft_ms`; plain names pass."""
    base, stat = split(name)
    if stat is None:
        return name
    return f"{stat}_{base}"
