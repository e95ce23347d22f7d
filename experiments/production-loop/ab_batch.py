"""Flash-style with batches of 32 against batches of 64 (the fifth run's concurrent champion), on the concurrent
phase's traffic, interleaved: each run a fresh server on 127.0.0.1, `tuner bench` straight to it (no balancer).

    python experiments/production-loop/ab_batch.py [--rounds 2] [--run-s 60] > experiments/production-loop/ab-batch.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

from common import FLASH, bench_argv, free_port, server_argv, wait_ready  # noqa: E402


def run_once(batch: int, run_s: float, out: Path, seed: int) -> dict[str, float]:
    port = free_port()
    srv = subprocess.Popen(server_argv({**FLASH, "max_batch_size": batch}, port), cwd=REPO,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_ready(base, srv)
        subprocess.run(bench_argv(base, "concurrent", duration_s=run_s, out=out, seed=seed), cwd=REPO, check=True,
                       capture_output=True)
        m = json.loads(out.read_text())
        m = m.get("metrics", m)
        return {"tok_s": float(m["output_throughput"]), "e2el_ms": float(m["mean_e2el_ms"])}
    finally:
        srv.terminate()
        srv.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--run-s", type=float, default=60)
    args = ap.parse_args()
    rows: list[tuple[int, int, dict[str, float]]] = []
    t0 = time.strftime("%H:%M")
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            for batch in (32, 64):
                rows.append((r, batch, run_once(batch, args.run_s, Path(d) / f"{r}-{batch}.json", seed=r)))
    print(f"Flash-style (static batching, 100 ms timeout, 4096 MB pre-allocated) at two batch limits, concurrent "
          f"traffic (32 in flight), {args.run_s:g} s per run, interleaved, {t0}-{time.strftime('%H:%M')} UTC\n")
    print("| round | max_batch_size | output tok/s | mean E2EL ms |\n|---:|---:|---:|---:|")
    for r, b, m in rows:
        print(f"| {r} | {b} | {m['tok_s']:.1f} | {m['e2el_ms']:.0f} |")
    for b in (32, 64):
        xs = [m["tok_s"] for _, bb, m in rows if bb == b]
        print(f"\nmax_batch_size {b}: mean {statistics.fmean(xs):.1f} tok/s", end="")
    print()


if __name__ == "__main__":
    main()
