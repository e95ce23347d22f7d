"""How the log ITL mean's residual spreads with the server's wait, against the error the monitor puts on it (the
nineteenth step).

Per stream's stationary phases (after run.py's warm-up cut), watched by the shipped monitor from its first steady
window: every window's log ITL-mean residual (over the expectation, corrected for the CPU wait by the wait law)
and its stretch log 1 / (1 - w) (w the share the law takes); the windows grouped by how far their stretch is from
the stream's median one (the usual wait); per group the residuals' sd around the stream's median residual, their
mean offset, and what the monitor puts on a window there: the share's error wait_error / (1 - w) (median) and
the law's, wait_law_error times the distance. Where the residuals near the usual wait spread less than the
share's error alone, that error is already in the learnt scale and counting it again in full is double.

    python experiments/detection/wait_spread.py [LABEL=PATH ...]   (default: the busy and vLLM streams)
"""

from __future__ import annotations

import logging
import math
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

import run  # noqa: E402

from tuner.monitor.classify import Monitor  # noqa: E402
from tuner.monitor.config import MonitorConfig  # noqa: E402

DEFAULT = ["busy=recorded2.jsonl.gz", "busy3=recorded-busy3.jsonl.gz",
           "busy4=recorded-busy4.jsonl.gz", "vllm=recorded-vllm.jsonl.gz", "vllm2=recorded-vllm-rate2.jsonl.gz",
           "vllm3=recorded-vllm-rate3.jsonl.gz"]
BANDS = [(0.0, 0.1), (0.1, 0.2), (0.2, 0.4), (0.4, math.inf)]  # distance of the stretch from the usual one


def points(windows: list[run.Window], cfg: MonitorConfig,
           expect: run.ChampionExpectation | None) -> list[tuple[float, float]]:
    """(log ITL-mean residual, stretch) of each window the monitor corrected for a wait."""
    m = Monitor(cfg, expect)
    out = []
    for i, w in enumerate(windows):
        t = cfg.interval_s * i
        m.observe(t, w)
        if t in m._stretch and "itl_ms_mean" in m.last_signals:  # the stretch the monitor kept for the window
            out.append((math.log(m.tracks["itl_ms_mean"].residuals[-1]), m._stretch[t]))
    return out


def main() -> None:
    logging.getLogger("tuner.monitor").setLevel(logging.ERROR)  # a noisy baseline's warning says nothing here
    expect = run.expectation(HERE.parent / "sim-calibration" / "model-cpu.json")
    print("| stream | windows | usual wait (the law's share) | sd, all | distance from the usual stretch | windows "
          "| sd | mean offset | the share's error put on them (median) | the law's (median) |")
    print("|---|---:|---:|---:|---|---:|---:|---:|---:|---:|")
    for arg in sys.argv[1:] or DEFAULT:
        label, _, path = arg.rpartition("=")
        phases, _ = run.load(HERE / path)
        cfg = MonitorConfig(interval_s=15.0)
        for name in [n for n in phases if n.startswith("stationary")]:
            windows = [w for _, w in phases[name]]
            windows = windows[run.warmup(windows, cfg, expect):]
            row(f"{label}/{name}", points(windows, cfg, expect), cfg)


def row(name: str, pts: list[tuple[float, float]], cfg: MonitorConfig) -> None:
    """A stream's rows: one per band of distance from its usual stretch that holds at least 4 windows."""
    centre = statistics.median(y for y, _ in pts)
    usual = statistics.median(s for _, s in pts)
    first = True
    for lo, hi in BANDS:
        band = [(y, s) for y, s in pts if lo <= abs(s - usual) < hi]
        if len(band) < 4:
            continue
        head = (f"{name} | {len(pts)} | {1 - math.exp(-usual):.2f} | {statistics.pstdev(y for y, _ in pts):.3f}"
                if first else " | | |")
        first = False
        print(f"| {head} | {lo:g}-{hi:g} | {len(band)} | {statistics.pstdev(y for y, _ in band):.3f} | "
              f"{statistics.fmean(y for y, _ in band) - centre:+.3f} | "
              f"{statistics.median(cfg.wait_error * math.exp(s) for _, s in band):.3f} | "
              f"{statistics.median(cfg.wait_law_error * abs(s - usual) for _, s in band):.3f} |")

if __name__ == "__main__":
    main()
