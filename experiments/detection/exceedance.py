"""What a latency histogram's share of requests above a fixed bucket edge says of a slowdown, against the log ITL
mean and the interpolated quantiles the monitor judges.

A quantile interpolated inside a histogram bucket (vLLM's TTFT edges 10, 20, 40 ms, its end-to-end ones 100, 300
ms) moves little while it stays in its bucket and jumps when it crosses an edge, and the monitor widens its scale
there (SignalTrack.bucket_error): vllm27's TTFT p90 went 19 -> 31 ms in its slowdown's windows (z +7 on its
calm spread) and its CUSUM never moved. The share of a window's requests above a fixed edge is read from the
bucket counts exactly, with no interpolation: its noise is a count's (binomial, or burstier), and a slowdown moves
it wherever the latencies sit around that edge.

For each stream's calm windows (its stationary phase less its first --cut windows) and its recorded +30 % slowdown
(phase slowdown30), each on the arcsine-square-root scale (a proportion's variance-stabilising one) per edge of the
TTFT, ITL and end-to-end histograms: the calm spread sigma, lag-1 rho and the slowdown's median shift delta over
sigma; the edge chosen from the calm windows alone (the one whose calm share is nearest 0.5: a threshold at the
median keeps the most of a location shift, 2 / pi of it) and the best edge over all (chosen knowing the slowdown:
an upper bound). Beside them the raw log ITL mean's and the interpolated quantiles' delta / sigma (neither
corrected for the CPU wait nor the host's speed; the fractions are not either).

    python experiments/detection/exceedance.py vllm27=recorded-vllm-open4-uni1.jsonl.gz ...
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import run  # noqa: E402

from tuner.measure.scrape import Hist, Snapshot, histogram_quantile, parse, window_buckets  # noqa: E402
from tuner.monitor.detect import lag1  # noqa: E402

HISTS = ("ttft_ms", "itl_ms", "e2el_ms")
QUANTILES = {"ttft_ms": (0.5, 0.9), "itl_ms": (0.9,), "e2el_ms": (0.5, 0.9)}
MIN_SHARE = 0.02  # an edge whose calm share above it is below this (or above 1 - it) is left out
CALM = "stationary"
SLOW = "slowdown30"


def deltas(before: Snapshot, after: Snapshot, key: str) -> tuple[dict[float, float], float, float] | None:
    """A histogram's window: upper bound -> cumulative count, its count and its sum (None without a request)."""
    h, b = after.hists.get(key), before.hists.get(key, Hist())
    if h is None or h.count - b.count <= 0:
        return None
    return window_buckets(b, h), h.count - b.count, h.sum - b.sum


def stream_windows(path: Path) -> Iterator[tuple[str, dict[str, float]]]:
    """(phase, values) of each window: `<hist>@<edge>` the share above that edge (arcsine square root),
    `<hist>_p<q>` the interpolated quantile (log), `itl_ms_mean` (log)."""
    rows = run.read_rows(path)
    for a, b in zip(rows, rows[1:], strict=False):
        if a["phase"] != b["phase"] and not b.get("starts_phase"):
            continue
        sa, sb = parse(a["text"]), parse(b["text"])
        out: dict[str, float] = {}
        for key in HISTS:
            got = deltas(sa, sb, key)
            if got is None:
                continue
            cum, n, total = got
            for le, c in cum.items():
                if math.isfinite(le):
                    out[f"{key}@{le * 1000:g}"] = math.asin(math.sqrt(min(max(1.0 - c / n, 0.0), 1.0)))
            for q in QUANTILES[key]:
                v = histogram_quantile(q, cum)
                if v > 0 and math.isfinite(v):
                    out[f"{key}_p{round(q * 100)}"] = math.log(v)
            if key == "itl_ms" and total > 0:
                out["itl_ms_mean"] = math.log(total / n)
        yield b["phase"], out


def judge(calm: list[dict[str, float]], slow: list[dict[str, float]], name: str) -> tuple[float, float, float] | None:
    """(sigma, rho, delta / sigma) of one signal, None where it is missing or constant."""
    c = [w[name] for w in calm if name in w]
    s = [w[name] for w in slow if name in w]
    if len(c) < 10 or len(s) < 3:
        return None
    sd = statistics.stdev(c)
    if sd <= 0:
        return None
    return sd, lag1(c) or 0.0, (statistics.median(s) - statistics.median(c)) / sd


def share(x: float) -> float:
    return math.sin(x) ** 2


def rows_of(label: str, path: Path, cut: int) -> list[str]:
    calm: list[dict[str, float]] = []
    slow: list[dict[str, float]] = []
    seen: dict[str, int] = {}
    for phase, w in stream_windows(path):
        if phase.startswith(CALM):
            seen[phase] = seen.get(phase, 0) + 1
            if seen[phase] > cut:
                calm.append(w)
        elif phase == SLOW:
            slow.append(w)
    if not calm or not slow:
        return [f"| {label} | (no {CALM}* or {SLOW} phase) |" + " |" * 8]

    def cell(name: str) -> str:
        return fmt(judge(calm, slow, name))

    def quants(key: str) -> str:
        return " ".join(f"p{round(q * 100)} {cell(f'{key}_p{round(q * 100)}')}" for q in QUANTILES[key])

    itl = cell("itl_ms_mean")
    out = []
    for key in HISTS:
        edges = sorted({n for w in calm for n in w if n.startswith(f"{key}@")}, key=lambda n: float(n.split("@")[1]))
        usable = {}
        for n in edges:
            p = statistics.fmean(share(w[n]) for w in calm if n in w)
            if MIN_SHARE <= p <= 1 - MIN_SHARE:
                usable[n] = p
        if not usable:
            out.append(f"| {label} | {key} | - | - | - | - | {itl} | {quants(key)} |")
            continue
        chosen = min(usable, key=lambda n: abs(usable[n] - 0.5))
        judged = {n: judge(calm, slow, n) for n in usable}
        best = max((n for n in judged if judged[n] is not None), key=lambda n: judged[n][2],  # type: ignore[index]
                   default=None)
        p1 = statistics.median(share(w[chosen]) for w in slow if chosen in w)
        out.append(f"| {label} | {key} | {edge_ms(chosen)} ms: {usable[chosen]:.2f} -> {p1:.2f} | "
                   f"{fmt(judged[chosen])} | {'-' if best is None else edge_ms(best) + ' ms'} | "
                   f"{fmt(None if best is None else judged[best])} | {itl} | {quants(key)} |")
    return out


def fmt(got: tuple[float, float, float] | None) -> str:
    """A judged signal's cell: its shift over its calm spread and its lag-1 ('-' where not judged)."""
    return "-" if got is None else f"{got[2]:+.2f} (rho {got[1]:+.2f})"


def edge_ms(name: str) -> str:
    return name.split("@")[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("streams", nargs="+", metavar="LABEL=PATH", help="recorded streams (record_vllm.py / record.py)")
    ap.add_argument("--cut", type=int, default=5, help="calm windows left out at each stationary phase's start")
    args = ap.parse_args()
    print("| stream | histogram | edge chosen from the calm windows: its share above, calm -> slowdown | "
          "its shift / sigma | best edge (knowing the slowdown) | its shift / sigma | log ITL mean's | "
          "interpolated quantiles' |")
    print("|---|---|---|---:|---|---:|---:|---|")
    for item in args.streams:
        label, _, path = item.rpartition("=")
        p = Path(path)
        if not p.is_file():
            raise SystemExit(f"exceedance.py: {path}: no such recorded stream")
        for line in rows_of(label or p.stem, p, args.cut):
            print(line)


if __name__ == "__main__":
    main()
