"""Which static configuration wins which phase on this host: the engine's defaults and the Flash-style one
(optionally with INT8), each measured on both phases with `tuner bench`, interleaved, `--rounds` times.

    python experiments/production-loop/probe.py --rounds 2 > experiments/production-loop/table-probe.md
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DEFAULTS, FLASH, PRESET, THREADS, bench_argv, free_port, load_average, read_json, server_argv, \
    wait_ready  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def measure(config: dict, phase: str, requests: int, tmp: Path, tag: str) -> dict:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with open(tmp / f"{tag}.log", "wb") as log:
        srv = subprocess.Popen(server_argv(config, port), stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        wait_ready(base, srv)
        out = tmp / f"{tag}.json"
        subprocess.run(bench_argv(base, phase, requests=requests, out=out), cwd=REPO, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=900)
        return read_json(out)
    finally:
        srv.terminate()
        srv.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--int8", action="store_true", help="also the Flash-style configuration with INT8 weights")
    args = ap.parse_args()
    configs = {"defaults": DEFAULTS, "flash": FLASH}
    if args.int8:
        configs["flash+int8"] = {**FLASH, "quantization": "int8"}
    requests = {"concurrent": 96, "single": 2}
    res: dict = {}
    loads = [load_average()]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for r in range(args.rounds):
            for phase in requests:
                for name, cfg in configs.items():
                    m = measure(cfg, phase, requests[phase], tmp, f"{name}-{phase}-{r}")
                    res.setdefault((phase, name), []).append(m)
                    loads.append(load_average())
                    print(f"round {r + 1} {phase} {name}: {m['output_throughput']:.1f} tok/s, "
                          f"mean e2el {m['mean_e2el_ms']:.0f} ms", file=sys.stderr)
    print(f"preset {PRESET}, {THREADS} thread(s); {args.rounds} round(s); 1-min load average during the run "
          f"{min(loads):.1f}-{max(loads):.1f} on {__import__('os').cpu_count()} cores\n")
    print("| phase | configuration | output tok/s (median) | mean E2EL ms | mean TTFT ms | vs defaults, tok/s | "
          "vs defaults, E2EL |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for phase in requests:
        base = res[(phase, "defaults")]
        b_tok = statistics.median(m["output_throughput"] for m in base)
        b_e2e = statistics.median(m["mean_e2el_ms"] for m in base)
        for name in configs:
            ms = res[(phase, name)]
            tok = statistics.median(m["output_throughput"] for m in ms)
            e2e = statistics.median(m["mean_e2el_ms"] for m in ms)
            ttft = statistics.median(m["mean_ttft_ms"] for m in ms)
            print(f"| {phase} | {name} | {tok:.1f} | {e2e:.0f} | {ttft:.0f} | {tok / b_tok:.2f}x | {e2e / b_e2e:.2f}x |")


if __name__ == "__main__":
    main()
