"""Record real /metrics streams of the reference engine (tuner serve-engine, CPU) under `tuner bench` load.

One engine per group of phases (its step slowdown fixed at start); inside a group the phases follow
each other on the same engine, each a `tuner bench` run of its own workload, while one thread scrapes /metrics
every `--interval-s` seconds and appends {"t", "phase", "text", "cpu", ...} to a gzipped JSONL file. The detection
experiment (run.py) turns consecutive scrapes of one phase into windows and replays them.

    nice -n 5 python experiments/detection/record.py --out experiments/detection/recorded.jsonl.gz \
        --only base,rate_x2,prompt_x2,output_x4
    nice -n 5 python experiments/detection/record.py --out experiments/detection/recorded2.jsonl.gz \
        --only slowdown30,stationary_a,stationary_b

Each row also holds the engine's schedstat (per thread), the host's CPU pressure and load average (`cpu`),
from which run.py computes the monitor's cpu_wait_frac.
"""

from __future__ import annotations

import argparse
import gzip
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tuner.monitor.contention import read_schedstat

BASE_RATE = 2.0
BASE_STEP_DELAY_MS = 5.0
SLOWDOWN_FRAC = 0.3  # the engine's step_slowdown_frac: every step takes 1.3 times as long, whatever the host
def workload(rate: float = BASE_RATE, prompt_mean: float = 100, prompt_max: int = 220, output_mean: float = 16,
             output_max: int = 60, closed: int | None = None) -> str:
    """A load's workload YAML: Poisson arrivals at `rate`, or with `closed` a closed loop of that many requests in
    flight (each sent as the one before it is answered: no think time; `rate` unused)."""
    arrival = f"{{kind: closed, concurrency: {closed}}}" if closed else f"{{kind: poisson, rate_per_s: {rate}}}"
    return (f"arrival: {arrival}\n"
            f"prompt_tokens: {{dist: lognormal, mean: {prompt_mean}, sigma: 0.4, min: 8, max: {prompt_max}}}\n"
            f"output_tokens: {{dist: lognormal, mean: {output_mean}, sigma: 0.4, min: 2, max: {output_max}}}\n"
            "duration_s: 1\nignore_eos: true\n")


# (engine step slowdown fraction, [(phase, seconds, workload YAML)]); every engine runs --step-delay-ms 5.
# The held-out stationary run (stationary_b) comes last and is never used to tune the detector. `rate`: every
# phase's base arrival rate (rate_x2 twice it); the streams up to quiet9 were all recorded at BASE_RATE.
def plan(rate: float = BASE_RATE) -> list[tuple[float, list[tuple[str, float, str]]]]:
    return [
        (0.0, [
            ("base", 240, workload(rate)),
            ("rate_x2", 240, workload(rate=2 * rate)),
            ("prompt_x2", 240, workload(rate, prompt_mean=200, prompt_max=440)),
            ("output_x4", 240, workload(rate, output_mean=64, output_max=240)),
        ]),
        (SLOWDOWN_FRAC, [("slowdown30", 300, workload(rate))]),
        (0.0, [("stationary_a", 1500, workload(rate))]),
        (0.0, [("stationary_b", 1800, workload(rate))]),
    ]


def thread_schedstats(pid: int) -> dict[str, str]:
    """Thread id -> its schedstat line (ns on a CPU, ns waiting for one, timeslices) of a process's threads, as the
    monitor reads them (tuner.monitor.contention.read_schedstat), each line stripped."""
    return {tid: line.strip() for tid, line in read_schedstat(pid).items()}


def cpu_readings(pid: int) -> dict[str, object]:
    """What the contention covariates are computed from, raw: the engine process's schedstat lines (one per
    thread: ns on a CPU, ns waiting for one, timeslices), the host's CPU pressure and load average, and the host's
    CPU time line of /proc/stat (its steal column: time the hypervisor ran other guests on this one's CPUs)."""
    threads = thread_schedstats(pid)
    def text(p: str) -> str:
        try:
            return Path(p).read_text()
        except OSError:
            return ""
    return {"schedstat": threads, "pressure": text("/proc/pressure/cpu"), "loadavg": text("/proc/loadavg"),
            "stat": text("/proc/stat").splitlines()[0]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape_loop(url: str, interval_s: float, stop: threading.Event, row: Callable[[str], dict[str, Any]],
                write: Callable[[str], None]) -> None:
    """Every `interval_s` until `stop`: the server's /metrics text ('' where it did not answer) made into a row by
    `row` and written as a JSON line by `write`."""
    nxt = time.monotonic()
    while not stop.is_set():
        nxt += interval_s
        try:
            with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            text = ""
        write(json.dumps(row(text)) + "\n")
        stop.wait(max(0.0, nxt - time.monotonic()))


def bench(url: str, workload_yaml: str, seconds: float, seed: str | None, stdout: Any = subprocess.DEVNULL,
          client: Sequence[str] = ("--tokenizer", "byte")) -> None:
    """One `tuner bench` run of `workload_yaml` against the server at `url` (its load's seed where given), its
    output to `stdout`; `client`: bench's options for the server (the reference engine's byte tokenizer by
    default; a model name and its tokenizer's folder for another server); a failed run records what the scrapes
    saw and the phase goes on."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(workload_yaml)
    try:
        subprocess.run([sys.executable, "-m", "tuner.cli", "bench", "--url", url, "--workload", f.name,
                        "--duration-s", str(seconds), *client, *(["--seed", seed] if seed else [])],
                       stdout=stdout, stderr=subprocess.STDOUT if stdout is not subprocess.DEVNULL else None,
                       check=False)
    finally:
        Path(f.name).unlink()


def wait_ready(url: str, timeout_s: float = 300) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=5):
                return
        except OSError:
            time.sleep(1)
    raise SystemExit(f"engine at {url} not ready in {timeout_s} s")


def add_out(ap: argparse.ArgumentParser) -> None:
    """--out and --append: the recording's file, and whether one that exists may be added to."""
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--append", action="store_true",
                    help="add to an --out that exists (another run's phases, e.g. with --only) instead of refusing it")


def check_out(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse an --out that exists unless --append (the recorders append: another recording would be lost in it)."""
    if args.out.exists() and not args.append:
        ap.error(f"--out {args.out} exists (a recording of its own?): name a new file, or pass --append to add "
                 "this run's windows to it")


def main() -> None:
    ap = argparse.ArgumentParser()
    add_out(ap)
    ap.add_argument("--interval-s", type=float, default=15.0)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every phase's duration (a smoke run)")
    ap.add_argument("--only", default="", help="comma-separated phases to run (default: all)")
    ap.add_argument("--seed", type=int, default=None,
                    help="the load's seed: phase i of the plan runs `tuner bench --seed SEED + i` (default: bench's "
                         "own, the same arrivals and lengths in every recording made without it, quiet to quiet8)")
    ap.add_argument("--base-rate", type=float, default=BASE_RATE,
                    help=f"every phase's base arrival rate, requests/s (default {BASE_RATE}; rate_x2 twice it)")
    args = ap.parse_args()
    check_out(ap, args)
    if not args.base_rate > 0:
        ap.error(f"--base-rate must be > 0 requests/s, got {args.base_rate}")
    only = {p for p in args.only.split(",") if p}
    py = sys.executable
    phase = {"name": ""}
    phases_plan = plan(args.base_rate)
    order = [name for _, group in phases_plan for name, _, _ in group]
    out = gzip.open(args.out, "at", encoding="utf-8")
    lock = threading.Lock()
    for slowdown, phases in phases_plan:
        phases = [p for p in phases if not only or p[0] in only]
        if not phases:
            continue
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        eng = subprocess.Popen([py, "-m", "tuner.cli", "serve-engine", "--preset", "tiny", "--port", str(port),
                                "--cpu-threads", "1", "--step-delay-ms", str(BASE_STEP_DELAY_MS),
                                "--step-slowdown-frac", str(slowdown)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stop = threading.Event()
        try:
            wait_ready(url)

            def row(text: str, slowdown: float = slowdown, pid: int = eng.pid) -> dict[str, Any]:
                return {"t": time.time(), "phase": phase["name"], "step_delay_ms": BASE_STEP_DELAY_MS,
                        "step_slowdown_frac": slowdown, "base_rate": args.base_rate,
                        "load_seed": phase.get("seed", ""), "text": text, "cpu": cpu_readings(pid)}

            def write(line: str) -> None:
                with lock:
                    out.write(line)
                    out.flush()

            th = threading.Thread(target=scrape_loop, args=(url, args.interval_s, stop, row, write), daemon=True)
            th.start()
            for name, seconds, wl in phases:
                phase["seed"] = "" if args.seed is None else str(args.seed + order.index(name))
                phase["name"] = name
                print(f"{time.strftime('%H:%M:%S')} phase {name} ({seconds * args.scale:.0f} s, "
                      f"step slowdown {slowdown:g})", flush=True)
                bench(url, wl, seconds * args.scale, phase["seed"] or None)
            phase["name"] = ""
            stop.set()
            th.join(args.interval_s + 10)
        finally:
            stop.set()
            eng.terminate()
            eng.wait(30)
    out.close()


if __name__ == "__main__":
    main()
