"""Record a real vLLM's /metrics stream (its CPU build in .venv-vllm) under `tuner bench` load, for run.py.

The same phases as record.py's reference-engine streams, on one vLLM server (a tiny local Llama, eager, through
the tuner's own vllm target): the inputs moved (rate x2, prompt x2, output x4), a server slowdown of +30 % at the
base load, and a held-out stationary stretch. vLLM has no slowdown option, so the slowdown stops the server's
processes a share of the time from outside (freeze.Freezer: every piece of its work 1 / (1 - s) as long); the
rows record it as `step_slowdown_frac` like the engine's own option. /metrics is scraped every `--interval-s`
and each row holds the vLLM engine-core process's schedstat (the monitor's CPU wait) as record.py's do, and
(from the thirty-second step on) its model worker's (`worker_schedstat`: the process that runs the model; the
engine core spins on a shared-memory queue while it does, so its own wait is the CPUs' contention, not the
model's: worker_wait.py makes a stream whose wait is the worker's).

    nice -n 5 python experiments/detection/record_vllm.py --out experiments/detection/recorded-vllm.jsonl.gz \
        --seed 12000

`--scale 0.05` runs every phase a twentieth as long (a smoke run, a few minutes with vLLM's start).

`--interleave N` records instead a load that never stops (at the base rate) while the server is slowed N times in
its own life: a lead stationary stretch (`--lead-s`, its warm-up and a baseline), then N times a
slowdown (slowdown30, 240 s) and a stationary stretch (stationary_b, 300 s); `--seconds` sets those. Each switch
comes right after a scrape, and the next row says `starts_phase`: the window ending there was all in its phase
(run.py keeps it, and replays the whole stream in its recorded order: the slowdowns found against a baseline the
same server, under the same load, set minutes before). `--life slowdown30,rate_x2,slowdown30` names the changes of
that life in order instead: a rate_x2 (480 s) is a second load at the base rate beside the first (prepared before,
started at the switch, stopped at the scrape that ends it), a prompt_x2 or output_x4 (480 s each) the load's
prompts twice or its outputs four times as long at the base rate (the segment's own load: each segment has one,
planned before and started at its switch), and the stationary stretch after each of those lasts as long as it (the
return to the base traffic is a drift too: found, then a baseline learnt again before the next change).
`--closed N` makes every load of a life a closed loop of N requests in flight instead (each sent as the one
before it is answered, no think time: a batch pipeline's or an agent's traffic), a rate_x2's second load another N:
the users doubled; there the request rate is the server's answer to its users, not their input. `--max-num-seqs N`
caps the requests vLLM runs at once (its `--max-num-seqs`): a closed loop of N users keeps it at its capacity, and
the users a rate_x2 adds wait in its queue (the rate stays, the requests in the server double).
`--uni-executor` runs the model in the engine-core process itself (vLLM's `uni` executor; its CPU build otherwise
runs it in a `VLLM::Worker` process that the engine core spins on, and the worker on it, between steps): the engine
core's wait is then the model's (the thirty-third step); `--omp-threads N` sets its OpenMP threads (by default one
per CPU, unpinned: the model then runs on both CPUs, its second thread spinning at OpenMP's barriers). Each row
says which (`executor`: uni or mp; `omp_threads`: 0 for OpenMP's own).
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from freeze import Freezer  # noqa: E402
from record import (  # noqa: E402
    BASE_RATE,
    SLOWDOWN_FRAC,
    add_out,
    bench,
    check_out,
    cpu_readings,
    scrape_loop,
    thread_schedstats,
    workload,
)

from tuner.engine.checkpoint import write_checkpoint  # noqa: E402
from tuner.measure.datasets import plans_for  # noqa: E402
from tuner.measure.loadgen import config_for, run_sync  # noqa: E402
from tuner.measure.tokenize import load_tokenizer  # noqa: E402
from tuner.monitor.contention import titled  # noqa: E402
from tuner.monitor.hostspeed import HostSpeed, ThreadCpu  # noqa: E402
from tuner.spec import WorkloadSpec  # noqa: E402
from tuner.targets.base import TrialContext  # noqa: E402
from tuner.targets.vllm import VllmOptions, VllmTarget  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
MAX_MODEL_LEN = 1024  # the longest prompt (prompt_x2: 440) and output (output_x4: 240) together fit


# the inputs' changes at the base rate: the workload's lengths (record.workload's options)
INPUTS: dict[str, dict[str, Any]] = {"prompt_x2": {"prompt_mean": 200, "prompt_max": 440},
                                       "output_x4": {"output_mean": 64, "output_max": 240}}


def plan(rate: float) -> list[tuple[str, float, float, str]]:
    """(phase, seconds, the server's slowdown, workload YAML), in order; stationary_b (held out) last."""
    return [
        ("base", 240, 0.0, workload(rate)),
        ("rate_x2", 240, 0.0, workload(rate=2 * rate)),
        ("prompt_x2", 240, 0.0, workload(rate, **INPUTS["prompt_x2"])),
        ("output_x4", 240, 0.0, workload(rate, **INPUTS["output_x4"])),
        ("slowdown30", 300, SLOWDOWN_FRAC, workload(rate)),
        ("stationary_b", 1800, 0.0, workload(rate)),
    ]


# --interleave's and --life's stretches, seconds (--seconds); the changes a life may hold: the server slowed
# (slowdown30), a second load at the base rate beside the first (rate_x2), the load's prompts twice as long
# (prompt_x2) or its outputs four times (output_x4) at the base rate. Each but slowdown30 is a drift whose return
# to the base traffic is a drift too.
INTERLEAVED = {"slowdown30": 240.0, "rate_x2": 480.0, "prompt_x2": 480.0, "output_x4": 480.0, "stationary_b": 300.0}
CHANGES = ("slowdown30", "rate_x2", "prompt_x2", "output_x4")
DRIFTS = CHANGES[1:]
Segment = tuple[str, float, float, float]  # (phase, seconds, the server's slowdown, the extra load's rate factor)


def interleaved(changes: list[str], lead_s: float, seconds: dict[str, float]) -> list[Segment]:
    """The segments of one life, in order: the lead stationary stretch, then each change (slowdown30: the server
    slowed; rate_x2: a second load at the base rate; prompt_x2, output_x4: the load's lengths changed) and a
    stationary stretch after it (its length from `seconds`, else INTERLEAVED; after a drift at least as long as
    the drift: its return is a drift too)."""
    unknown = [c for c in changes if c not in CHANGES]
    if unknown:
        raise ValueError(f"changes {', '.join(unknown)}: each must be one of {', '.join(CHANGES)}")
    length = {name: seconds.get(name, default) for name, default in INTERLEAVED.items()}
    out: list[Segment] = [("stationary_b", lead_s, 0.0, 0.0)]
    for c in changes:
        out.append((c, length[c], SLOWDOWN_FRAC if c == "slowdown30" else 0.0, 1.0 if c == "rate_x2" else 0.0))
        out.append(("stationary_b", max(length["stationary_b"], length[c] if c in DRIFTS else 0.0), 0.0, 0.0))
    return out


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


def named(below: list[int], title: str) -> int | None:
    """The first of the processes `below` whose process title or name holds `title` (the monitor's own lookup,
    tuner.monitor.contention.titled), else None."""
    hits = set(titled(title))
    return next((c for c in below if c in hits), None)


def engine_core(pid: int, below: list[int] | None = None) -> int:
    """vLLM's engine-core process below the server `pid` (its process title names it), else the server itself;
    `below`: the processes below it where already listed (descendants)."""
    core = named(descendants(pid) if below is None else below, "EngineCore")
    return pid if core is None else core


def model_worker(below: list[int]) -> int | None:
    """vLLM's model worker among the server's processes `below` (VLLM::Worker: its multiprocess executor runs the
    model there while the engine core waits for it on a shared-memory queue, spinning), else None."""
    return named(below, "VLLM::Worker")


def held(fz: Freezer) -> None:
    """Say how much of the time a slowdown's freezer held the server stopped (nothing for a phase not slowed)."""
    if fz.share:
        print(f"  held stopped {fz.share_held():.3f} of the time (target {fz.share:.3f})", flush=True)


def parse_seconds(items: list[str], names: list[str], error: Callable[[str], NoReturn]) -> dict[str, float]:
    """--seconds PHASE=S items as {phase: seconds}; `error` (the parser's) on a phase not in `names` or S not > 0."""
    durations: dict[str, float] = {}
    for item in items:
        name, _, value = item.partition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = float("nan")
        if name not in names or not seconds > 0:
            error(f"--seconds {item}: PHASE=S with PHASE one of {', '.join(names)} and S > 0 seconds")
        durations[name] = seconds
    return durations


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_out(ap)
    ap.add_argument("--interval-s", type=float, default=15.0)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every phase's duration (a smoke run)")
    ap.add_argument("--only", default="", help="comma-separated phases to run (default: all)")
    ap.add_argument("--seed", type=int, default=None,
                    help="the load's seed: phase i runs `tuner bench --seed SEED + i` (--interleave, --life: "
                         "segment k's load SEED + 2k, its second load in a rate_x2 SEED + 2k + 1)")
    ap.add_argument("--base-rate", type=float, default=BASE_RATE, help=f"requests/s (default {BASE_RATE})")
    ap.add_argument("--seconds", nargs="+", default=[], metavar="PHASE=S",
                    help="a phase's duration in seconds instead of the plan's (e.g. slowdown30=900: more windows "
                         "of the slowdown, so run.py's trials start at more offsets in it); with --interleave or "
                         "--life, each slowdown30, rate_x2 and stationary_b stretch's after the lead")
    ap.add_argument("--interleave", type=int, default=0, metavar="N",
                    help="one load that never stops, the server slowed N times in it (see above; default 0: the plan)")
    ap.add_argument("--life", default="", metavar="CHANGES",
                    help="instead of --interleave N: the changes of one life in order, comma-separated, each "
                         f"followed by a stationary stretch ({', '.join(CHANGES)}; e.g. slowdown30,rate_x2,slowdown30)")
    ap.add_argument("--closed", type=int, default=0, metavar="N",
                    help="--interleave, --life: every load a closed loop of N requests in flight (no think time) "
                         "instead of Poisson arrivals at --base-rate; a rate_x2's second load another N "
                         "(default 0: open loops)")
    ap.add_argument("--max-num-seqs", type=int, default=0, metavar="N",
                    help="vLLM's --max-num-seqs: the most requests it runs at once (default 0: vLLM's own)")
    ap.add_argument("--speed-probe", action="store_true",
                    help="each row also holds `speed`: the host's own speed beside the server (tuner.monitor."
                         "hostspeed: the CPU time of fixed tasks, medians over the window; unpinned, pinned on each "
                         "CPU (`cpu<n>`) and on the CPU the engine core's busiest thread was on (`own`, `own_cpus`))")
    ap.add_argument("--uni-executor", action="store_true",
                    help="run the model in vLLM's engine-core process (VLLM_ENABLE_V1_MULTIPROCESSING=0, "
                         "--distributed-executor-backend uni) instead of a worker process the engine core spins on")
    ap.add_argument("--omp-threads", type=int, default=0, metavar="N",
                    help="--uni-executor: the model's OpenMP threads (OMP_NUM_THREADS; default: OpenMP's own, one "
                         "per CPU; vLLM's multiprocess executor pins its worker to the CPUs less one reserved)")
    ap.add_argument("--lead-s", type=float, default=600.0,
                    help="--interleave, --life: the stationary stretch before the first change, seconds (default 600)")
    args = ap.parse_args()
    check_out(ap, args)
    if not VLLM_PYTHON.exists():
        ap.error(f"{VLLM_PYTHON} is missing: build vLLM's CPU environment with `make vllm-venv`")
    if not args.base_rate > 0:
        ap.error(f"--base-rate must be > 0 requests/s, got {args.base_rate}")
    if args.max_num_seqs < 0:
        ap.error(f"--max-num-seqs must be >= 1 requests, or 0 for vLLM's own (got {args.max_num_seqs})")
    if args.omp_threads < 0 or (args.omp_threads and not args.uni_executor):
        ap.error(f"--omp-threads N: N >= 1 threads, with --uni-executor (got {args.omp_threads})")
    if args.interleave < 0 or not args.lead_s > 0:
        ap.error(f"--interleave must be >= 0 (got {args.interleave}) and --lead-s > 0 seconds (got {args.lead_s})")
    only = {p for p in args.only.split(",") if p}
    phases = plan(args.base_rate)
    names = [name for name, *_ in phases]
    life = [c for c in args.life.split(",") if c] or ["slowdown30"] * args.interleave
    if args.closed < 0 or (args.closed and not (args.life or args.interleave)):
        ap.error(f"--closed N: N >= 1 requests in flight, with --interleave or --life (got {args.closed})")
    if args.life and args.interleave:
        ap.error("--interleave N and --life CHANGES both name the changes of one life: give one of them")
    if life and only:
        ap.error("--only is for the plan's phases; --interleave and --life record a life of changes instead")
    unknown = only - set(names)
    if unknown:
        ap.error(f"--only: unknown phases {', '.join(sorted(unknown))}; valid: {', '.join(names)}")
    durations = parse_seconds(args.seconds, list(INTERLEAVED) if life else names, ap.error)
    try:  # the life's segments, made (and its changes checked) before vLLM starts
        segments = interleaved(life, args.lead_s, durations) if life else []
    except ValueError:
        ap.error(f"--life {args.life}: each change must be one of {', '.join(CHANGES)}")
    phases = [(name, durations.get(name, seconds), slowdown, wl) for name, seconds, slowdown, wl in phases
              if not only or name in only]
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        model = write_checkpoint(tmp / "tiny", "tiny", max_model_len=MAX_MODEL_LEN)
        extra = ["--max-model-len", str(MAX_MODEL_LEN)]
        env: dict[str, str] = {}
        if args.uni_executor:  # the CPU platform keeps `uni` only when the engine runs without its own MP workers
            extra += ["--distributed-executor-backend", "uni"]
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
            if args.omp_threads:
                env["OMP_NUM_THREADS"] = str(args.omp_threads)
        target = VllmTarget(VllmOptions(model=str(model), python=str(VLLM_PYTHON), device="cpu",
                                        extra_args=extra, env=env), agent_dir=tmp)
        ctx = TrialContext(trial_number=0, state_dir=tmp / "state", label="record-vllm")
        config: dict[str, Any] = {"enforce_eager": True, "cpu_kvcache_space_gib": 1}
        if args.max_num_seqs:
            config["max_num_seqs"] = args.max_num_seqs
        with target.deploy(config, ctx) as dep, \
                gzip.open(args.out, "at", encoding="utf-8") as out:
            assert dep.pid is not None and dep.metrics_url is not None and dep.endpoint is not None
            below = descendants(dep.pid)  # vLLM starts no new processes while serving: listed once
            core = engine_core(dep.pid, below)
            worker = model_worker(below)
            print(f"{time.strftime('%H:%M:%S')} vLLM ready: server {dep.pid}, engine core {core}, model worker "
                  f"{worker}", flush=True)
            state: dict[str, Any] = {"phase": "", "slowdown": 0.0, "seed": "", "starts": False}
            probe = (HostSpeed(follow=ThreadCpu(core), cpus=sorted(os.sched_getaffinity(0))).start()
                     if args.speed_probe else None)
            lock = threading.Lock()
            scraped = threading.Condition(lock)

            def row(text: str) -> dict[str, Any]:
                with lock:
                    r = {"t": time.time(), "phase": state["phase"], "step_delay_ms": 0.0,
                         "step_slowdown_frac": state["slowdown"], "base_rate": args.base_rate,
                         "closed_concurrency": args.closed, "max_num_seqs": args.max_num_seqs,
                         "load_seed": state["seed"], "server": "vllm", "text": text, "cpu": cpu_readings(core),
                         "executor": "uni" if args.uni_executor else "mp", "omp_threads": args.omp_threads}
                    if worker is not None:  # the model's own process (worker_wait.py reads its wait)
                        r["cpu"]["worker_schedstat"] = thread_schedstats(worker)
                    if probe is not None:
                        r["speed"] = probe.take()
                    if state["starts"]:  # the window ending here was all in this phase (a switch after a scrape)
                        r["starts_phase"] = True
                        state["starts"] = False
                    return r

            def write(line: str) -> None:
                with scraped:
                    out.write(line)
                    out.flush()
                    scraped.notify_all()

            stop = threading.Event()
            base_url = dep.metrics_url.removesuffix("/metrics")
            th = threading.Thread(target=scrape_loop, args=(base_url, args.interval_s, stop, row, write), daemon=True)
            th.start()
            client = bench_client(dep.model, str(model))
            pids = [dep.pid, *below]  # the whole server slowed
            try:
                if segments:
                    record_interleaved(segments, args, dep.endpoint, (dep.model, str(model)), pids, state, scraped)
                else:
                    for name, seconds, slowdown, wl in phases:
                        with lock:
                            state.update(phase=name, slowdown=slowdown,
                                         seed="" if args.seed is None else str(args.seed + names.index(name)))
                        print(f"{time.strftime('%H:%M:%S')} phase {name} ({seconds * args.scale:.0f} s, "
                              f"slowdown {slowdown:g})", flush=True)
                        with Freezer(pids, slowdown) as fz:
                            bench(dep.endpoint, wl, seconds * args.scale, state["seed"] or None, client=client)
                        held(fz)
                with lock:
                    state["phase"] = ""
            finally:
                stop.set()
                th.join(args.interval_s + 10)
                if probe is not None:
                    probe.stop()


class SegmentLoad:
    """One load of a life's segment (record_interleaved): the segment's own traffic at the base rate (or a closed
    loop: --closed), or a second load beside it in a rate_x2. Its requests are planned before it starts, so the
    first goes out at the switch; it is stopped at the scrape that ends the segment (the requests then in flight
    abandoned), and the next segment's load starts at that moment: Poisson arrivals have no memory, and a closed
    loop's next users start as its last stop, so the traffic goes on without a seam."""

    def __init__(self, endpoint: str, model: str, tokenizer: str, workload_yaml: str, seconds: float,
                 seed: int) -> None:
        spec = WorkloadSpec.model_validate({**yaml.safe_load(workload_yaml), "duration_s": seconds, "seed": seed})
        self.tok = load_tokenizer(tokenizer, seed=seed)
        self.plans, _ = plans_for(spec, seed=seed, tok=self.tok)
        self.cfg = replace(config_for(spec, endpoint, model), seed=seed)
        self.stop_event = threading.Event()
        self.sent = 0
        self.first_s = float("nan")  # the first request's send, seconds after start()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = 0.0

    def _run(self) -> None:
        result = run_sync(self.cfg, self.plans, tok=self.tok, stop_event=self.stop_event)
        self.sent = len(result.records)
        if result.records:
            self.first_s = result.clock_origin_s + min(r.sent_s for r in result.records) - self._t0

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._thread.start()

    def stop(self, what: str) -> None:
        self.stop_event.set()
        self._thread.join(30)
        print(f"  {what}: {self.sent} requests answered, the first sent {self.first_s:.2f} s after the switch",
              flush=True)


def bench_client(model: str, tokenizer: str) -> tuple[str, ...]:
    """`tuner bench`'s options for the served model: its name and its tokenizer's folder."""
    return ("--model", model, "--tokenizer", tokenizer)


def segment_loads(segments: list[Segment], args: argparse.Namespace, endpoint: str,
                  served: tuple[str, str]) -> list[tuple[SegmentLoad, SegmentLoad | None]]:
    """Each segment's loads, planned before the life starts: its own traffic (the base workload, or the lengths
    its phase changes: INPUTS; seed SEED + 2k for segment k) and, in a rate_x2, a second load at the base rate
    (seed SEED + 2k + 1); each planned 4 scrapes longer than the segment (it ends at a scrape). With --closed N
    each is a closed loop of N requests in flight instead."""
    seed, closed = args.seed or 0, args.closed or None
    out = []
    for k, (name, seconds, _, factor) in enumerate(segments):
        span = seconds * args.scale + 4 * args.interval_s
        own = SegmentLoad(endpoint, *served, workload(args.base_rate, **INPUTS.get(name, {}), closed=closed), span,
                          seed + 2 * k)
        more = (SegmentLoad(endpoint, *served, workload(args.base_rate * factor, closed=closed), span,
                            seed + 2 * k + 1)
                if factor else None)
        out.append((own, more))
    return out


def record_interleaved(segments: list[Segment], args: argparse.Namespace, endpoint: str,
                       served: tuple[str, str], pids: list[int], state: dict[str, Any],
                       scraped: threading.Condition) -> None:
    """The life's `segments` in order, one load each (SegmentLoad: its traffic, the lengths changed in a prompt_x2
    or output_x4) and a second beside it in a rate_x2, while the server is slowed in its slowdown ones; each
    segment ends at the first scrape after its time is up, and the next (its phase, its freezer, its loads)
    follows that scrape at once, the next row marked `starts_phase`: every window is all in the phase its end row
    names. `served`: the model's name and its tokenizer's folder, for every load.
    (The lives recorded before 2026-12-06, recorded-vllm-interleaved*.jsonl.gz and recorded-vllm-life.jsonl.gz, ran
    one `tuner bench` load through the whole life instead, seed SEED, and a rate_x2's second load at seed SEED + 1 +
    k; the two interleaved streams also before the freezer held to that scrape: each slowdown's last window ran
    unslowed after its time was up until it, a part of one window.)"""
    loads = segment_loads(segments, args, endpoint, served)
    end = time.monotonic()
    stopping: list[tuple[SegmentLoad, str]] = []  # the previous segment's loads, stopped at the scrape that ended it
    slowed: Freezer | None = None
    for (name, seconds, slowdown, _), (own, more) in zip(segments, loads, strict=True):
        end += seconds * args.scale
        with Freezer(pids, slowdown) as fz:  # slowed (or not) from the switch to the scrape that ends the segment
            with scraped:
                state.update(phase=name, slowdown=slowdown, seed=str(own.cfg.seed), starts=state["phase"] != "")
                own.start()
                if more is not None:
                    more.start()
            print(f"{time.strftime('%H:%M:%S')} {name} ({seconds * args.scale:.0f} s, slowdown {slowdown:g}"
                  f"{', a second load' if more is not None else ''})", flush=True)
            for load, what in stopping:  # joined once the next segment's loads run: no gap in the traffic
                load.stop(what)
            if slowed is not None:
                held(slowed)
            stopping = [(own, "its load"), *([(more, "the second load")] if more is not None else [])]
            time.sleep(max(0.0, end - time.monotonic()))
            with scraped:  # the segment's last window ends at the next scrape; the next segment follows it at once
                if not scraped.wait(timeout=2 * args.interval_s + 10):
                    raise SystemExit(f"no scrape of the server's /metrics in {2 * args.interval_s + 10:g} s: the "
                                     f"scrape thread stopped")
                for load, _ in stopping:
                    load.stop_event.set()
        slowed = fz
    for load, what in stopping:
        load.stop(what)
    if slowed is not None:
        held(slowed)


if __name__ == "__main__":
    main()
