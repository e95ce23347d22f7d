"""Would the six latencies combined find a slowdown sooner than the ITL mean alone, learnt as the monitor learns?

The best linear combination of the latencies' log residuals for a slowdown that moves them all alike (weights
S^-1 1, S their covariance: bound.py's "best combination" is its shift over the whole steady state, in sample)
learnt from 20 calm windows of a life (scikit-learn's Ledoit-Wolf shrinkage of S: 6 latencies from 20 windows),
as a new baseline would be, and judged on the life's other calm windows (out of sample) and on its slowdown. Per
stream, over learning stretches every 5 windows before its first change: the combination's spread out of sample in
its own learnt sds (1 where the learnt covariance holds), its slowdown's median shift over that spread, and the
same two for the ITL mean alone.

    python experiments/detection/combined.py --streams vllm23h=recorded-vllm-capacity4-uni1c.jsonl.gz --tuned none \
        --held-out vllm23h/stationary_b --sim-model ../sim-calibration/model-cpu.json --cut vllm23h/stationary_b=0 \
        --host-probe own --host-speed-elasticity 1.0 --history-windows 160
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np
from sklearn.covariance import LedoitWolf

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bound  # noqa: E402
import run  # noqa: E402

from tuner.monitor.signals import LATENCIES  # noqa: E402

LEARN = 20  # windows a baseline is learnt from (MonitorConfig.learn_windows)
STEP = 5  # windows between the learning stretches tried


def judged(x: np.ndarray, at: list[int], test: list[int], slow: list[int]) -> tuple[float, float]:
    """A statistic's spread over windows `test` in its sds learnt over `at`, and its median over `slow` (shifted
    from the mean over `at`) in that out-of-sample spread."""
    mu, sd = float(x[at].mean()), float(x[at].std(ddof=1))
    spread = statistics.stdev(float(v) for v in (x[test] - mu) / sd)
    return spread, statistics.median(float(v) for v in (x[slow] - mu) / sd) / spread


def main() -> None:
    tag, seq, cfg, expect = run.life_from_args("combined.py")
    res = bound.log_residuals([w for _, w in seq], cfg, expect)
    names = [n for n in LATENCIES if n in res]
    x = np.array([[res[n][i] for n in names] for i in range(len(seq))])
    runs = run.changes_of(seq)
    near = {i for a, b, _ in runs for i in range(a, max(b, a + 1) + run.GRACE_WINDOWS)}
    calm = [i for i in range(len(seq)) if seq[i][0] == run.CALM and i not in near and np.isfinite(x[i]).all()]
    slow = [i for a, b, c in runs if c == run.SLOW for i in range(a, b) if np.isfinite(x[i]).all()]
    itl = names.index("itl_ms_mean")
    rows = []
    for s in range(0, min(a for a, _, _ in runs) - LEARN + 1, STEP):
        at = [i for i in range(s, s + LEARN) if i in calm]
        if len(at) < LEARN - 5:
            continue
        test = [i for i in calm if i not in at]
        cov = LedoitWolf().fit(x[at]).covariance_
        comb = x @ np.linalg.solve(cov, np.ones(len(names)))
        rows.append((*judged(comb, at, test, slow), *judged(x[:, itl], at, test, slow)))
    cols = [statistics.median(r[j] for r in rows) for j in range(4)]
    print(f"| {tag} | {len(rows)} | {len(calm)} | {len(slow)} | {cols[0]:.2f} | {cols[1]:.2f} | {cols[2]:.2f} | "
          f"{cols[3]:.2f} |")


if __name__ == "__main__":
    main()
