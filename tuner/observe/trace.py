"""Request logs and traces: read the common public formats, then fit them or replay them exactly.

Formats (detected from the CSV header or the first JSON object's keys, or named):
- `azure`: the Azure LLM inference trace CSV, `TIMESTAMP,ContextTokens,GeneratedTokens` (datetimes, UTC);
- `burstgpt`: BurstGPT's CSV, `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type` (seconds
  from the trace's start; failed requests, with 0 response tokens, are skipped and counted);
- `mooncake`: Mooncake's JSONL, `{"timestamp": ms, "input_length": N, "output_length": M, "hash_ids": [...]}`
  (the hash ids of 512-token blocks give the prefix-cache hit rate of an unbounded cache);
- `tuner`: the tuner's own trace JSONL, `{"timestamp": s, "prompt_tokens": N, "output_tokens": M}`
  (`timestamp_ms` also), which `workload.arrival.kind: trace` replays.
A bad row is an ObservationError naming the file, the line, the column and the rule.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from tuner.errors import ObservationError
from tuner.observe.fit import fit_arrival, fit_lengths
from tuner.observe.model import LengthHist, ObservedWorkload
from tuner.spec import Arrival, LengthDist, WorkloadSpec

FORMATS = ("auto", "azure", "burstgpt", "mooncake", "tuner")
MAX_BOUNDS = 200  # length histograms of a trace: at most this many bounds (quantiles past that)


@dataclass(frozen=True)
class TraceRequest:
    t_s: float
    prompt_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] | None = None


# format -> (time column, its unit: "s", "ms" or "datetime"; prompt column; output column)
_CSV = {"azure": ("TIMESTAMP", "datetime", "ContextTokens", "GeneratedTokens"),
        "burstgpt": ("Timestamp", "s", "Request tokens", "Response tokens")}
_JSON = {"mooncake": ("timestamp", "ms", "input_length", "output_length"),
         "tuner": ("timestamp", "s", "prompt_tokens", "output_tokens")}


def detect_format(path: Path) -> str:
    """The format of `path` from its first non-empty line (a CSV header or a JSON object's keys)."""
    first = ""
    with _open(path) as f:
        for line in f:
            if line.strip():
                first = line.strip()
                break
    if not first:
        raise ObservationError("the trace is empty", file=str(path))
    if first.startswith("{"):
        try:
            keys = set(json.loads(first))
        except (json.JSONDecodeError, TypeError):
            raise ObservationError("the first line is not a JSON object", file=str(path), line=1) from None
        if "input_length" in keys:
            return "mooncake"
        if "prompt_tokens" in keys:
            return "tuner"
        raise ObservationError(f"JSON keys {sorted(keys)} match no known trace format: expected Mooncake's "
                               "input_length/output_length or the tuner's prompt_tokens/output_tokens "
                               f"(or pass the format: {', '.join(FORMATS[1:])})", file=str(path), line=1)
    header = [c.strip() for c in next(csv.reader([first]))]
    for name, (t_col, _, p_col, o_col) in _CSV.items():
        if {t_col, p_col, o_col} <= set(header):
            return name
    raise ObservationError(f"CSV header {header} matches no known trace format: expected the Azure trace's "
                           "TIMESTAMP,ContextTokens,GeneratedTokens or BurstGPT's Timestamp,Request tokens,"
                           "Response tokens", file=str(path), line=1)


def _open(path: Path) -> Any:
    try:
        return path.open(encoding="utf-8", newline="")
    except OSError as exc:
        raise ObservationError(f"cannot read the trace: {exc.strerror or exc}", file=str(path)) from None


_FRACTION = re.compile(r"(\.\d{6})\d+")


def _time(value: Any, unit: str, where: dict[str, Any]) -> float:
    try:
        t = float(value)
    except (TypeError, ValueError):
        if unit != "datetime" or not isinstance(value, str):
            raise ObservationError(f"{value!r} is not a number of {'milliseconds' if unit == 'ms' else 'seconds'}",
                                   **where) from None
        try:
            dt = datetime.fromisoformat(_FRACTION.sub(r"\1", value.strip()))
        except ValueError:
            raise ObservationError(f"{value!r} is not a date and time (expected e.g. 2023-11-16 18:15:46.680)",
                                   **where) from None
        return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()
    if not math.isfinite(t) or t < 0:
        raise ObservationError(f"{value!r}: a timestamp must be a finite number >= 0", **where)
    return t / 1000.0 if unit == "ms" else t


def _tokens(value: Any, where: dict[str, Any]) -> int:
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ObservationError(f"{value!r} is not a token count", **where) from None
    if not math.isfinite(f) or f < 0 or f != int(f):
        raise ObservationError(f"{value!r}: a token count must be a whole number >= 0", **where)
    return int(f)


def _csv_rows(path: Path, fmt: str) -> Iterator[tuple[int, dict[str, Any]]]:
    with _open(path) as f:
        reader = csv.DictReader(f, skipinitialspace=True)
        if reader.fieldnames is None:
            return
        reader.fieldnames = [c.strip() for c in reader.fieldnames]
        need = set(_CSV[fmt][0:1] + _CSV[fmt][2:])
        missing = need - set(reader.fieldnames)
        if missing:
            raise ObservationError(f"the {fmt} format needs the columns {sorted(need)}; missing {sorted(missing)}",
                                   file=str(path), line=1)
        for row in reader:
            if None in row:
                raise ObservationError(f"more fields than the header's {len(reader.fieldnames)}",
                                       file=str(path), line=reader.line_num)
            yield reader.line_num, row


def _json_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with _open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ObservationError(f"not a JSON object: {exc.msg}", file=str(path), line=i) from None
            if not isinstance(d, dict):
                raise ObservationError("each line must be a JSON object", file=str(path), line=i)
            yield i, d


def read_trace(path: Path, fmt: str = "auto") -> tuple[list[TraceRequest], str, list[str]]:
    """The requests of a trace (sorted by time), its format, and notes (rows skipped and why)."""
    if fmt not in FORMATS:
        raise ObservationError(f"format {fmt!r}: must be one of {', '.join(FORMATS)}")
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt in _CSV:
        t_col, unit, p_col, o_col = _CSV[fmt]
        rows = _csv_rows(path, fmt)
    else:
        t_col, unit, p_col, o_col = _JSON[fmt]
        rows = _json_rows(path)
    out: list[TraceRequest] = []
    skipped = 0
    for line, d in rows:
        def where(col: str, line: int = line) -> dict[str, Any]:
            return {"file": str(path), "line": line, "field": col}

        if fmt == "tuner" and t_col not in d and "timestamp_ms" in d:
            t = _time(d["timestamp_ms"], "ms", where("timestamp_ms"))
        elif t_col not in d or d[t_col] in (None, ""):
            raise ObservationError("missing (every row needs a time)", **where(t_col))
        else:
            t = _time(d[t_col], unit, where(t_col))
        vals = []
        for col in (p_col, o_col):
            if col not in d or d[col] in (None, ""):
                raise ObservationError("missing (every row needs both token counts)", **where(col))
            vals.append(_tokens(d[col], where(col)))
        hashes = d.get("hash_ids")
        if hashes is not None and not (isinstance(hashes, list) and all(isinstance(h, int) for h in hashes)):
            raise ObservationError("must be a list of integers", **where("hash_ids"))
        if vals[0] == 0 or vals[1] == 0:  # a failed or empty request: nothing a trial could send
            skipped += 1
            continue
        out.append(TraceRequest(t, vals[0], vals[1], tuple(hashes) if hashes is not None else None))
    notes = [f"skipped {skipped} rows with 0 prompt or output tokens (failed requests)"] if skipped else []
    if not out:
        raise ObservationError("the trace has no request with prompt and output tokens", file=str(path))
    out.sort(key=lambda r: r.t_s)
    return out, fmt, notes


def sample_hist(values: np.ndarray) -> LengthHist:
    """A LengthHist of exact samples: every distinct value a bound (quantiles past MAX_BOUNDS), then +Inf."""
    v = np.sort(values.astype(float))
    bounds = np.unique(v)
    if len(bounds) > MAX_BOUNDS:
        bounds = np.unique(np.quantile(v, np.linspace(0, 1, MAX_BOUNDS)))
    cum = np.searchsorted(v, bounds, side="right").astype(float)
    return LengthHist(bounds=[*bounds.tolist(), math.inf], cum=[*cum.tolist(), float(len(v))],
                      sum=float(v.sum()), count=float(len(v)))


def prefix_hit_rate(reqs: list[TraceRequest]) -> float | None:
    """Share of the block hashes already seen earlier in the trace (an unbounded prefix cache)."""
    if not any(r.hash_ids for r in reqs):
        return None
    seen: set[int] = set()
    hits = total = 0
    for r in reqs:
        for h in r.hash_ids or ():
            total += 1
            hits += h in seen
            seen.add(h)
    return hits / total if total else None


def observe_trace(path: Path, fmt: str = "auto", *, replay: bool = False, arrival: str = "auto",
                  limit: int | None = None) -> ObservedWorkload:
    """Fit the trace at `path` (rate, burstiness, length distributions) or, with `replay`, a workload that
    replays its exact arrivals and lengths (its requests in `ObservedWorkload.replay`; `save` writes them)."""
    reqs, fmt, notes = read_trace(path, fmt)
    if limit is not None:
        reqs = reqs[:limit]
    t = np.array([r.t_s for r in reqs])
    p = np.array([r.prompt_tokens for r in reqs])
    o = np.array([r.output_tokens for r in reqs])
    n = len(reqs)
    span = float(t[-1] - t[0])
    stats: dict[str, float] = {"requests": float(n), "window_s": span}
    disp = None
    if n >= 2 and span > 0:
        gaps = np.diff(t)
        stats["rate_per_s"] = (n - 1) / span
        disp = float(np.var(gaps) / np.mean(gaps) ** 2)
        stats["burstiness"] = disp
    for name, v in (("prompt_tokens", p), ("output_tokens", o)):
        stats |= {f"{name}_mean": float(v.mean()), f"{name}_p50": float(np.percentile(v, 50)),
                  f"{name}_p90": float(np.percentile(v, 90))}
    hit = prefix_hit_rate(reqs)
    if hit is not None:
        stats["prefix_cache_hit_rate"] = hit
        notes.append("prefix_cache_hit_rate: share of hash_ids blocks seen before (an unbounded cache)")
    src = f"trace {path.name} ({fmt})"
    start, end = float(t[0]), float(t[-1])
    if fmt != "azure":
        notes.append(f"the {fmt} format's times are relative: start_s/end_s are seconds from the trace's start")
    if replay:
        rows = [(float(ti - t[0]), int(pi), int(oi)) for ti, pi, oi in zip(t, p, o, strict=True)]
        wl = WorkloadSpec(arrival=Arrival(kind="trace", trace=path.stem + ".trace.jsonl"),
                          prompt_tokens=LengthDist(dist="fixed", value=int(np.rint(p.mean()))),
                          output_tokens=LengthDist(dist="fixed", value=int(np.rint(o.mean()))), num_requests=n)
        notes.append("exact replay: the arrivals and lengths of the trace's requests")
        return ObservedWorkload(wl, start, end, src, stats, {}, notes, replay=rows)
    if "rate_per_s" not in stats:
        raise ObservationError("a fit needs at least two requests at different times (or replay it)",
                               file=str(path))
    arr, err, a_notes = fit_arrival(stats["rate_per_s"], disp, [], kind=arrival)
    notes += a_notes
    notes.append("burstiness: squared coefficient of variation of the gaps between arrivals (1 = Poisson)")
    p_dist, p_err = fit_lengths(sample_hist(p), "prompt_tokens", lo=int(p.min()), hi=int(p.max()))
    o_dist, o_err = fit_lengths(sample_hist(o), "output_tokens", lo=int(o.min()), hi=int(o.max()))
    wl = WorkloadSpec(arrival=arr, prompt_tokens=p_dist, output_tokens=o_dist, num_requests=n)
    return ObservedWorkload(wl, start, end, src, stats, err | p_err | o_err, notes)
