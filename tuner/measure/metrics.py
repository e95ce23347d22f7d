"""Summaries of per-request records, with the key names of `vllm bench serve`.

The same code summarises the real load generator's records and the simulator's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

import numpy as np

from tuner import catalog
from tuner.measure.records import ERROR_KINDS, RequestRecord

PERCENTILES = (50, 90, 95, 99)
LATENCY_METRICS = tuple(m.name.removesuffix("_ms") for m in catalog.CATALOG.values() if m.latency)
# goodput thresholds accepted, as in `vllm bench serve --goodput ttft:<ms> tpot:<ms> e2el:<ms>`
GOODPUT_KEYS = ("ttft", "tpot", "e2el")


def _stats(prefix: str, values: list[float], out: dict[str, float]) -> None:
    if values:
        arr = np.asarray(values, dtype=float)
        out[f"mean_{prefix}_ms"] = float(arr.mean())
        out[f"median_{prefix}_ms"] = float(np.median(arr))
        out[f"std_{prefix}_ms"] = float(arr.std())
        for p in PERCENTILES:
            out[f"p{p}_{prefix}_ms"] = float(np.percentile(arr, p))
    else:
        for k in ("mean", "median", "std"):
            out[f"{k}_{prefix}_ms"] = float("nan")
        for p in PERCENTILES:
            out[f"p{p}_{prefix}_ms"] = float("nan")


def is_good(rec: RequestRecord, goodput_ms: Mapping[str, float]) -> bool:
    """A completed request is good when every given SLO holds (TPOT counts as 0 for <= 1 token)."""
    if not rec.ok:
        return False
    for key, limit in goodput_ms.items():
        if key == "ttft":
            value = rec.ttft_ms
        elif key == "tpot":
            value = rec.tpot_ms if rec.tpot_ms is not None else 0.0
        elif key == "e2el":
            value = rec.e2el_ms
        else:
            raise ValueError(f"unknown goodput key {key!r}; valid: {', '.join(GOODPUT_KEYS)}")
        if value is None or value > limit:
            return False
    return True


def summarise(
    records: Iterable[RequestRecord],
    *,
    goodput_ms: Mapping[str, float] | None = None,
    duration_s: float | None = None,
) -> dict[str, float]:
    """Summarise the measured (non-warm-up) records.

    `duration` is from the first measured request's send to the last one's completion unless given.
    """
    recs = [r for r in records if not r.warmup]
    ok = [r for r in recs if r.ok]
    out: dict[str, float] = {}
    if duration_s is None:
        if recs:
            duration_s = max(r.done_s for r in recs) - min(r.sent_s for r in recs)
        else:
            duration_s = 0.0
    dur = max(duration_s, 1e-9)
    total_in = sum(r.prompt_tokens for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    out["duration"] = float(duration_s)
    out["completed"] = float(len(ok))
    out["failed"] = float(len(recs) - len(ok))
    out["total_input_tokens"] = float(total_in)
    out["total_output_tokens"] = float(total_out)
    out["request_throughput"] = len(ok) / dur
    out["output_throughput"] = total_out / dur
    out["total_token_throughput"] = (total_in + total_out) / dur
    out["error_rate"] = (len(recs) - len(ok)) / len(recs) if recs else 0.0
    kinds = Counter(r.error for r in recs if r.error is not None)
    for kind in ERROR_KINDS:
        out[f"errors_{kind}"] = float(kinds.get(kind, 0))
    if goodput_ms:
        good = sum(1 for r in ok if is_good(r, goodput_ms))
        out["request_goodput"] = good / dur
        out["goodput_fraction"] = good / len(recs) if recs else 0.0
    _stats("ttft", [r.ttft_ms for r in ok if r.ttft_ms is not None], out)
    _stats("tpot", [t for r in ok if (t := r.tpot_ms) is not None], out)
    _stats("itl", [x for r in ok for x in r.itls_ms], out)
    _stats("e2el", [r.e2el_ms for r in ok], out)
    # peak output tokens per second over 1-s buckets, as vllm's max_output_tokens_per_s
    times = [t for r in ok for t in r.token_times_s]
    if times:
        t0 = min(times)
        counts = np.bincount(np.floor(np.asarray(times) - t0).astype(int))
        out["max_output_tokens_per_s"] = float(counts.max())
    else:
        out["max_output_tokens_per_s"] = 0.0
    out["prompt_tokens_exact"] = float(all(r.prompt_tokens_exact for r in recs)) if recs else 1.0
    # how the latencies were measured: streamed (TTFT/TPOT/ITL measured) or not; chunks of several tokens
    out["streamed"] = float(all(r.streamed for r in recs)) if recs else 1.0
    out["multi_token_chunks"] = float(sum(r.multi_token_chunks for r in ok))
    out["streams_without_done"] = float(sum(1 for r in ok if r.stream_end == "eof_after_finish"))
    return out


def offered_rate_per_s(records: Iterable[RequestRecord]) -> float | None:
    """The request rate the measured (non-warm-up) requests were scheduled at, from their scheduled times; None
    with fewer than two or no time between them."""
    s = sorted(r.scheduled_s for r in records if not r.warmup)
    if len(s) > 1 and s[-1] > s[0]:
        return (len(s) - 1) / (s[-1] - s[0])
    return None


def first_errors(records: Iterable[RequestRecord]) -> dict[str, tuple[int, str]]:
    """Each error kind of the measured requests: (how many, the first one's detail)."""
    out: dict[str, tuple[int, str]] = {}
    for r in records:
        if r.warmup or r.error is None:
            continue
        n, detail = out.get(r.error, (0, r.error_detail))
        out[r.error] = (n + 1, detail)
    return out


def prompt_length_check(records: Iterable[RequestRecord], *, tolerance: float = 0.10) -> str | None:
    """A warning when the server counted the prompts more than `tolerance` away from what was asked
    (only for requests whose length was not exact on the client side and that the server reported)."""
    pairs = [(r.requested_prompt_tokens, r.prompt_tokens) for r in records
             if r.ok and not r.warmup and r.requested_prompt_tokens and r.prompt_tokens_exact]
    if not pairs:
        return None
    asked = float(np.median([a for a, _ in pairs]))
    got = float(np.median([g for _, g in pairs]))
    if asked > 0 and abs(got - asked) / asked > tolerance:
        return (f"prompt length mismatch: asked for {asked:.0f} prompt tokens (median), the server counted "
                f"{got:.0f} ({got / asked:.2f}x); give --tokenizer (the server's tokenizer directory) for exact "
                "prompt lengths")
    return None


def metric_key(name: str) -> str:
    """Map a spec metric name to a summary key: `ttft_ms.p99` -> `p99_ttft_ms`, `e2el_ms.mean` -> ...

    Plain keys (`request_throughput`, `error_rate`, `cold_start_s`, ...) pass through; a statistic of a name
    that the metric catalog (tuner.catalog) does not know as a latency is a ValueError.
    """
    if "." in name and (msg := catalog.unknown_message(name)) is not None:
        raise ValueError(f"metric {name!r}: {msg}")
    return catalog.summary_key(name)
