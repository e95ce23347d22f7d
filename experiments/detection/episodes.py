"""Events against episodes: how many of a stream's replayed anomalies reopen one that recovered shortly before.

    python experiments/detection/episodes.py [STREAM [LABEL [BLOCK [HOURS]]]]

Replays the block bootstrap of run.py's false-alarm rows (the same draws: run.py seeds a row's generator with its
name) of one stationary stream and counts its drift, anomaly and saturation events, then its episodes: an event is
a new episode unless a recovery of the same kind ended within GAP windows before it (GAP 20, 60, 240: 5, 15 and 60
minutes at 15-s windows). What it measures is the flapping of an anomaly against one wrong baseline (README,
ninth step); the monitor itself counts events.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import run  # noqa: E402

from tuner.monitor.config import MonitorConfig  # noqa: E402

HERE = Path(__file__).resolve().parent
GAPS = (20, 60, 240)


def main() -> None:
    stream = HERE / (sys.argv[1] if len(sys.argv) > 1 else "recorded-quiet.jsonl.gz")
    label = sys.argv[2] if len(sys.argv) > 2 else "held out (`quiet/stationary_b`)"
    block = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    hours = float(sys.argv[4]) if len(sys.argv) > 4 else 1200.0
    phases, _ = run.load(stream)
    cfg = MonitorConfig(interval_s=15)
    expect = run.expectation(HERE.parent / "sim-calibration" / "model-cpu.json")
    recorded = [w for _, w in phases["stationary_b"]]
    stat = recorded[run.warmup(recorded, cfg, expect):]
    rng = random.Random(f"0/{label}/{block}")  # run.py's draws for that row (seed 0)
    n = int(4 * 3600 / cfg.interval_s)
    events, episodes = 0, dict.fromkeys(GAPS, 0)
    for s in range(round(hours / 4)):
        windows = run.bootstrap(stat, n + cfg.learn_windows, block, rng)
        ev = run.replay(windows, cfg, run.Gpu(0.01, 100 + s), expect)
        alarms = [e for e in ev if e[1] != "recovery"]
        ends = [e for e in ev if e[1] == "recovery"]
        events += len(alarms)
        for gap in GAPS:
            episodes[gap] += sum(1 for i, kind, _ in alarms
                                 if not any(r[2] == kind and 0 < i - r[0] <= gap for r in ends))
    per_day = 24 / hours
    print(f"{stream.name} {label}, blocks of {block}, {hours:g} h: {events} events ({events * per_day:.2f} / 24 h); "
          + "; ".join(f"episodes, a reopening within {g} windows the same: {c} ({c * per_day:.2f} / 24 h)"
                      for g, c in episodes.items()))


if __name__ == "__main__":
    main()
