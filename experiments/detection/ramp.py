"""How soon a slowdown in the server's own life reaches the ITL mean the monitor judges.

For each +30 % slowdown of a stream recorded with record_vllm.py --life or --interleave, the log ITL mean's residual
the monitor judges (over the champion's expectation, corrected for the CPU wait and, with --host-speed-elasticity,
for the host's speed: bound.log_residuals) in the slowdown's first five windows, each as a share of the slowdown's
median shift over the 20 windows before it; and the same for the raw log ITL mean. A share below 1 in the first
windows is a ramp the delay counted from the slowdown's first window includes.

    python experiments/detection/ramp.py --streams vllm23h=recorded-vllm-capacity4-uni1c.jsonl.gz --tuned none \
        --held-out vllm23h/stationary_b --sim-model ../sim-calibration/model-cpu.json --cut vllm23h/stationary_b=0 \
        --host-probe own --host-speed-elasticity 1.0 --history-windows 160

(run.py's options; the first held-out set's stream must be a life.)
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bound  # noqa: E402
import run  # noqa: E402

BEFORE = 20  # the windows before a slowdown its shift is measured from
FIRST = 5  # the slowdown's windows whose shares are shown


def shares(vals: list[float], a: int, b: int) -> tuple[float, list[float]]:
    """The median shift of windows a..b-1 over the BEFORE windows before a, and each of the first FIRST windows'
    shift as a share of it."""
    before = statistics.median(vals[a - BEFORE:a])
    full = statistics.median(vals[a:b]) - before
    return full, [(vals[i] - before) / full for i in range(a, min(b, a + FIRST))]


def main() -> None:
    tag, seq, cfg, expect = run.life_from_args("ramp.py")
    ws = [w for _, w in seq]
    judged = bound.log_residuals(ws, cfg, expect)["itl_ms_mean"]
    raw = [math.log(w["itl_ms_mean"]) if w.get("itl_ms_mean", 0) > 0 else math.nan for w in ws]
    for a, b, change in run.changes_of(seq):
        if change != run.SLOW or a < BEFORE:
            continue
        full, first = shares(judged, a, b)
        raw_full, raw_first = shares(raw, a, b)
        print(f"| {tag} | {a} | {b - a} | {full:+.3f} | {' '.join(f'{x:.2f}' for x in first)} | {raw_full:+.3f} | "
              f"{' '.join(f'{x:.2f}' for x in raw_first)} |")


if __name__ == "__main__":
    main()
