"""Events against episodes: how many of a stream's replayed anomalies reopen one that recovered shortly before.

    python experiments/detection/episodes.py --streams quiet=recorded-quiet.jsonl.gz --tuned stationary_a \\
        --held-out quiet/stationary_b --sim-model ../sim-calibration/model-cpu.json --hours 1200

run.py's options and its rows' own draws (run.bootstrap_replays): each stationary set's bootstrap in blocks of
--block windows, as `table-1200h.md` has it, with its drift, anomaly and saturation events counted, then its
episodes: an event is a new episode unless a recovery of the same kind ended within GAP windows before it (GAP 20,
60, 240: 5, 15 and 60 minutes at 15-s windows). What it measures is the flapping of an anomaly against one wrong
baseline (README, ninth step). It was measured before the monitor marked reopenings itself
(MonitorConfig.reopen_gap_s: a reopening of the same cause within 15 minutes, the tenth step); run.py's tables now
count the monitor's own episodes.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import run  # noqa: E402

GAPS = (20, 60, 240)


def main() -> None:
    args = run.parser().parse_args()
    phases, _, sets, cfg, expect, _ = run.setup(args)
    for name, label in sets:
        recorded = [w for _, w in phases[name]]
        stat = recorded[run.warmup(recorded, cfg, expect):]
        row = run.row_label(name, label)
        events, episodes = 0, dict.fromkeys(GAPS, 0)
        for ev in run.bootstrap_replays(row, stat, args.block, cfg, expect, args):
            alarms = [e for e in ev if e[1] != "recovery"]
            ends = [e for e in ev if e[1] == "recovery"]
            events += len(alarms)
            for gap in GAPS:
                episodes[gap] += sum(1 for i, kind, _, _ in alarms
                                     if not any(r[2] == kind and 0 < i - r[0] <= gap for r in ends))
        per_day = 24 / args.hours
        print(f"{row}, blocks of {args.block}, {args.hours:g} h: {events} events ({events * per_day:.2f} / 24 h); "
              + "; ".join(f"episodes, a reopening within {g} windows the same: {c} ({c * per_day:.2f} / 24 h)"
                          for g, c in episodes.items()))


if __name__ == "__main__":
    main()
