"""What a vLLM engine does in its slower windows: py-spy's samples of its engine core, window by window.

`record` (beside record_vllm.py, from the moment vLLM is ready): finds the running vLLM engine core (the one
process whose name says EngineCore) and runs `py-spy record --threads --nonblocking --format raw` on it in
back-to-back chunks of `--chunk-s` seconds at `--rate` samples a second, each chunk's folded stacks written to
`DIR/<start epoch>-<end epoch>.txt`, until the engine core is gone. py-spy is not a dependency of the tuner: give
its binary (`--py-spy`, e.g. from `pip download py-spy` unpacked).

`read` (after): maps each window of a recorded stream (run.py's windows) to the chunk that covers most of it and
prints, per window, the engine loop thread's samples (the thread with the most) and the share of them under each
of a few frames (`--frames`: a function name, or a file's stem, matched anywhere in the stack), with the window's
engine CPU per step and ITL mean over their calm medians (host_speed.py).

    python experiments/detection/profile_engine.py record --py-spy /path/to/py-spy --out DIR
    python experiments/detection/profile_engine.py read recorded.jsonl.gz DIR --frames execute_model schedule
"""

from __future__ import annotations

import argparse
import collections
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from host_speed import CALM, rows_of  # noqa: E402

from tuner.monitor.contention import titled  # noqa: E402


def engine_core_pid(proc: Path = Path("/proc")) -> int | None:
    """vLLM's engine core (its name, comm, is cut to 15 bytes: VLLM::EngineCor), else None."""
    return next(iter(titled("EngineCor", proc)), None)


def record(args: argparse.Namespace) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    pid = None
    while pid is None:
        pid = engine_core_pid()
        if pid is None:
            time.sleep(1.0)
    print(f"{time.strftime('%H:%M:%S')} profiling engine core {pid}", flush=True)
    while Path(f"/proc/{pid}").exists():
        t0 = time.time()
        part = args.out / f"{t0:.3f}.part"
        proc = subprocess.run([str(args.py_spy), "record", "--pid", str(pid), "--rate", str(args.rate),
                               "--duration", str(args.chunk_s), "--threads", "--nonblocking", "--format", "raw",
                               "--output", str(part)], capture_output=True, text=True, check=False)
        t1 = time.time()
        if part.exists():
            part.rename(args.out / f"{t0:.3f}-{t1:.3f}.txt")
        elif proc.returncode and Path(f"/proc/{pid}").exists():
            print(proc.stderr[-500:], file=sys.stderr, flush=True)


def chunks(folder: Path) -> list[tuple[float, float, Path]]:
    out = []
    for f in folder.glob("*-*.txt"):
        a, b = f.stem.split("-")
        out.append((float(a), float(b), f))
    return sorted(out)


def loop_stacks(path: Path) -> collections.Counter[str]:
    """The folded stacks (frames joined by ';') of the thread with the most samples in a py-spy raw file."""
    per: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        thread = next((f for f in frames if f.startswith("thread ")), "")
        per[thread][";".join(f for f in frames if not f.startswith(("process ", "thread ")))] += int(n)
    return max(per.values(), key=lambda c: sum(c.values())) if per else collections.Counter()


def read(args: argparse.Namespace) -> None:
    spans = chunks(args.folder)
    rows = rows_of(args.stream)
    calm = [r for r in rows if r["phase"] == CALM and r["window"] >= 2]
    med = {k: statistics.median(r[k] for r in calm) for k in ("cpu_us_per_step", "itl_ms")}
    print("| phase | window | CPU per step | ITL mean | samples | " + " | ".join(args.frames) + " |")
    print("|---|---:|---:|---:|---:|" + "---:|" * len(args.frames))
    for r in rows:
        end = r["t"]
        start = end - args.window_s
        best = max(spans, key=lambda s: min(s[1], end) - max(s[0], start), default=None)
        if best is None or min(best[1], end) - max(best[0], start) < args.window_s / 2:
            continue
        stacks = loop_stacks(best[2])
        total = sum(stacks.values())
        shares = [sum(n for s, n in stacks.items() if any(f.split(" (")[0] == fr or f"/{fr}.py" in f
                                                          for f in s.split(";"))) / total if total else 0.0
                  for fr in args.frames]
        print(f"| {r['phase']} | {r['window']} | {r['cpu_us_per_step'] / med['cpu_us_per_step']:.2f} | "
              f"{r['itl_ms'] / med['itl_ms']:.2f} | {total} | " + " | ".join(f"{s:.2f}" for s in shares) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="profile the running engine core in chunks")
    rec.add_argument("--py-spy", type=Path, required=True)
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--rate", type=int, default=25, help="samples a second (default 25)")
    rec.add_argument("--chunk-s", type=int, default=15, help="seconds a chunk (default 15: a window)")
    rd = sub.add_parser("read", help="the loop thread's samples window by window")
    rd.add_argument("stream", type=Path)
    rd.add_argument("folder", type=Path)
    rd.add_argument("--frames", nargs="+", required=True)
    rd.add_argument("--window-s", type=float, default=15.0)
    args = ap.parse_args()
    record(args) if args.cmd == "record" else read(args)


if __name__ == "__main__":
    main()
