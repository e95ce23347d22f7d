"""How noisy each quiet stream's ITL mean is, and what that leaves of a +30 % slowdown (the twelfth step).

Per stream's stationary_b: the sd of the log ITL mean over its windows after the first 20, the same after a
least-squares fit on the log inputs (rate, mean prompt, mean output: what the load explains), the fitted
elasticities, the lag-1 autocorrelation, the request counts' variance / mean; then the monitor's own learnt
ITL-mean scale (log) over 20-window baselines started every 3 windows of the steady state (after run.py's
warm-up cut), the latencies' pooled autocorrelation, the ITL mean's CUSUM allowance k, and log 1.3 in those scales.

    python experiments/detection/itl_noise.py [LABEL=PATH ...]   (default: quiet8, quiet9, quiet10)
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

import run  # noqa: E402

from tuner.monitor.classify import Monitor  # noqa: E402
from tuner.monitor.config import MonitorConfig  # noqa: E402

DEFAULT = ["quiet8=recorded-quiet8.jsonl.gz", "quiet9=recorded-quiet9.jsonl.gz", "quiet10=recorded-quiet10.jsonl.gz"]


def main() -> None:
    cfg = MonitorConfig(interval_s=15.0)
    expect = run.expectation(HERE.parent / "sim-calibration" / "model-cpu.json")
    print("| stream | rate /s | counts var/mean | sd log ITL | after the inputs | elasticity rate, prompt, output "
          "| lag-1 | learnt scale (quartiles) | pooled rho (median) | k (median) | log 1.3 in scales (median) |")
    print("|---|---:|---:|---:|---:|---|---:|---|---:|---:|---:|")
    for arg in sys.argv[1:] or DEFAULT:
        label, path = arg.split("=", 1)
        phases, _ = run.load(HERE / path)
        w = [s for _, s in phases["stationary_b"]]
        steady = w[20:]
        y = np.log([x["itl_ms_mean"] for x in steady])
        x = np.column_stack([np.ones(len(steady))] + [np.log([s[k] for s in steady]) for k in
                                                      ("rate_per_s", "prompt_tokens_mean", "output_tokens_mean")])
        beta = np.linalg.lstsq(x, y, rcond=None)[0]
        counts = np.array([s["rate_per_s"] for s in steady]) * cfg.interval_s
        cut = run.warmup(w, cfg, expect)
        scales, rhos, ks = [], [], []
        for off in range(cut, len(w) - cfg.learn_windows - 5, 3):
            m = Monitor(cfg, expect)
            for i, s in enumerate(w[off:off + cfg.learn_windows + 1]):
                m.observe(cfg.interval_s * i, s)
            tr = m.tracks["itl_ms_mean"]
            if tr.baseline is not None:
                scales.append(tr.baseline.scale)
                rhos.append(m._rho)
                ks.append(tr.cusum.k)
        q = statistics.quantiles(scales, n=4)
        print(f"| {label} | {counts.mean() / cfg.interval_s:.2f} | {counts.var(ddof=1) / counts.mean():.2f} "
              f"| {y.std(ddof=1):.3f} | {(y - x @ beta).std(ddof=4):.3f} "
              f"| {beta[1]:+.2f}, {beta[2]:+.2f}, {beta[3]:+.2f} | {np.corrcoef(y[:-1], y[1:])[0, 1]:.2f} "
              f"| {q[0]:.3f}, {q[1]:.3f}, {q[2]:.3f} | {statistics.median(rhos):.2f} | {statistics.median(ks):.2f} "
              f"| {math.log(1.3) / q[1]:.2f} |")


if __name__ == "__main__":
    main()
