"""The request rate's false alarms on Poisson arrivals: what the monitor's rate test does on a load whose windows
are what a Poisson process gives, at the recorded streams' rates and window lengths, against what the window-by-window
bootstrap of a short recording gives (its tail windows drawn once in every few dozen windows).

    python experiments/detection/poisson_rate.py [--hours 1200] [--streams recorded-h200.jsonl.gz ...]

Per case and way of learning the rate's spread (VARIANTS: MonitorConfig.rate_poisson_floor, input_confidence):
`Monitor` fed the rate alone (arrivals in a window ~ Poisson(rate x window) / window), streams of --stream-hours
each learning its own baseline, drift events counted; the budget is the rate test's share of one false alarm a day
(1 / TESTS). Then, per recorded stream, its steady-state rate windows: how far its largest window is in the Poisson
spread and how often a Poisson process gives a window that far (per day at its window length), against how often
the bootstrap draws it (once in as many windows as the stream has).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from scipy.stats import poisson

from tuner.monitor.classify import Monitor
from tuner.monitor.config import TESTS, MonitorConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run  # noqa: E402

SECONDS_PER_DAY = 86400.0
# (requests per second, window seconds): the H200 streams' rates at 4-s windows, the CPU streams' at 15-s ones
CASES = ((24.5, 4.0), (16.0, 4.0), (10.0, 4.0), (2.0, 15.0), (4.0, 15.0))


# how the rate's spread is learnt: (label, MonitorConfig.rate_poisson_floor, MonitorConfig.input_confidence)
VARIANTS = (("20 windows' spread, upper 0.9 bound (shipped)", False, 0.9),
            ("the same, at least the Poisson spread", True, 0.9),
            ("20 windows' spread, upper 0.99 bound", False, 0.99),
            ("at least the Poisson spread, upper 0.95 bound", True, 0.95))


def poisson_false_alarms(rate: float, window_s: float, hours: float, stream_hours: float, seed: int,
                         floor: bool, confidence: float) -> int:
    """The drift events over `hours` of Poisson arrivals at `rate` in windows of `window_s`, in streams of
    `stream_hours` each learning its own baseline, the rate's spread learnt at its upper `confidence` bound, at
    least the Poisson one where `floor`."""
    cfg = MonitorConfig(interval_s=window_s, input_confidence=confidence, rate_poisson_floor=floor)
    rng = np.random.default_rng(seed)
    n = int(stream_hours * 3600 / window_s) + cfg.learn_windows
    events = 0
    for _ in range(max(1, round(hours / stream_hours))):
        m = Monitor(cfg)
        for i, count in enumerate(rng.poisson(rate * window_s, n)):
            events += sum(e.kind == "drift" for e in m.observe(window_s * i, {"rate_per_s": count / window_s}))
    return events


def recorded_tails(path: Path, cut: int) -> tuple[int, float, float, float, float]:
    """(steady windows, median rate, the largest window's rate, its Poisson tail per day at the window length,
    the bootstrap's draws of it per day) of a recorded stream's stationary_b."""
    phases, _ = run.load(path)
    steady = phases["stationary_b"][cut:]
    ts = [t for t, _ in steady]
    rates = [w["rate_per_s"] for _, w in steady if "rate_per_s" in w]
    window_s = statistics.median(b - a for a, b in zip(ts, ts[1:], strict=False))
    mu = statistics.median(rates) * window_s
    top = max(rates)
    per_day = SECONDS_PER_DAY / window_s
    tail = float(poisson.sf(round(top * window_s) - 1, mu))
    return len(rates), mu / window_s, top, tail * per_day, per_day / len(rates)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hours", type=float, default=1200.0)
    ap.add_argument("--stream-hours", type=float, default=4.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--streams", nargs="*", default=["recorded-h200.jsonl.gz", "recorded-h200-rate10.jsonl.gz",
                                                     "recorded-h200-slowdown-rate16.jsonl.gz",
                                                     "recorded-h200-slowdown-short-rate24.jsonl.gz"])
    ap.add_argument("--cut", type=int, default=5, help="windows of each recorded stream's start left out")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    print(f"# The request rate's false alarms on Poisson arrivals ({time.strftime('%Y-%m-%d %H:%M')})\n")
    print("command: `" + " ".join(["python experiments/detection/poisson_rate.py", *sys.argv[1:]]) + "`\n")
    print(f"{args.hours:g} h per case in streams of {args.stream_hours:g} h, each learning its own baseline; the rate "
          f"test's budget: 1 / {TESTS} false alarms a day (one a day over the monitor's {TESTS} one-sided tests)\n")
    print("| rate /s | window s | the rate's spread | drift events | per 24 h | the rate test's budget per 24 h |")
    print("|---:|---:|---|---:|---:|---:|")
    for rate, window_s in CASES:
        for label, floor, confidence in VARIANTS:
            events = poisson_false_alarms(rate, window_s, args.hours, args.stream_hours, args.seed, floor, confidence)
            print(f"| {rate:g} | {window_s:g} | {label} | {events} | {24 * events / args.hours:.2f} | "
                  f"{1 / TESTS:.3f} |")
    here = Path(__file__).resolve().parent
    print("\n| recorded stream | steady windows | median rate /s | largest window's rate /s | Poisson: windows as far "
          "per 24 h | the bootstrap's draws of it per 24 h |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in args.streams:
        n, med, top, tail, drawn = recorded_tails(here / name, args.cut)
        print(f"| {name} | {n} | {med:.1f} | {top:.1f} | {tail:.2g} | {drawn:.0f} |")


if __name__ == "__main__":
    main()
