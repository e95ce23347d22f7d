"""The tuner's own time per trial (ask, tell, tracking, bookkeeping; the simulation excluded).

Runs agents/sim-8xa100.yaml for N trials with the default stores (SQLite Optuna study, SQLite MLflow store
with artifacts on disk) in a fresh state dir, and prints a table of the per-trial overhead.

    .venv/bin/python experiments/tuner-overhead/run.py [--trials 30]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--agent", default=str(ROOT / "agents" / "sim-8xa100.yaml"))
    args = ap.parse_args()

    t_import = time.perf_counter()
    from tuner.agent import load_agent
    from tuner.loop import open_session, run_cycle

    import_s = time.perf_counter() - t_import
    with tempfile.TemporaryDirectory() as d:
        sd = Path(d)
        t0 = time.perf_counter()
        session = open_session(load_agent(args.agent), sd)
        open_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        result = run_cycle(session, trials=args.trials)
        cycle_s = time.perf_counter() - t1
    over = [o.overhead_s * 1000 for o in result.outcomes]
    sim = [o.duration_s * 1000 for o in result.outcomes]
    q = statistics.quantiles(over, n=20)
    rows = [
        ("trials", f"{len(result.outcomes)}"),
        ("imports (s, once)", f"{import_s:.2f}"),
        ("open study + target (s, once)", f"{open_s:.2f}"),
        ("whole cycle wall (s)", f"{cycle_s:.2f}"),
        ("simulation per trial, median (ms)", f"{statistics.median(sim):.1f}"),
        ("tuner overhead per trial, mean (ms)", f"{statistics.mean(over):.1f}"),
        ("tuner overhead per trial, median (ms)", f"{statistics.median(over):.1f}"),
        ("tuner overhead per trial, p95 (ms)", f"{q[18]:.1f}"),
        ("tuner overhead per trial, max (ms)", f"{max(over):.1f}"),
        ("first trial overhead (ms; MLflow store creation)", f"{over[0]:.1f}"),
    ]
    print("| quantity | value |")
    print("|---|---:|")
    for k, v in rows:
        print(f"| {k} | {v} |")


if __name__ == "__main__":
    main()
