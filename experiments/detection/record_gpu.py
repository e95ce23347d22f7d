"""Record a real /metrics and NVML stream of the reference engine on a GPU, with a real GPU fault injected.

The engine (`tuner serve-engine`, the `1b` preset in bfloat16 on the GPU, continuous batching) serves `tuner bench`
load while one thread scrapes its /metrics every `--interval-s` seconds and reads the GPU through the monitor's own
NVML path (tuner.monitor.telemetry.NvmlTelemetry, as the daemon's watch does), and appends
{"t", "phase", "text", "cpu", "gpu", "gpu_instant", ...} to a gzipped JSONL file that run.py replays (a row's "gpu"
readings are the window's GPU signals: no NVML double for this stream). "gpu" is the monitor's reading, the means
of NVML's sample buffers over the window; "gpu_instant" one instantaneous read at the window's end (what the
monitor read before, and what recorded-h200*.jsonl.gz hold as "gpu"); "gpu_window_samples" how many buffered
samples each mean took. Phases (`--plan`, see plan()):

- stationary_b: the base load (the held-out stationary stream);
- gpu_neighbour: the same load while a second process on the same GPU runs bf16 8192^3 matmuls back to back (a
  real noisy neighbour: the server's kernels share the GPU by time-slicing, and the matmuls drive it to its
  power cap, so NVML's clocks-event reasons and SM clock move as a real power throttle's would);
- gpu_neighbour_light: the same load while the neighbour runs 4096^3 matmuls about a quarter of the time;
- rate_x2: twice the base rate, no neighbour (a workload drift on the GPU);
- slowdown30 ("slowdown" plan): the base load on a second engine whose every step takes 1.3 times as long
  (`--step-slowdown-frac 0.3`: a real server slowdown of a known size), after its first WARM_S seconds.

    python experiments/detection/record_gpu.py --out "$OUT/recorded-h200.jsonl.gz"      # on the GPU host
    python experiments/detection/record_gpu.py --smoke --out /tmp/s.jsonl.gz            # anywhere, ~1 min

`run_gpu.sh` is the one device call (the wheels the GPU host lacks, then this script).
"""

from __future__ import annotations

import argparse
import gzip
import json
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import record  # noqa: E402

from tuner.monitor.signals import GPU  # noqa: E402
from tuner.monitor.telemetry import NvmlTelemetry  # noqa: E402

BASE_RATE = 24.0  # requests/s: ~100 requests in a 4-s window
NEIGHBOURS = {"heavy": (8192, 1.0), "light": (4096, 0.25)}  # matmul size, share of the time it runs
SLOWDOWN_FRAC = 0.3  # the slowed engine's step_slowdown_frac: every step 1.3 times as long (record.py's)
WARM_S = 24  # the slowed engine's first seconds, its start-up (phase ''), not recorded as the change

Phase = tuple[str, float, str, str]  # (phase, seconds, workload YAML, neighbour or '')


def plan(rate: float, which: str = "slowdown") -> list[tuple[float, list[Phase]]]:
    """Engines in turn, each (its step slowdown, its phases). "neighbours": the fifteenth step's streams (both
    neighbours, one engine); "slowdown": a longer stationary stretch, the light neighbour, the rate x2, then a
    second engine every step of which takes 1.3 times as long (a real +30 % server slowdown on the GPU);
    "slowdown-short": its stationary stretch and the slowed engine alone (~5 min of device time)."""
    base = record.workload(rate, output_mean=32, output_max=120)
    x2 = record.workload(2 * rate, output_mean=32, output_max=120)
    if which == "neighbours":
        return [(0.0, [("stationary_b", 200, base, ""), ("gpu_neighbour", 40, base, "heavy"),
                       ("gpu_neighbour_light", 40, base, "light"), ("rate_x2", 36, x2, "")])]
    slowed: tuple[float, list[Phase]] = (SLOWDOWN_FRAC, [("", WARM_S, base, ""), ("slowdown30", 56, base, "")])
    if which == "slowdown-short":
        return [(0.0, [("stationary_b", 170, base, "")]), slowed]
    return [(0.0, [("stationary_b", 260, base, ""), ("gpu_neighbour_light", 36, base, "light"),
                   ("rate_x2", 32, x2, "")]), slowed]


def neighbour(kind: str, device: str, gpu: int) -> None:
    """A process that shares the GPU (or, in a smoke run, the CPU) until it is terminated."""
    import torch

    size, duty = NEIGHBOURS[kind]
    if device == "cpu":
        size = 256
        torch.set_num_threads(1)
    else:
        device = f"cuda:{gpu}"
    dtype = torch.bfloat16 if device != "cpu" else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.is_set():
        t0 = time.monotonic()
        for _ in range(8):
            a @ b
        if device != "cpu":
            torch.cuda.synchronize()
        busy = time.monotonic() - t0
        if duty < 1.0:
            time.sleep(busy * (1 - duty) / duty)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="the gzipped JSONL stream to write (appended to)")
    ap.add_argument("--interval-s", type=float, default=4.0, help="scrape interval: one window")
    ap.add_argument("--rate", type=float, default=BASE_RATE, help="the base arrival rate, requests/s")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--preset", default="1b")
    ap.add_argument("--gpu", type=int, default=0, help="the GPU the engine, the neighbour and NVML use")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every phase's duration")
    ap.add_argument("--seed", type=int, default=500, help="phase i runs `tuner bench --seed SEED + i`")
    ap.add_argument("--plan", choices=("slowdown", "slowdown-short", "neighbours"), default="slowdown",
                    help="the phases (see plan(): 'neighbours' made recorded-h200*.jsonl.gz)")
    ap.add_argument("--smoke", action="store_true", help="tiny preset on the CPU, phases x0.1, rate 2/s")
    ap.add_argument("--neighbour", choices=tuple(NEIGHBOURS), help=argparse.SUPPRESS)  # the neighbour process
    args = ap.parse_args()
    if args.neighbour:
        neighbour(args.neighbour, args.device, args.gpu)
        return
    if args.out is None:
        ap.error("--out is required")
    if args.smoke:
        args.device, args.preset, args.scale, args.rate = "cpu", "tiny", 0.1, 2.0
    engine_flags = ["--preset", args.preset, "--device", args.device, "--batching", "continuous",
                    "--max-batch-size", "64"]
    if args.device == "cuda":
        engine_flags += ["--dtype", "bfloat16", "--kv-pool-mb", "8192", "--pre-allocate"]
    else:
        engine_flags += ["--cpu-threads", "1"]
    gpus = [args.gpu] if args.device == "cuda" else []
    tel = NvmlTelemetry(gpus)  # the monitor's reading: NVML's sample buffers' means over the window
    instant = NvmlTelemetry(gpus, window_mean=False)  # the fifteenth step's: one read at the window's end
    out = gzip.open(args.out, "at", encoding="utf-8")
    groups = plan(args.rate, args.plan)
    load_seeds = seeds(groups, args.seed)
    try:
        for slowdown, phases in groups:
            run_engine(args, engine_flags, slowdown, phases, load_seeds, tel, instant, out)
    finally:
        out.close()
    summary(args.out)


def seeds(groups: Sequence[tuple[float, Sequence[Phase]]], seed: int) -> dict[str, int]:
    """Each phase's load seed: `seed` plus its place in the plan (the warm-up, '', included)."""
    order = [name for _, phases in groups for name, *_ in phases]
    return {name: seed + order.index(name) for name in order}


def run_engine(args: argparse.Namespace, engine_flags: list[str], slowdown: float, phases: Sequence[Phase],
               seeds: dict[str, int], tel: NvmlTelemetry, instant: NvmlTelemetry, out: Any) -> None:
    """One engine (its step slowdown fixed at start) through `phases`, /metrics and the GPU read every window."""
    py = sys.executable
    port = record.free_port()
    url = f"http://127.0.0.1:{port}"
    flags = [*engine_flags, "--step-slowdown-frac", str(slowdown)]
    log_dir = args.out.parent
    tag = f"-slowdown{slowdown:g}" if slowdown else ""
    eng_log = open(log_dir / f"engine{tag}.log", "w")  # noqa: SIM115 (open for the engine's life)
    eng = subprocess.Popen([py, "-m", "tuner.cli", "serve-engine", "--port", str(port), *flags],
                           stdout=eng_log, stderr=subprocess.STDOUT)
    phase = {"name": "", "neighbour": "", "seed": ""}
    stop = threading.Event()
    t_start = time.monotonic()
    th: threading.Thread | None = None
    try:
        record.wait_ready(url, timeout_s=240)
        print(f"{time.strftime('%H:%M:%S')} engine ready in {time.monotonic() - t_start:.0f} s "
              f"({' '.join(flags)})", flush=True)

        def row(text: str) -> dict[str, Any]:
            return {"t": time.time(), "phase": phase["name"], "neighbour": phase["neighbour"],
                    "step_delay_ms": 0.0, "step_slowdown_frac": slowdown, "base_rate": args.rate,
                    "load_seed": phase["seed"], "device": args.device, "preset": args.preset, "text": text,
                    "cpu": record.cpu_readings(eng.pid), "gpu": tel.read(), "gpu_instant": instant.read(),
                    "gpu_window_samples": dict(tel.sampler.window_samples)}

        def write(line: str) -> None:
            out.write(line)
            out.flush()

        th = threading.Thread(target=record.scrape_loop, args=(url, args.interval_s, stop, row, write), daemon=True)
        th.start()
        for name, seconds, wl, kind in phases:
            nb = None
            if kind:
                nb = subprocess.Popen([py, __file__, "--neighbour", kind, "--device", args.device,
                                       "--gpu", str(args.gpu)])
            seed = str(seeds[name])
            phase.update(name=name, neighbour=kind, seed=seed)
            print(f"{time.strftime('%H:%M:%S')} phase {name or '(warm-up)'} ({seconds * args.scale:.0f} s"
                  f"{', neighbour ' + kind if kind else ''}, step slowdown {slowdown:g})", flush=True)
            with open(log_dir / f"bench-{name or 'warmup' + tag}.log", "w") as blog:
                record.bench(url, wl, seconds * args.scale, seed, stdout=blog)
            if nb is not None:
                nb.terminate()
                nb.wait(30)
        phase["name"] = ""
    finally:
        stop.set()
        if th is not None:
            th.join(args.interval_s + 10)
        eng.terminate()
        eng.wait(30)
        eng_log.close()


def gpu_table(phases: Mapping[str, Sequence[Mapping[str, float]]]) -> str:
    """A markdown table of each phase's median GPU readings (tuner.monitor.signals.GPU; '-' where none was read)."""
    lines = ["| phase | " + " | ".join(GPU) + " |", "|---|" + "---:|" * len(GPU)]
    for name, readings in phases.items():
        cells = [f"{statistics.median(v):.3g}" if (v := [r[k] for r in readings if k in r]) else "-" for k in GPU]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(path: Path) -> None:
    """Per phase, the medians of the GPU readings (a check on the host before any replay)."""
    rows = [json.loads(line) for line in gzip.open(path, "rt", encoding="utf-8") if line.strip()]
    phases: dict[str, list[dict[str, float]]] = {}
    for r in rows:
        if r["phase"]:
            phases.setdefault(r["phase"], []).append(r.get("gpu", {}))
    print(gpu_table(phases))


if __name__ == "__main__":
    main()
