"""Detection experiment: false alarms on stationary traffic and delay, misses and classification on injected
changes, from /metrics streams recorded from the reference engine (record.py) and replayed through
tuner.monitor's Monitor at full speed.

    python experiments/detection/run.py --streams experiments/detection/streams.jsonl.gz [--hours 240]

- stationary, real order: the recorded stationary phase as it came (the real run against the engine), then in
  its own order from every window of its steady state as the start of a baseline (the steady state: after the
  fresh engine's warm-up, cut by MSER-5 from the stream alone).
- stationary, replayed: streams of --hours in all, made by a bootstrap of the steady-state windows, once window
  by window and once in blocks of --block windows (they keep the noise's autocorrelation, and put distant
  stretches side by side at their seams), each stream `--stream-hours` long; its first learn_windows windows, the
  baseline's learning stretch, hold no window twice (a live monitor never learns from a window repeated).
- injected: a steady-state stationary stretch (learning + --pre windows) followed by windows of a recorded
  changed phase: rate x2, prompt length x2, output length x4 (each a `tuner bench` load of its own), the
  engine's per-step delay raised (a real server slowdown at the same load), the stationary windows' latencies
  x1.3 (the same slowdown as a model) and x2 (a server twice as slow: the goal's "no miss of any x2 change"),
  and a GPU power throttle on the NVML double
  (tests/support/nvml_double.py). --trials trials each at random offsets; delay counts windows from the change
  (1: found at the end of the first changed window), and for a recorded drift also from the window in which its
  input had moved half-way to the phase's level (onset(): a phase's first windows can precede its load); a
  miss finds nothing within --post windows. Beside each slowdown: the windows Siegmund's approximation gives
  the learnt ITL-mean CUSUM to find it (expected_delay(): what that signal's noise allows at the budget).
GPU signals come from the NVML double (noise --gpu-noise of each reading), except in a stream recorded on a GPU
(record_gpu.py), whose rows carry the real GPU's readings through the monitor's NVML path: there the double is
not read and its throttle is not injected (the stream's own gpu_neighbour phases are the real GPU faults).
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import record  # noqa: E402
import record_gpu  # noqa: E402

from tests.support.nvml_double import ControlledNvml  # noqa: E402
from tuner.measure.scrape import parse  # noqa: E402
from tuner.monitor.classify import Event, Monitor  # noqa: E402
from tuner.monitor.config import RULES, TESTS, MonitorConfig, host_speed_signal_problem  # noqa: E402
from tuner.monitor.contention import CpuSteal, CpuWait, proc_stat_steal, schedstat_ns  # noqa: E402
from tuner.monitor.detect import windows_to_find  # noqa: E402
from tuner.monitor.expect import ChampionExpectation, from_simulator  # noqa: E402
from tuner.monitor.hostspeed import TASKS, reading  # noqa: E402
from tuner.monitor.signals import GPU, INPUTS, LATENCIES, window_signals  # noqa: E402
from tuner.monitor.telemetry import NvmlTelemetry  # noqa: E402
from tuner.sim.refcost import StepModel  # noqa: E402
from tuner.spec import WorkloadSpec  # noqa: E402

Window = dict[str, float]
Ev = tuple[int, str, str, bool]  # an event: window index, kind, cause, reopened (the same episode as before)
EXPECT = {"rate_x2": "drift", "prompt_x2": "drift", "output_x4": "drift", "slowdown30": "anomaly",
          "slowdown_model": "anomaly", "slowdown_x2": "anomaly", "gpu_throttle": "anomaly",
          "gpu_neighbour": "anomaly", "gpu_neighbour_light": "anomaly"}
MODELS = {"slowdown_model": 1.3, "slowdown_x2": 2.0}  # a modelled slowdown: the stationary windows' latencies x it


# MonitorConfig.wait_law's choices, as the table's header names them
LAWS = {"window": "the window", "ready": "the time ready to run",
        "auto": "the time ready to run where the window's is one and a half times its error or more, the window "
                "where it is half its error or less, by degrees between"}
BLEND = {"usual": ", the degree set by the median window share of the latest learning-length windows",
         "window": ""}  # --wait-blend
SHARE_ERROR = {True: ", counted beyond the one at the baseline's usual wait", False: ""}  # --wait-error-relative
STARVED = {True: ", beyond it against the starved windows' own baseline", False: ""}  # --starved-baseline


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a recorded stream (one cut off while it was written ends at its last whole line)."""
    rows = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        while True:
            try:
                line = f.readline()
            except (EOFError, OSError):
                break
            if not line:
                break
            try:
                rows.append(json.loads(line))
            except ValueError:
                break
    return [r for r in rows if r["phase"] and r["text"]]


Row = dict[str, Any]


def windows(path: Path, gpu_readings: str = "gpu", every: int = 1,
            host_probe: str = "index") -> Iterator[tuple[str, float, Window, Row, Row]]:
    """(phase, end time, signals, the start and end rows) of each window of a recorded stream in order: consecutive
    scrapes of one phase, or a scrape and the next that starts a phase (`starts_phase`: record_vllm.py --interleave
    switched right after the first, so the window was all in the second's phase), with cpu_wait_frac from the
    engine's schedstat through the monitor's own CpuWait (streams recorded before it have none) and cpu_steal_frac
    from the host's /proc/stat line through its CpuSteal (where recorded), and a GPU's readings (the row's
    `gpu_readings`: "gpu", the monitor's, or "gpu_instant", one read at the window's end, where recorded; else
    "gpu"), and the host's speed where probed (`host_probe`: "index", the product's probe_index of the unpinned
    runs; "own", of the runs on the engine's CPU; or one task's median). `every`: a window spans that many scrape
    intervals (every n-th scrape kept: a slower scrape of the same traffic; a GPU reading then is of the last
    interval only)."""
    rows = read_rows(path)[::every]
    for a, b in zip(rows, rows[1:], strict=False):
        if a["phase"] != b["phase"] and not (every == 1 and b.get("starts_phase")):
            continue
        sig = window_signals(parse(a["text"]), parse(b["text"]), b["t"] - a["t"])
        if sig is None:
            continue
        if "cpu" in a and "cpu" in b:
            wait = CpuWait("pid:0")
            wait.update(a["t"], schedstat_ns(a["cpu"]["schedstat"]))
            sig.update(wait.update(b["t"], schedstat_ns(b["cpu"]["schedstat"])))
            if "stat" in a["cpu"] and "stat" in b["cpu"]:  # the host's steal (recordings from 2026-12-02 on)
                steal = CpuSteal()
                steal.update(proc_stat_steal(a["cpu"]["stat"]))
                sig.update(steal.update(proc_stat_steal(b["cpu"]["stat"])))
        speed = b.get("speed") or {}  # the host's speed probe beside the server (record_vllm.py --speed-probe)
        probe = reading(speed, host_probe)
        if probe:
            sig["host_probe_us"] = probe
        sig.update(b.get(gpu_readings, b.get("gpu")) or {})  # a GPU's readings of the window (record_gpu.py)
        yield b["phase"], b["t"], sig, a, b


Phases = dict[str, list[tuple[float, Window]]]
Order = list[tuple[str, Window]]  # (phase, signals) of every window in recorded order


def load_stream(path: Path, gpu_readings: str = "gpu",
                every: int = 1, host_probe: str = "index") -> tuple[Phases, dict[str, dict[str, float]], Order | None]:
    """One read of a stream: phase -> its windows (end time, signals; windows()), each phase's settings and median
    load average, and, for a stream recorded by record_vllm.py --interleave (a window that starts its phase), the
    same windows in recorded order (None for a stream of phases recorded apart)."""
    out: Phases = {}
    info: dict[str, dict[str, float]] = {}
    loads: dict[str, list[float]] = {}
    order: Order = []
    marked = False
    for phase, t, sig, a, b in windows(path, gpu_readings, every, host_probe):
        if "cpu" in a and "cpu" in b:
            loads.setdefault(phase, []).append(float(b["cpu"]["loadavg"].split()[0]))
        out.setdefault(phase, []).append((t, sig))
        order.append((phase, sig))
        marked = marked or bool(b.get("starts_phase"))
        info[phase] = {"step_delay_ms": b["step_delay_ms"], "slowdown": b.get("step_slowdown_frac", 0.0),
                       "load": statistics.median(loads[phase]) if phase in loads else math.nan}
    return out, info, order if marked else None


def load(path: Path, gpu_readings: str = "gpu", every: int = 1,
         host_probe: str = "index") -> tuple[Phases, dict[str, dict[str, float]]]:
    """Phase -> its windows, and each phase's settings and median load average (load_stream())."""
    phases, info, _ = load_stream(path, gpu_readings, every, host_probe)
    return phases, info


def interleaved(path: Path, gpu_readings: str = "gpu") -> Order | None:
    """The windows of a stream recorded by record_vllm.py --interleave in recorded order; None for a stream of phases
    recorded apart (load_stream())."""
    return load_stream(path, gpu_readings)[2]


def expectation(model_path: Path | None) -> ChampionExpectation | None:
    """The recorded engine's (the defaults: the champion here) expectation from the calibrated simulator at the
    recording's base workload (record.py)."""
    if model_path is None:
        return None
    wl = WorkloadSpec.model_validate({**yaml.safe_load(record.workload()), "duration_s": 120})
    return from_simulator(StepModel.load(model_path), {}, wl)


def recorded_gpu(w: Window) -> bool:
    """Whether a window carries a real GPU's readings (record_gpu.py): the double is then not read."""
    return any(k in w for k in GPU)


class Gpu:
    """GPU signals per window from the NVML double (through the monitor's own NVML path)."""

    def __init__(self, noise: float, seed: int) -> None:
        self.nv = ControlledNvml(1, noise_frac=noise, seed=seed)
        self.tel = NvmlTelemetry([0], nvml=self.nv)

    def read(self) -> Window:
        return self.tel.read()


def warmup(windows: list[Window], cfg: MonitorConfig, expect: ChampionExpectation | None, batch: int = 5) -> int:
    """The windows of a stationary stream's start that are not yet steady state (a fresh engine's first minutes
    run slower), by MSER-5 (White 1997, the truncation rule of simulation output analysis): the cut d, in
    whole batches of 5 windows and within the first half, that minimises the squared standard error of the
    mean of what is left, sum((y - mean)^2) / (n - d)^2 over batch means. y: the log ITL mean the monitor
    judges (its residual: against the expectation, corrected for the CPU wait). Chosen from the stream alone,
    before any replay."""
    m = Monitor(cfg, expect)
    for i, w in enumerate(windows):
        m.observe(cfg.interval_s * i, w)
    y = [math.log(r) for r in m.tracks["itl_ms_mean"].residuals]
    means = [statistics.fmean(y[i:i + batch]) for i in range(0, len(y) - batch + 1, batch)]
    if len(means) < 4:
        return 0

    def mse(d: int) -> float:
        rest = means[d:]
        mu = statistics.fmean(rest)
        return sum((v - mu) ** 2 for v in rest) / len(rest) ** 2
    return batch * min(range(len(means) // 2 + 1), key=mse)


MAX_DRAWS = 10_000  # draws for a learning stretch of distinct windows before one may repeat (bootstrap)


def bootstrap(windows: list[Window], n: int, block: int, rng: random.Random, distinct: int = 0) -> list[Window]:
    """`n` windows in blocks of `block` consecutive ones drawn at random starts; the first `distinct` of them (the
    learning stretch) from blocks that share no window, as a live monitor learns from windows that all differ (a
    learning stretch of one block repeated learns the spread of fewer windows than it counts, then takes the
    rest of the stream for anomalies: experiments/detection, twentieth step)."""
    out: list[Window] = []
    used: set[int] = set()
    tries = 0
    while len(out) < n:
        i = rng.randrange(0, len(windows) - block + 1)
        if len(out) < distinct:
            span = set(range(i, i + min(block, distinct - len(out))))
            tries += 1
            if span & used and tries < MAX_DRAWS:  # (a stream too short for it: a window may repeat)
                continue
            used |= span
        out.extend(windows[i:i + block])
    return out[:n]


def replay(windows: list[Window], cfg: MonitorConfig, gpu: Gpu, expect: ChampionExpectation | None,
           at: int | None = None, on_change: Callable[[], None] | None = None,
           unjudged: list[int] | None = None, monitor: list[Monitor] | None = None,
           full: list[tuple[int, Event]] | None = None) -> list[Ev]:
    """(window index, kind, cause, reopened) of every event; `on_change` runs before window `at`; `unjudged` gets the
    count of windows whose latencies were not judged, `monitor` the Monitor itself, `full` each event whole with its
    window index."""
    m = Monitor(cfg, expect)
    if monitor is not None:
        monitor.append(m)
    out: list[Ev] = []
    for i, w in enumerate(windows):
        if at is not None and i == at and on_change is not None:
            on_change()
        for e in m.observe(cfg.interval_s * i, w if recorded_gpu(w) else {**w, **gpu.read()}):
            out.append((i, e.kind, e.cause, e.reopened))
            if full is not None:
                full.append((i, e))
    if unjudged is not None:
        unjudged.append(m.unjudged)
    return out


def bootstrap_replays(label: str, stat: list[Window], block: int, cfg: MonitorConfig,
                      expect: ChampionExpectation | None, args: argparse.Namespace,
                      unjudged: list[int] | None = None) -> Iterator[list[Ev]]:
    """The events of each replayed stream of row `label`'s bootstrap (bootstrap_streams), each with its own GPU
    double."""
    for s, windows in bootstrap_streams(label, stat, block, cfg, args):
        yield replay(windows, cfg, Gpu(args.gpu_noise, 100 + s), expect, unjudged=unjudged)


def bootstrap_streams(label: str, stat: list[Window], block: int, cfg: MonitorConfig,
                      args: argparse.Namespace) -> Iterator[tuple[int, list[Window]]]:
    """(index, windows) of each replayed stream of row `label`'s bootstrap (--hours in streams of --stream-hours, in
    blocks of `block` windows of the steady state `stat`), from the row's own draws: a row is the same whatever
    other streams the run has."""
    rng = random.Random(f"{args.seed}/{label}/{block}")
    n = int(args.stream_hours * 3600 / cfg.interval_s)
    for s in range(max(1, round(args.hours / args.stream_hours))):
        yield s, bootstrap(stat, n + cfg.learn_windows, block, rng,
                           distinct=0 if args.learning_repeats else cfg.learn_windows)


def event_key(kind: str, cause: str, reopened: bool) -> str:
    """An event's name in the table: kind/cause, a reopening marked so."""
    return f"{kind}/{cause}{' reopened' if reopened else ''}"


def tally(ev: list[Ev], kinds: dict[str, int]) -> tuple[int, int]:
    """Add a replay's events to `kinds` (kind/cause, a reopening marked so); its (events, episodes): drifts,
    anomalies and saturations, and those of them that opened a new episode (MonitorConfig.reopen_gap_s)."""
    events = episodes = 0
    for _, k, c, again in ev:
        key = event_key(k, c, again)
        kinds[key] = kinds.get(key, 0) + 1
        if k != "recovery":
            events += 1
            episodes += not again
    return events, episodes


def rate_cells(events: int, episodes: int, hours: float) -> str:
    """The table's events, per 24 h, episodes, per 24 h."""
    return f"{events} | {events / hours * 24:.2f} | {episodes} | {episodes / hours * 24:.2f}"


def kinds_cell(kinds: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) or "-"


def false_alarms(label: str, recorded: list[Window], cut: int, cfg: MonitorConfig,
                 expect: ChampionExpectation | None, args: argparse.Namespace) -> None:
    """The rows of one stationary stream: as recorded (from its start, as the monitor saw it), then from every
    window after its warm-up (`cut` windows) as a start, then its steady state bootstrapped window by window
    and in blocks (bootstrap_replays). Each row counts events and episodes (a reopening is not a new one)."""
    blind: list[int] = []
    ev = replay(recorded, cfg, Gpu(args.gpu_noise, args.seed), expect, unjudged=blind)
    watched = max(1, len(recorded) - cfg.learn_windows)
    hours = watched * cfg.interval_s / 3600
    events, episodes = tally(ev, {})
    print(f"| {label} | as recorded | {hours:.2f} | {rate_cells(events, episodes, hours)} | "
          f"{', '.join(f'{event_key(k, c, again)}@{i}' for i, k, c, again in ev) or '-'} | "
          f"{blind[0] / watched:.0%} |")
    stat = recorded[cut:]
    # a baseline learnt at every window of the steady state in turn, the stream then replayed in its own order
    # to its end: no seams (a block bootstrap's seams put two distant levels of a wandering stream side by
    # side), every alarm counted once per start that saw it
    starts, watched = 0, 0
    at: set[int] = set()
    blind = []
    kinds: dict[str, int] = {}
    events = episodes = 0
    for s in range(0, len(stat) - cfg.learn_windows - args.min_watch + 1):
        ev = replay(stat[s:], cfg, Gpu(args.gpu_noise, 200 + s), expect, unjudged=blind)
        starts += 1
        watched += len(stat) - s - cfg.learn_windows
        e, p = tally(ev, kinds)
        events, episodes = events + e, episodes + p
        at.update(cut + s + i for i, k, _, _ in ev if k != "recovery")
    if starts:
        hours = watched * cfg.interval_s / 3600
        print(f"| {label} | as recorded, from each of {starts} starts after a warm-up of {cut} windows "
              f"(alarms at windows {', '.join(map(str, sorted(at))) or 'none'}) | {hours:.1f} | "
              f"{rate_cells(events, episodes, hours)} | {kinds_cell(kinds)} | {sum(blind) / watched:.0%} |")
    n = int(args.stream_hours * 3600 / cfg.interval_s)
    for block in (1, args.block):
        total_h, kinds, blind = 0.0, {}, []
        events = episodes = 0
        for ev in bootstrap_replays(label, stat, block, cfg, expect, args, unjudged=blind):
            total_h += n * cfg.interval_s / 3600
            e, p = tally(ev, kinds)
            events, episodes = events + e, episodes + p
        how = "bootstrap, window by window" if block == 1 else f"bootstrap, blocks of {block} windows"
        print(f"| {label} | {how} | {total_h:.0f} | {rate_cells(events, episodes, total_h)} | {kinds_cell(kinds)} | "
              f"{sum(blind) / (len(blind) * n):.0%} |")


def onset(before: list[Window], after: list[Window]) -> int:
    """Where in `after` (a recorded changed phase) the input that phase changed first moved at least half-way
    (on the log scale) from `before`'s median to the phase's own: the change point a delay counts from. The
    changed input is the one whose median moved most; 0 where none moved by 10 % (a slowdown: the same load)."""
    def med(ws: list[Window], k: str) -> float:
        return statistics.median(w[k] for w in ws if w.get(k, 0) > 0)
    moved = {k: math.log(med(after, k) / med(before, k)) for k in INPUTS}
    key = max(moved, key=lambda k: abs(moved[k]))
    if abs(moved[key]) < math.log(1.1):
        return 0
    base = med(before, key)
    for t, w in enumerate(after):
        if w.get(key, 0) > 0 and math.log(w[key] / base) / moved[key] >= 0.5:
            return t
    return 0


def expected_delay(m: Monitor, signal: str, frac: float) -> float | None:
    """Siegmund's approximation of the mean windows a signal's learnt one-sided CUSUM takes to find its level
    x(1 + frac) (the design's k and h, the baseline's scale): what its noise allows at the false-alarm budget."""
    tr = m.tracks.get(signal)
    return None if tr is None or tr.baseline is None else windows_to_find(tr.baseline, tr.cusum, frac)


def injected(label: str, name: str, phases: dict[str, list[tuple[float, Window]]], cut: int, cfg: MonitorConfig,
             expect: ChampionExpectation | None, args: argparse.Namespace) -> None:
    """The rows of the injected changes, each trial a stretch of stationary phase `name` (its steady state:
    after a warm-up of `cut` windows) followed by a change recorded with it (its file's label: the part of
    `name` before '/')."""
    stat = [w for _, w in phases[name]][cut:]
    lead = cfg.learn_windows + args.pre
    group = name.rpartition("/")[0]
    mine = {n.rpartition("/")[2]: ws for n, ws in phases.items() if n.rpartition("/")[0] == group}
    if len(stat) <= lead + args.post:
        print(f"| {label} | (none) | {len(stat)} windows: too few for {lead} before the change and {args.post} after "
              f"| 0 | | | | | | | | | | |")
        return
    doubled = () if recorded_gpu(stat[0]) else ("gpu_throttle",)  # the double's throttle: no real GPU's readings
    for change in [c for c in EXPECT if c in args.changes and (c in mine or c in (*MODELS, *doubled))]:
        delays_w: list[int] = []
        from_rise: list[int] = []  # the delay counted from the changed input's rise (onset) instead
        bound: list[float] = []  # the ITL mean's expected delay of a slowdown_to_find_frac slowdown
        missed, right, sat, had_early = 0, 0, 0, 0
        rng = random.Random(f"{args.seed}/{label}/{change}")  # the row's own draws
        src = [w for _, w in mine[change]] if change in mine else []
        rises = onset(stat, src) if change in mine and EXPECT[change] == "drift" else 0
        firsts: dict[str, int] = {}
        for tr in range(args.trials):
            i = rng.randrange(0, len(stat) - lead - args.post)
            before = stat[i:i + lead]
            gpu = Gpu(args.gpu_noise, 1000 + tr)
            hook = None
            rise = 0
            if change in mine:
                j = rng.randrange(0, offsets(len(src), args.post))
                after = src[j:j + args.post]
                rise = rises - j
                source = f"recorded phase `{group + '/' if group else ''}{change}`"
            elif change in MODELS:
                after = [{k: v * MODELS[change] if k in LATENCIES else v for k, v in w.items()}
                         for w in stat[i + lead:i + lead + args.post]]
                source = f"stationary windows, latencies x{MODELS[change]:g}"
            else:
                after = stat[i + lead:i + lead + args.post]
                hook = lambda nv=gpu.nv: nv.throttle(cap_w=350.0, clock_frac=0.7)  # noqa: E731
                source = "NVML double: 350 W cap, SM clock x0.7"
            mon: list[Monitor] = []
            ev = replay(before + after, cfg, gpu, expect, at=lead, on_change=hook, monitor=mon)
            est = expected_delay(mon[0], "itl_ms_mean", cfg.slowdown_to_find_frac or 0.3)
            if est is not None:
                bound.append(est)
            after_ev = [e for e in ev if e[0] >= lead and e[1] != "recovery"]
            early = [e for e in ev if e[0] < lead]
            sat += any(e[1] == "saturation" for e in after_ev)
            found = [e for e in after_ev if e[1] != "saturation"]  # saturation is reported beside drift/anomaly
            had_early += bool(early)
            if not found:
                missed += 1
                continue
            k = found[0]
            delays_w.append(k[0] - lead + 1)
            from_rise.append(k[0] - lead + 1 - max(0, rise))
            right += k[1] == EXPECT[change]
            firsts[f"{k[1]}/{k[2]}"] = firsts.get(f"{k[1]}/{k[2]}", 0) + 1
        med = statistics.median(delays_w) if delays_w else float("nan")
        p90 = p90_of(sorted(delays_w)) if delays_w else float("nan")
        rise_med = f"{statistics.median(from_rise):g}" if from_rise and EXPECT[change] == "drift" else "-"
        never = sum(1 for b in bound if math.isinf(b))  # the shift within the allowance: expected never found
        est_med = (f"{statistics.median(bound):.1f} ({never}/{len(bound)} never)"
                   if bound and change in ("slowdown30", *MODELS) else "-")
        print(f"| {label} | {change} | {source} | {args.trials} | {len(delays_w)} | {missed} | {med:g} | {p90:g} | "
              f"{rise_med} | {est_med} | "
              f"{right}/{args.trials} | {', '.join(f'{k} {v}' for k, v in sorted(firsts.items()))} | {sat} | "
              f"{had_early} |")


def offsets(phase_windows: int, post: int) -> int:
    """The starts a trial's `post` changed windows can take in a recorded phase of `phase_windows` windows (at least
    one: a phase too short gives every trial its windows from the first)."""
    return max(1, phase_windows - post)


def recorded_offsets(phases: dict[str, list[tuple[float, Window]]], names: list[str],
                     args: argparse.Namespace) -> str:
    """A line naming, for each recorded changed phase the trials above drew from, its windows and the offsets its
    trials' --post changed windows can start at: a phase of --post + 1 windows or fewer gives every trial the same
    windows, so its row is one recorded realisation watched after many baselines."""
    groups = {name.rpartition("/")[0] for name in names}
    cells = []
    for phase, ws in phases.items():
        group, _, change = phase.rpartition("/")
        if group in groups and change in EXPECT and change in args.changes:
            starts = offsets(len(ws), args.post)
            cells.append(f"`{phase}` {len(ws)} windows, {starts} offset{'s' if starts > 1 else ''}"
                         f"{' (every trial the same windows)' if starts == 1 else ''}")
    return (f"\nRecorded changes: the windows of each phase and the offsets its trials' {args.post} changed windows "
            f"start at: {'; '.join(cells)}.") if cells else ""


def after_start(label: str, recorded: list[Window], x: float, cfg: MonitorConfig,
                expect: ChampionExpectation | None, args: argparse.Namespace) -> None:
    """A row per stationary stream watched from its engine's start (its warm-up in the learning windows): the
    latencies times `x` from window `at` on, for every `at` from learn_windows + 10 to the last that leaves
    --post windows, with the warm-up rule (MonitorConfig.warmup_p) and without it."""
    if len(recorded) - args.post + 1 <= cfg.learn_windows + 10:
        return
    cells = []
    for warm in (cfg, replace(cfg, warmup_p=None)):
        delays, trials = [], 0
        for at in range(cfg.learn_windows + 10, len(recorded) - args.post + 1):
            after = [{k: v * x if k in LATENCIES else v for k, v in w.items()}
                     for w in recorded[at:at + args.post]]
            ev = replay(recorded[:at] + after, warm, Gpu(args.gpu_noise, 300 + at), expect)
            trials += 1
            found = [i for i, k, _, _ in ev if i >= at and k == "anomaly"]
            early = [i for i, k, _, _ in ev if i < at and k != "recovery"]
            if found and not early:
                delays.append(found[0] - at + 1)
        med = statistics.median(delays) if delays else float("nan")
        cells.append(f"{len(delays)}/{trials} | {med:g}")
    print(f"| {label} | x{x:g} | {' | '.join(cells)} |")


SLOW, CALM, DRIFT = "slowdown30", "stationary_b", "rate_x2"  # a life's phases (record_vllm.py --interleave, --life)
# a life's drifts (record_vllm.py --life) and the return to the base traffic after each: a drift too
RETURNS = {DRIFT: "rate back", "prompt_x2": "prompt back", "output_x4": "output back"}
RETURN = RETURNS[DRIFT]
EXPECTED = {SLOW: "anomaly", **{d: "drift" for d in RETURNS}, **{r: "drift" for r in RETURNS.values()}}
GRACE_WINDOWS = 4  # windows after a change's horizon in which an event is still its own (its queue drains)


def changes_of(seq: Order) -> list[tuple[int, int, str]]:
    """The (first, end, change) window indices (end exclusive) of each change in a life: each run of windows of a
    changed phase (slowdown30, or a drift: rate_x2, prompt_x2, output_x4), and after a drift the return to the base
    traffic (RETURNS: the first window of the stationary stretch that follows it, one window long)."""
    runs: list[tuple[int, int, str]] = []
    for i, (phase, _) in enumerate(seq):
        if (phase == SLOW or phase in RETURNS) and runs and runs[-1][1] == i and runs[-1][2] == phase:
            runs[-1] = (runs[-1][0], i + 1, phase)
        elif phase == SLOW or phase in RETURNS:
            runs.append((i, i + 1, phase))
        elif runs and runs[-1][1] == i and runs[-1][2] in RETURNS:
            runs.append((i, i + 1, RETURNS[runs[-1][2]]))
    return runs


def life_from_args(script: str) -> tuple[str, Order, MonitorConfig, ChampionExpectation | None]:
    """A script's life from run.py's options on its command line: the label of the first held-out set's stream,
    its windows in recorded order (record_vllm.py --life or --interleave), the monitor's config and expectation;
    exits naming `script` where that stream is no life."""
    args = parser().parse_args()
    logging.getLogger("tuner.monitor").setLevel(logging.ERROR)
    _, _, _, cfg, expect, lives = setup(args)
    tag = args.held_out[0].rpartition("/")[0]
    if tag not in lives:
        raise SystemExit(f"{script}: --held-out {args.held_out[0]}: not the stationary phase of a stream recorded "
                         "with record_vllm.py --life or --interleave")
    return tag, lives[tag], cfg, expect


def episodes_of(seq: Order) -> list[tuple[int, int]]:
    """The (first, end) window indices of each run of slowdown windows in an interleaved stream (end exclusive)."""
    return [(a, b) for a, b, change in changes_of(seq) if change == SLOW]


def own_life(label: str, seq: Order, cfg: MonitorConfig, expect: ChampionExpectation | None,
             args: argparse.Namespace, lives: list[str], drifts: list[str]) -> None:
    """The rows of a stream recorded with its server slowed several times in its own life (record_vllm.py
    --interleave), and its traffic changed in it (--life: each drift and its return), replayed in its recorded order
    from every start in its lead stretch that learns its baseline before the first change (the fresh server's first
    window among them: the monitor's own warm-up rule, as it would start with its server): per change, from how
    many starts an event came within --post windows of its first window, how many of those what it should be
    (EXPECTED), the delays from its first window, and the starts at whose change an anomaly was still open (no new
    event to find); then every event outside the changes (each up to --post windows from its first, or its end
    where later, and GRACE_WINDOWS after) as a false alarm, per 24 h of the stationary windows watched: the stream's
    summary row appended to `lives`, its traffic's changes' rows to `drifts`."""
    ws = [w for _, w in seq]
    runs = changes_of(seq)
    if not runs or runs[0][0] < cfg.learn_windows + 1:
        print(f"| {label} | (none) | {len(runs)} changes, the first at window {runs[0][0] if runs else '-'}: "
              f"too few windows before it for a baseline | | | | | | |")
        return
    found: list[list[tuple[int, str]]] = [[] for _ in runs]  # per change: (delay, kind) of each start's event
    still_open = [0] * len(runs)
    kinds: dict[str, int] = {}
    at: set[int] = set()
    starts = list(range(runs[0][0] - cfg.learn_windows))
    watched = events = episodes = 0
    outside = [all(not a <= i < max(b, a + args.post) + GRACE_WINDOWS for a, b, _ in runs) for i in range(len(ws))]
    for s in starts:
        ev = replay(ws[s:], cfg, Gpu(args.gpu_noise, 400 + s), expect)
        ev = [(i + s, k, c, again) for i, k, c, again in ev]
        watched += sum(outside[s + cfg.learn_windows:])
        for n, (a, _, _) in enumerate(runs):
            opened = sum((k == "anomaly") - (k == "recovery" and c == "anomaly") for i, k, c, _ in ev if i < a)
            hit = next(((i - a + 1, k) for i, k, _, _ in ev if a <= i < a + args.post
                        and k not in ("recovery", "saturation")), None)
            if hit is not None:
                found[n].append(hit)
            elif opened > 0:
                still_open[n] += 1
        stray = [e for e in ev if outside[e[0]] and e[1] != "recovery"]
        e, p = tally(stray, kinds)
        events, episodes = events + e, episodes + p
        at.update(i for i, *_ in stray)
    slow = [n for n, (_, _, change) in enumerate(runs) if change == SLOW]
    for m, n in enumerate(slow):
        a, b, _ = runs[n]
        right = sum(k == "anomaly" for _, k in found[n])
        print(f"| {label} | {m + 1} | {a} | {b - a} | {len(found[n])}/{len(starts)} | {right} | "
              f"{_median_p90(sorted(d for d, _ in found[n]))} | {still_open[n]} |")
    for n, (a, b, change) in enumerate(runs):
        if change != SLOW:
            right = sum(k == EXPECTED[change] for _, k in found[n])
            drifts.append(f"| {label} | {change} | {a} | {b - a} | {len(found[n])}/{len(starts)} | {right} | "
                          f"{_median_p90(sorted(d for d, _ in found[n]))} | {still_open[n]} |")
    on = [found[n] for n in slow]
    lives.append(f"| {label} | {len(starts)} ({starts[0]}-{starts[-1]}) | {len(starts) * len(slow)} | "
                 f"{sum(map(len, on))} | {sum(k == 'anomaly' for got in on for _, k in got)} | "
                 f"{_median_p90(sorted(d for got in on for d, _ in got))} | {watched * cfg.interval_s / 3600:.1f} | "
                 f"{rate_cells(events, episodes, watched * cfg.interval_s / 3600)} | {kinds_cell(kinds)} | "
                 f"{', '.join(map(str, sorted(at))) or 'none'} |")


def p90_of(delays: list[int]) -> int:
    """The tables' p90 of sorted delays: the value at 0.9 of the way from the first to the last."""
    return delays[int(0.9 * (len(delays) - 1))]


def _median_p90(delays: list[int]) -> str:
    """Two table cells: the median and the p90 (p90_of) of sorted delays ('-' where none)."""
    if not delays:
        return "- | -"
    return f"{statistics.median(delays):g} | {p90_of(delays):g}"


def _speed_signal(text: str) -> tuple[str, float]:
    """A latency judged at the host's speed and its share of the elasticity, LATENCY or LATENCY=SHARE (argparse's
    type; MonitorConfig.host_speed_signals)."""
    name, _, share_text = text.partition("=")
    try:
        share = float(share_text) if share_text else 1.0
    except ValueError:
        share = math.nan  # not a number: refused as a share out of range
    if (problem := host_speed_signal_problem(name, share)) is not None:
        raise argparse.ArgumentTypeError(f"{text!r}: {problem}")
    return name, share


def _speed_signals_text(signals: Sequence[tuple[str, float]], sep: str) -> str:
    """The latencies judged at the host's speed as the option takes them (a share of 1 left out)."""
    return sep.join(name if share == 1.0 else f"{name}={share:g}" for name, share in signals)


def _at_least_one(text: str) -> int:
    """An option's whole number of at least 1 (argparse's type)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number of at least 1")
    return n


def _wait_factor(text: str) -> float:
    """--wait-checked's factor: 0 (off) or a positive number (argparse's type)."""
    try:
        x = float(text)
    except ValueError:
        x = -1.0
    if not 0 <= x < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r}: 0 (the check off) or a positive factor")
    return x


def parser() -> argparse.ArgumentParser:
    """The experiment's options (episodes.py takes the same)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", nargs="+", required=True, metavar="[LABEL=]PATH",
                    help="recorded streams; a LABEL names the phases of its file LABEL/phase (another recording "
                    "of the same phases: its stationary phase is followed by its own changed phases)")
    ap.add_argument("--tuned", default="stationary_a", help="the stationary phase the detector was tuned on")
    ap.add_argument("--held-out", nargs="+", default=["stationary_b"],
                    help="stationary phases never used to tune it")
    ap.add_argument("--sim-model", type=Path, default=None,
                    help="the step-cost model for the expectation (experiments/sim-calibration/model-cpu.json)")
    ap.add_argument("--no-contention", action="store_true", help="latencies not corrected for the CPU wait")
    ap.add_argument("--no-steal", action="store_true", help="the host's CPU steal left out of the wait")
    ap.add_argument("--no-autocorrelation", action="store_true", help="latency scales not widened for it")
    ap.add_argument("--autocorrelation-baselines", type=_at_least_one,
                    default=MonitorConfig.autocorrelation_baselines,
                    help="the autocorrelation that widens a baseline pooled over it and up to N - 1 baselines "
                         "before it in the monitor's life (MonitorConfig.autocorrelation_baselines)")
    ap.add_argument("--wait-error", type=float, default=MonitorConfig.wait_error)
    ap.add_argument("--wait-memory", type=int, default=MonitorConfig.wait_memory)
    ap.add_argument("--wait-law-error", type=float, default=MonitorConfig.wait_law_error)
    ap.add_argument("--max-wait-judged", type=float, default=MonitorConfig.max_wait_judged)
    ap.add_argument("--starved-baseline", action=argparse.BooleanOptionalAction,
                    default=MonitorConfig.starved_baseline,
                    help="windows beyond --max-wait-judged judged against their own baseline (MonitorConfig)")
    ap.add_argument("--wait-law", choices=tuple(LAWS), default=MonitorConfig.wait_law,
                    help="the share of the wait that stretches the latencies (MonitorConfig.wait_law)")
    ap.add_argument("--wait-law-relative", action=argparse.BooleanOptionalAction,
                    default=MonitorConfig.wait_law_relative,
                    help="the law's error on the stretch's departure from the baseline's (MonitorConfig)")
    ap.add_argument("--wait-blend", choices=["window", "usual"], default=MonitorConfig.wait_blend,
                    help="what sets the auto law's degree (MonitorConfig.wait_blend)")
    ap.add_argument("--wait-error-relative", action=argparse.BooleanOptionalAction,
                    default=MonitorConfig.wait_error_relative,
                    help="the share's error beyond the one at the baseline's usual stretch (MonitorConfig)")
    ap.add_argument("--latency-rel-floor", type=float, default=MonitorConfig.latency_rel_floor)
    ap.add_argument("--slowdown-to-find", type=float, default=MonitorConfig.slowdown_to_find_frac,
                    help="a latency's CUSUM allowance at least half this slowdown (a fraction; 0: k alone)")
    ap.add_argument("--drift-to-find", type=float, default=MonitorConfig.drift_to_find_frac,
                    help="an input's CUSUM allowance at least half this drift (a fraction; 0: k alone)")
    ap.add_argument("--input-confidence", type=float, default=MonitorConfig.input_confidence,
                    help="the upper confidence bound of an input's learnt spread (MonitorConfig.input_confidence)")
    ap.add_argument("--rate-poisson-floor", action=argparse.BooleanOptionalAction,
                    default=MonitorConfig.rate_poisson_floor,
                    help="the rate's spread at least a Poisson count's (MonitorConfig.rate_poisson_floor)")
    ap.add_argument("--paced-rate", action=argparse.BooleanOptionalAction, default=MonitorConfig.paced_rate,
                    help="a fall of the rate that the requests in the server (Little's law) did not follow is a "
                         "closed loop answered more slowly, no drift (MonitorConfig.paced_rate; --no-paced-rate: "
                         "the rate an input whatever paces it)")
    ap.add_argument("--queued-load", action=argparse.BooleanOptionalAction, default=MonitorConfig.queued_load,
                    help="latencies that rose by the queue of more requests than the server runs at once (the "
                         "requests in the server up, the added ones waiting, the ITL and finished rate unchanged) "
                         "are a drift, and that queue's draining another (MonitorConfig.queued_load; "
                         "--no-queued-load: an anomaly)")
    ap.add_argument("--learning-shift", action=argparse.BooleanOptionalAction,
                    default=MonitorConfig.learning_shift,
                    help="a level shift of an input, or of a closed loop's requests in the server, inside a "
                         "baseline's learning windows is a drift and restarts the learning at it "
                         "(MonitorConfig.learning_shift; --no-learning-shift: the baseline learnt across it)")
    ap.add_argument("--host-speed-elasticity", type=float, default=None, metavar="E",
                    help="the latencies judged at the host's speed (a stream recorded with the probe) with this "
                         "elasticity (MonitorConfig.host_speed_elasticity; default: not)")
    ap.add_argument("--autocorrelation-apart", action="store_true",
                    help="the host-speed-judged latencies' autocorrelation pooled apart from the rest's "
                         "(MonitorConfig.autocorrelation_apart)")
    ap.add_argument("--autocorrelation-horizon", type=_at_least_one, default=None, metavar="WINDOWS",
                    help="the autocorrelation widens the latencies' scales to the mean of this many windows, not "
                         "the long-run scale (MonitorConfig.autocorrelation_horizon; default: the long-run)")
    ap.add_argument("--autocorrelation-history", action="store_true",
                    help="the latencies' autocorrelation estimated again from their history at each relearning "
                         "(MonitorConfig.autocorrelation_history; with --history-windows)")
    ap.add_argument("--host-speed-signals", nargs="+", type=_speed_signal, metavar="LATENCY[=SHARE]",
                    default=list(MonitorConfig.host_speed_signals),
                    help="the latencies judged at the host's speed, each at SHARE x the elasticity (default 1; "
                         "MonitorConfig.host_speed_signals; default "
                         f"{_speed_signals_text(MonitorConfig.host_speed_signals, ' ')}; the thirty-fourth step's "
                         "tables: all six at 1)")
    ap.add_argument("--host-probe", choices=("index", "own", "own+index", *TASKS), default="index",
                    help="what a probed stream's host_probe_us is: the product's index (tuner.monitor.hostspeed."
                         "probe_index: the geometric mean of the probe's three tasks, unpinned; default), the same "
                         "of the runs on the engine's own CPU (own: recorded from the thirty-fourth step on), the "
                         "geometric mean of those two (own+index) or one "
                         "task's median (mv4_us: the 4-MB product alone, the thirty-third step's)")
    ap.add_argument("--wait-checked", type=_wait_factor, default=MonitorConfig.wait_checked, metavar="FACTOR",
                    help="judge a closed loop's baseline's latencies uncorrected for the CPU wait where the correction "
                         "spreads its learning windows' log ITL mean more than FACTOR times as wide "
                         f"(MonitorConfig.wait_checked; default {MonitorConfig.wait_checked}; 0: always corrected)")
    ap.add_argument("--history-windows", type=int, default=MonitorConfig.history_windows,
                    help="latency baselines learnt again from up to this many calm windows (default: never)")
    ap.add_argument("--history-usual-wait", action=argparse.BooleanOptionalAction,
                    default=MonitorConfig.history_usual_wait,
                    help="with --history-windows: a window joins the history only at its baseline's usual CPU wait")
    ap.add_argument("--input-history-windows", type=int, default=MonitorConfig.input_history_windows,
                    help="input scales learnt again from up to this many windows since their baseline (0: never)")
    ap.add_argument("--learn-until-sensitive", action="store_true",
                    help="learning goes on while the ITL mean's baseline would find the slowdown to find late")
    ap.add_argument("--warmup-judged", action=argparse.BooleanOptionalAction, default=MonitorConfig.warmup_judged,
                    help="every signal judged during a warm-up, the latencies learnt again as it goes on "
                         "(MonitorConfig.warmup_judged); off: learning goes on through it")
    ap.add_argument("--relearn-insensitive", action="store_true",
                    help="the latencies' baselines learnt again while the ITL mean's finds the slowdown late")
    ap.add_argument("--corroborate", type=int, default=MonitorConfig.corroborate)
    ap.add_argument("--confirm-windows", type=int, default=MonitorConfig.confirm_windows)
    ap.add_argument("--alone", nargs="*", default=list(MonitorConfig.alone), metavar="LATENCY",
                    help="the latencies that alarm alone (the others are corroborated)")
    ap.add_argument("--robust", action="store_true", help="latency scales from the MAD alone")
    ap.add_argument("--no-bucket-error", action="store_true",
                    help="a quantile in another histogram bucket than its baseline's not widened for it")
    ap.add_argument("--only-false-alarms", action="store_true", help="skip the injected changes")
    ap.add_argument("--only-injected", action="store_true",
                    help="skip the false alarms and the slowdowns after the engine's start")
    ap.add_argument("--changes", nargs="+", choices=sorted(EXPECT), default=sorted(EXPECT), metavar="CHANGE",
                    help=f"the changes injected (default all: {', '.join(EXPECT)})")
    ap.add_argument("--hours", type=float, default=240.0)
    # each replayed stream learns its own baseline from its first windows: short streams sample many baselines
    # (with 24-h streams the 10 baselines of 240 h made the estimate swing 0.7 <-> 10.7 a day with the seed)
    ap.add_argument("--stream-hours", type=float, default=4.0)
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--min-watch", type=int, default=4,
                    help="the fewest windows watched after the baseline, for a start of the real-order replay")
    ap.add_argument("--no-warmup-cut", action="store_true",
                    help="bootstrap and inject from a stationary stream's first window (no MSER-5 cut)")
    ap.add_argument("--cut", nargs="+", default=[], metavar="STREAM=WINDOWS",
                    help="a stationary stream's warm-up cut, in windows, instead of its MSER-5 cut (to compare two "
                         "settings on the same windows)")
    ap.add_argument("--until", nargs="+", default=[], metavar="STREAM=WINDOWS",
                    help="a stationary stream's first WINDOWS windows only (a life's calm windows before a change "
                         "after which its server stayed changed); its own-life rows keep the whole life")
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--pre", type=int, default=20)
    ap.add_argument("--post", type=int, default=12)
    ap.add_argument("--gpu-noise", type=float, default=0.01)
    ap.add_argument("--gpu-readings", choices=("gpu", "gpu_instant"), default="gpu",
                    help="a GPU stream's readings: the monitor's (NVML's sample buffers' means over the window, in "
                         "streams recorded from 2026-12-04 on; one read before) or one read at the window's end")
    ap.add_argument("--false-alarms-per-day", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--learning-repeats", action="store_true",
                    help="the former replays: a stream's learning stretch drawn like the rest, so a window may come "
                         "twice in it (before the twentieth step)")
    ap.add_argument("--learn-windows", type=int, default=20)
    ap.add_argument("--z-clip", type=float, default=None)
    ap.add_argument("--settle-windows", type=int, default=1)
    return ap


Sets = list[tuple[str, str]]  # (stationary phase, "tuned" or "held out")


def setup(args: argparse.Namespace) -> tuple[Phases, dict[str, dict[str, float]], Sets, MonitorConfig,
                                             ChampionExpectation | None, dict[str, Order]]:
    """The recorded phases and their settings, the stationary sets found among them, the monitor's config at
    their scrape interval, the expectation, and each interleaved stream's windows in recorded order (by label)."""
    phases: Phases = {}
    info: dict[str, dict[str, float]] = {}
    lives: dict[str, Order] = {}
    for arg in args.streams:
        tag, _, path = arg.rpartition("=")
        p, d, order = load_stream(Path(path), args.gpu_readings, host_probe=args.host_probe)
        if args.host_speed_elasticity and not any("host_probe_us" in w for ws in p.values() for _, w in ws):
            raise SystemExit(f"run.py: --host-speed-elasticity with --host-probe {args.host_probe}: {path} holds no "
                             "such reading (recorded without --speed-probe, or before the probe followed the "
                             "engine's CPU: `own` from the thirty-fourth step on)")
        phases.update({f"{tag}/{k}" if tag else k: v for k, v in p.items()})
        info.update({f"{tag}/{k}" if tag else k: v for k, v in d.items()})
        if order is not None:
            lives[tag] = order
    if args.no_steal:
        for ws in phases.values():
            for _, w in ws:
                w.pop("cpu_steal_frac", None)
    sets = [(args.tuned, "tuned"), *((h, "held out") for h in args.held_out)]
    sets = [(name, label) for name, label in sets if name in phases]
    if not sets:
        raise SystemExit(f"--tuned {args.tuned} --held-out {' '.join(args.held_out)}: no such phase in the streams "
                         f"given (they hold {', '.join(sorted(phases))})")
    times = [t for t, _ in phases[sets[0][0]]]
    interval = statistics.median(b - a for a, b in zip(times, times[1:], strict=False))
    cfg = MonitorConfig(interval_s=round(interval), false_alarms_per_day=args.false_alarms_per_day,
                        learn_windows=args.learn_windows, z_clip=args.z_clip,
                        settle_windows=args.settle_windows, contention=not args.no_contention,
                        autocorrelation=not args.no_autocorrelation,
                        autocorrelation_baselines=args.autocorrelation_baselines, wait_error=args.wait_error,
                        autocorrelation_apart=args.autocorrelation_apart,
                        autocorrelation_horizon=args.autocorrelation_horizon,
                        autocorrelation_history=args.autocorrelation_history,
                        wait_memory=args.wait_memory, robust=args.robust, max_wait_judged=args.max_wait_judged,
                        wait_law_error=args.wait_law_error, wait_law=args.wait_law,
                        wait_law_relative=args.wait_law_relative, wait_error_relative=args.wait_error_relative,
                        wait_blend=args.wait_blend, starved_baseline=args.starved_baseline,
                        latency_rel_floor=args.latency_rel_floor,
                        corroborate=args.corroborate, confirm_windows=args.confirm_windows,
                        alone=tuple(args.alone), slowdown_to_find_frac=args.slowdown_to_find or None,
                        drift_to_find_frac=args.drift_to_find or None, input_confidence=args.input_confidence,
                        rate_poisson_floor=args.rate_poisson_floor, paced_rate=args.paced_rate,
                        queued_load=args.queued_load, learning_shift=args.learning_shift,
                        wait_checked=args.wait_checked or None,
                        host_speed_elasticity=args.host_speed_elasticity,
                        host_speed_signals=tuple(args.host_speed_signals),
                        history_windows=args.history_windows, history_usual_wait=args.history_usual_wait,
                        bucket_error=not args.no_bucket_error,
                        input_history_windows=args.input_history_windows or None,
                        learn_until_sensitive=args.learn_until_sensitive,
                        relearn_insensitive=args.relearn_insensitive,
                        warmup_judged=args.warmup_judged)
    return phases, info, sets, cfg, expectation(args.sim_model), lives


def stream_windows(option: str, items: list[str], phases: Phases, sets: Sets, least: int, rule: str, *,
                   fewer: bool = False) -> dict[str, int]:
    """An option's STREAM=WINDOWS items (--cut, --until) as {stream: windows}: a recorded stream and at least `least`
    windows, at most as many as it has (fewer, where `fewer`); else exits saying so (`rule`)."""
    out: dict[str, int] = {}
    for item in items:
        name, _, n = item.partition("=")
        if (name not in phases or not n.isdigit() or int(n) < least
                or int(n) > len(phases[name]) - (1 if fewer else 0)):
            raise SystemExit(f"{option} {item}: STREAM=WINDOWS, a recorded stationary stream "
                             f"({', '.join(n for n, _ in sets)}) and {rule}")
        out[name] = int(n)
    return out


def trim_and_cut(args: argparse.Namespace, phases: Phases, sets: Sets, cfg: MonitorConfig,
                 expect: ChampionExpectation | None) -> dict[str, int]:
    """Each stationary set cut to its first --until windows (in `phases`), and its warm-up cut: --cut's windows,
    else none (--no-warmup-cut), else MSER-5's (warmup())."""
    for name, n in stream_windows("--until", args.until, phases, sets, 1, "at most as many windows as it has").items():
        phases[name] = phases[name][:n]
    given = stream_windows("--cut", args.cut, phases, sets, 0, "fewer windows than it has", fewer=True)
    return {name: given[name] if name in given else 0 if args.no_warmup_cut
            else warmup([w for _, w in phases[name]], cfg, expect) for name, _ in sets}


def row_label(name: str, label: str) -> str:
    return f"{label} (`{name}`)"


def false_alarm_rows(args: argparse.Namespace, phases: dict[str, list[tuple[float, Window]]],
                     sets: list[tuple[str, str]], cuts: dict[str, int], cfg: MonitorConfig,
                     expect: ChampionExpectation | None) -> None:
    print("\n## False alarms on stationary traffic\n")
    print("| set | stream | hours watched | events | per 24 h | episodes | per 24 h | kinds | "
          "windows whose latencies were not judged |")
    print("|---|---|---:|---:|---:|---:|---:|---|---:|")
    t0 = time.monotonic()
    for name, label in sets:
        false_alarms(row_label(name, label), [w for _, w in phases[name]], cuts[name], cfg, expect, args)
    print(f"\n(events: drift, anomaly and saturation; recoveries listed, not counted; episodes: the events less "
          f"those that reopened an anomaly or saturation of the same cause within {cfg.reopen_gap_s or 0:g} s of "
          f"its recovery, marked `reopened` (MonitorConfig.reopen_gap_s). Replay: "
          f"{time.monotonic() - t0:.0f} s for all the replayed hours)")


def main() -> None:
    args = parser().parse_args()
    logging.getLogger("tuner.monitor").setLevel(logging.ERROR)  # a warning per replayed baseline says nothing here
    phases, info, sets, cfg, expect, lives = setup(args)
    print(f"# detection experiment ({time.strftime('%Y-%m-%d %H:%M')})\n")
    n = cfg.autocorrelation_baselines
    pooled = f" (pooled over up to {n} baselines of the monitor's life)" if n > 1 else ""
    horizon = (f" (to the mean of {cfg.autocorrelation_horizon} windows)" if cfg.autocorrelation_horizon
               else "") + (" (the host-speed-judged latencies' apart)" if cfg.autocorrelation_apart else "") + (
        " (estimated again from the history at each relearning)" if cfg.autocorrelation_history else "")
    print(f"windows of {cfg.interval_s:g} s; {TESTS} one-sided tests; CUSUM k = {cfg.k}, h = {cfg.h:.3f} "
          f"(for {cfg.false_alarms_per_day:g} false alarm a day); baseline from {cfg.learn_windows} windows; "
          f"z clipped at {cfg.clip:.2f}; settle {cfg.settle_windows} window(s) while an input's CUSUM is at "
          f">= {cfg.settle_evidence:g} h; latencies corrected for the CPU wait: {cfg.contention} (its error "
          f"{cfg.wait_error:g}{SHARE_ERROR[cfg.wait_error_relative]}, "
          f"the share of {LAWS[cfg.wait_law]}{BLEND[cfg.wait_blend] if cfg.wait_law == 'auto' else ''}, "
          f"the law's error {cfg.wait_law_error:g} on "
          f"{'the stretch away from the baseline' if cfg.wait_law_relative else 'the stretch'}, judged up to a "
          f"wait of {cfg.max_wait_judged:g} of the window{STARVED[cfg.starved_baseline]}); "
          f"latency scales widened for autocorrelation: "
          f"{cfg.autocorrelation}{pooled}{horizon}; expectation "
          f"from the simulator: {args.sim_model is not None}; latency scales at least {cfg.latency_rel_floor:g} (log); "
          f"a latency's allowance at least half of a slowdown of {cfg.slowdown_to_find_frac or 0:g} (log); "
          f"an input's at least half of a drift of {cfg.drift_to_find_frac or 0:g} "
          f"({', '.join(f'{k}: {RULES[k].transform}' for k in INPUTS)}), its spread at its upper "
          f"{cfg.input_confidence:g} bound, the rate's at least a Poisson count's: {cfg.rate_poisson_floor}; "
          f"a fall of the rate (in a closed loop a rise too) the requests in the server did not follow no drift: "
          f"{cfg.paced_rate}; a closed loop's requests in the server up by a queue at the same ITL and a finished rate "
          f"no lower a drift, their latencies' alarm or none: "
          f"{cfg.queued_load}; "
          f"{'' if cfg.learning_shift else 'no '}drift looked for inside the learning windows; "
          f"the correction for the CPU wait dropped for a baseline it widens more than: {cfg.wait_checked}; "
          f"latencies judged at the host's speed with elasticity: {cfg.host_speed_elasticity} "
          f"(its probe: {args.host_probe}; {_speed_signals_text(cfg.host_speed_signals, ', ')}); "
          f"quantiles widened in another bucket than their baseline's: {cfg.bucket_error}; "
          f"latency baselines learnt again from up to {cfg.history_windows or 0} calm windows"
          f"{' at the usual CPU wait' if cfg.history_windows and cfg.history_usual_wait else ''}; "
          f"input scales learnt again from up to {cfg.input_history_windows or 0} windows; "
          f"learning goes on while the ITL mean's baseline is too noisy for the slowdown: {cfg.learn_until_sensitive}; "
          f"the latencies' baselines learnt again while too noisy: {cfg.relearn_insensitive}; "
          f"a warm-up judged, the latencies learnt again as it goes on: {cfg.warmup_judged}; "
          f"a latency anomaly needs {cfg.corroborate} latency signals or one confirmed within "
          f"{cfg.confirm_windows} windows, except {', '.join(cfg.alone) or 'none'} (alone)\n")
    if expect is not None:
        el = ", ".join(f"{s}: " + " ".join(f"{i.split('_')[0]} {e:+.2f}" for i, e in d.items())
                       for s, d in expect.elasticity.items())
        print(f"elasticities (d log latency / d log input, simulator): {el}\n")
    print("command: `python experiments/detection/run.py " + " ".join(sys.argv[1:]) + "`\n")
    print("| phase | windows | step slowdown | load average (median) | rate /s | prompt | output | CPU wait | "
          "CPU steal (median, max) | ITL ms mean | ITL x (1 - wait) | TTFT ms p50 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    for name, ws in phases.items():
        def med(k: str, ws: list[tuple[float, Window]] = ws) -> float:
            vals = [w[k] for _, w in ws if k in w]
            return statistics.median(vals) if vals else float("nan")
        stolen = [w["cpu_steal_frac"] for _, w in ws if "cpu_steal_frac" in w]
        steal = f"{statistics.median(stolen):.3f}, {max(stolen):.2f}" if stolen else "-"
        own = statistics.median([w["itl_ms_mean"] * (1 - w["cpu_wait_frac"]) for _, w in ws
                                 if "itl_ms_mean" in w and "cpu_wait_frac" in w] or [math.nan])
        print(f"| {name} | {len(ws)} | {info[name]['slowdown']:g} | {info[name]['load']:.1f} | "
              f"{med('rate_per_s'):.2f} | {med('prompt_tokens_mean'):.0f} | {med('output_tokens_mean'):.1f} | "
              f"{med('cpu_wait_frac'):.2f} | {steal} | {med('itl_ms_mean'):.1f} | {own:.1f} | "
              f"{med('ttft_ms_p50'):.0f} |")
    gpu_phases = {name: [w for _, w in ws] for name, ws in phases.items() if ws and recorded_gpu(ws[0][1])}
    if gpu_phases:
        which = {"gpu": "the monitor's: NVML's sample buffers' means over the window in streams recorded with them, "
                        "else one read at the window's end", "gpu_instant": "one read at the window's end"}
        print(f"\nThe GPU's readings (NVML, one per window, {which[args.gpu_readings]}; medians):\n")
        print(record_gpu.gpu_table(gpu_phases))

    cuts = trim_and_cut(args, phases, sets, cfg, expect)
    if not args.only_injected:
        false_alarm_rows(args, phases, sets, cuts, cfg, expect)
    if args.only_false_alarms:
        return
    print("\n## Injected changes\n")
    print(f"{args.trials} trials each; a stretch of the stationary phase ({cfg.learn_windows} learning + "
          f"{args.pre} windows) then the change; up to {args.post} windows to find it.\n")
    print("| before the change | change | source | trials | found | missed | median delay (windows) | p90 delay | "
          "median delay from the input's rise | ITL mean: windows its CUSUM takes to find the slowdown to find "
          "(Siegmund, median) | "
          "classified as expected | first drift/anomaly events | with a saturation event | "
          "with a false alarm before |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for name, label in sets:
        injected(row_label(name, label), name, phases, cuts[name], cfg, expect, args)
    print(recorded_offsets(phases, [name for name, _ in sets], args))
    mine = [(name, label) for name, label in sets
            if name.rpartition("/")[0] in lives and name.rpartition("/")[2] == CALM]
    if mine:
        print("\n## Slowdowns in the server's own life\n")
        print(f"Streams recorded with one load that never stopped and the server slowed several times in it "
              f"(record_vllm.py --interleave), replayed in their recorded order from every start in the lead "
              f"stationary stretch that learns its baseline before the first slowdown (from the fresh server's first "
              f"window on: the monitor's own warm-up rule): per "
              f"slowdown, the starts with an event within {args.post} windows of its first window, those an anomaly, "
              f"the delay from its first window (1: found at the end of it), and the starts at whose slowdown an "
              f"anomaly was still open.\n")
        print("| stream | slowdown | first window | windows | found | as anomaly | median delay | p90 delay | "
              "open from before |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        summary: list[str] = []
        drifts: list[str] = []
        for name, label in mine:
            own_life(row_label(name, label), lives[name.rpartition("/")[0]], cfg, expect, args, summary, drifts)
        if drifts:
            print(f"\nThe traffic's changes in the same life (record_vllm.py --life): a second load at the base rate "
                  f"beside the first ({DRIFT}), the load's prompts twice as long (prompt_x2) or its outputs four "
                  f"times (output_x4) at the base rate, and the return to the base traffic after each "
                  f"({', '.join(RETURNS.values())}), each to be found as a drift; found: an event within {args.post} "
                  f"windows of its first window.\n")
            print("| stream | change | first window | windows | found | as drift | median delay | p90 delay | "
                  "open from before |")
            print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
            print("\n".join(drifts))
        print(f"\nEvery slowdown from every start, and the events outside the changes (each up to {args.post} "
              f"windows from its first or to its end, and {GRACE_WINDOWS} windows after: its queue drains) as false "
              f"alarms:\n")
        print("| stream | starts (windows) | slowdowns watched | found | as anomaly | median delay | p90 delay | "
              "hours watched outside them | events | per 24 h | episodes | per 24 h | kinds | at windows |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
        print("\n".join(summary))

    if args.only_injected:
        return
    print("\n## A slowdown after the engine's start\n")
    print("Each stationary stream watched from its first window (the fresh engine's warm-up among the learning "
          "windows), its latencies x1.15 or x1.3 from window `at` on, every `at` from "
          f"{cfg.learn_windows + 10} to {args.post} windows before its end; found: an anomaly within {args.post} "
          "windows and no event before.\n")
    print("| stream | latencies | found (warm-up rule) | median delay | found (baseline from the first windows) | "
          "median delay |")
    print("|---|---|---:|---:|---:|---:|")
    for x in (1.15, 1.3):
        for name, label in sets:
            after_start(f"{label} (`{name}`)", [w for _, w in phases[name]], x, cfg, expect, args)


if __name__ == "__main__":
    main()
