"""Record a real vLLM's /metrics stream (its CPU build in .venv-vllm) under `tuner bench` load, for run.py.

The same phases as record.py's reference-engine streams, on one vLLM server (a tiny local Llama, eager, through
the tuner's own vllm target): the inputs moved (rate x2, prompt x2, output x4), a server slowdown of +30 % at the
base load, and a held-out stationary stretch. vLLM has no slowdown option, so the slowdown stops the server's
processes a share of the time from outside (freeze.Freezer: every piece of its work 1 / (1 - s) as long); the
rows record it as `step_slowdown_frac` like the engine's own option. /metrics is scraped every `--interval-s`
and each row holds the vLLM engine-core process's schedstat (the monitor's CPU wait) as record.py's do.

    nice -n 5 python experiments/detection/record_vllm.py --out experiments/detection/recorded-vllm.jsonl.gz \
        --seed 12000

`--scale 0.05` runs every phase a twentieth as long (a smoke run, a few minutes with vLLM's start).
"""

from __future__ import annotations

import argparse
import gzip
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from freeze import Freezer  # noqa: E402
from record import BASE_RATE, SLOWDOWN_FRAC, bench, cpu_readings, scrape_loop, workload  # noqa: E402

from tuner.engine.checkpoint import write_checkpoint  # noqa: E402
from tuner.targets.base import TrialContext  # noqa: E402
from tuner.targets.vllm import VllmOptions, VllmTarget  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
MAX_MODEL_LEN = 1024  # the longest prompt (prompt_x2: 440) and output (output_x4: 240) together fit


def plan(rate: float) -> list[tuple[str, float, float, str]]:
    """(phase, seconds, the server's slowdown, workload YAML), in order; stationary_b (held out) last."""
    return [
        ("base", 240, 0.0, workload(rate)),
        ("rate_x2", 240, 0.0, workload(rate=2 * rate)),
        ("prompt_x2", 240, 0.0, workload(rate, prompt_mean=200, prompt_max=440)),
        ("output_x4", 240, 0.0, workload(rate, output_mean=64, output_max=240)),
        ("slowdown30", 300, SLOWDOWN_FRAC, workload(rate)),
        ("stationary_b", 1800, 0.0, workload(rate)),
    ]


def descendants(pid: int, proc_root: Path = Path("/proc")) -> list[int]:
    """The process ids below `pid` (children, their children, ...), from each process's stat."""
    parent: dict[int, int] = {}
    for d in proc_root.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        # the command name is in parentheses and may hold spaces: the parent id is the second field after it
        parent[int(d.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def engine_core(pid: int, below: list[int] | None = None) -> int:
    """vLLM's engine-core process below the server `pid` (its process title names it), else the server itself;
    `below`: the processes below it where already listed (descendants)."""
    for c in descendants(pid) if below is None else below:
        try:
            if b"EngineCore" in Path(f"/proc/{c}/cmdline").read_bytes() + Path(f"/proc/{c}/comm").read_bytes():
                return c
        except OSError:
            continue
    return pid


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--interval-s", type=float, default=15.0)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every phase's duration (a smoke run)")
    ap.add_argument("--only", default="", help="comma-separated phases to run (default: all)")
    ap.add_argument("--seed", type=int, default=None,
                    help="the load's seed: phase i runs `tuner bench --seed SEED + i`")
    ap.add_argument("--base-rate", type=float, default=BASE_RATE, help=f"requests/s (default {BASE_RATE})")
    ap.add_argument("--seconds", nargs="+", default=[], metavar="PHASE=S",
                    help="a phase's duration in seconds instead of the plan's (e.g. slowdown30=900: more windows "
                         "of the slowdown, so run.py's trials start at more offsets in it)")
    args = ap.parse_args()
    if not VLLM_PYTHON.exists():
        ap.error(f"{VLLM_PYTHON} is missing: build vLLM's CPU environment with `make vllm-venv`")
    if not args.base_rate > 0:
        ap.error(f"--base-rate must be > 0 requests/s, got {args.base_rate}")
    only = {p for p in args.only.split(",") if p}
    phases = plan(args.base_rate)
    names = [name for name, *_ in phases]
    unknown = only - set(names)
    if unknown:
        ap.error(f"--only: unknown phases {', '.join(sorted(unknown))}; valid: {', '.join(names)}")
    durations: dict[str, float] = {}
    for item in args.seconds:
        name, _, value = item.partition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = float("nan")
        if name not in names or not seconds > 0:
            ap.error(f"--seconds {item}: PHASE=S with PHASE one of {', '.join(names)} and S > 0 seconds")
        durations[name] = seconds
    phases = [(name, durations.get(name, seconds), slowdown, wl) for name, seconds, slowdown, wl in phases]
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        model = write_checkpoint(tmp / "tiny", "tiny", max_model_len=MAX_MODEL_LEN)
        target = VllmTarget(VllmOptions(model=str(model), python=str(VLLM_PYTHON), device="cpu",
                                        extra_args=["--max-model-len", str(MAX_MODEL_LEN)]), agent_dir=tmp)
        ctx = TrialContext(trial_number=0, state_dir=tmp / "state", label="record-vllm")
        with target.deploy({"enforce_eager": True, "cpu_kvcache_space_gib": 1}, ctx) as dep, \
                gzip.open(args.out, "at", encoding="utf-8") as out:
            assert dep.pid is not None and dep.metrics_url is not None and dep.endpoint is not None
            below = descendants(dep.pid)  # vLLM starts no new processes while serving: listed once
            core = engine_core(dep.pid, below)
            print(f"{time.strftime('%H:%M:%S')} vLLM ready: server {dep.pid}, engine core {core}", flush=True)
            state: dict[str, Any] = {"phase": "", "slowdown": 0.0, "seed": ""}
            lock = threading.Lock()

            def row(text: str) -> dict[str, Any]:
                return {"t": time.time(), "phase": state["phase"], "step_delay_ms": 0.0,
                        "step_slowdown_frac": state["slowdown"], "base_rate": args.base_rate,
                        "load_seed": state["seed"], "server": "vllm", "text": text, "cpu": cpu_readings(core)}

            def write(line: str) -> None:
                with lock:
                    out.write(line)
                    out.flush()

            stop = threading.Event()
            base_url = dep.metrics_url.removesuffix("/metrics")
            th = threading.Thread(target=scrape_loop, args=(base_url, args.interval_s, stop, row, write), daemon=True)
            th.start()
            try:
                for i, (name, seconds, slowdown, wl) in enumerate(phases):
                    if only and name not in only:
                        continue
                    state.update(phase=name, slowdown=slowdown,
                                 seed="" if args.seed is None else str(args.seed + i))
                    print(f"{time.strftime('%H:%M:%S')} phase {name} ({seconds * args.scale:.0f} s, "
                          f"slowdown {slowdown:g})", flush=True)
                    with Freezer([dep.pid, *below], slowdown) as fz:  # the whole server slowed
                        bench(dep.endpoint, wl, seconds * args.scale, state["seed"] or None,
                              client=("--model", dep.model, "--tokenizer", str(model)))
                    if slowdown:
                        print(f"  held stopped {fz.share_held():.3f} of the time (target {fz.share:.3f})",
                              flush=True)
                state["phase"] = ""
            finally:
                stop.set()
                th.join(args.interval_s + 10)


if __name__ == "__main__":
    main()
