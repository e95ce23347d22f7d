"""The host's own speed, measured beside a server: how much CPU time a fixed piece of work takes (the monitor's
environment signal host_probe_us).

A server on a shared host can get slower at unchanged load without waiting for a CPU: another guest of the
hypervisor (or a neighbour on the other core) fills the shared cache and memory bus, and the same code takes
more CPU time (experiments/detection README: quiet6's episode, vllm16's excursions). Neither the server's
run-queue wait nor the host's steal says so. A probe that times a fixed task in CPU time (its thread's
`time.thread_time_ns`, so its own waits for a CPU do not count) reads it from outside the server: the same
work slower on the same CPU.

`HostSpeed` runs in a thread every `period_s`: a 4-MB float32 matrix-vector product (a working set in the
shared cache, streamed like a small model's weights: slower when a neighbour streams memory), a 64x64
matrix product (in the core's own cache: slower only when the core is) and a short pure-Python loop
(the interpreter's speed). `take()` gives each task's median CPU microseconds per run since the last take and
how many runs that median is of; `read()` the monitor's signal, {'host_probe_us': the index}, the geometric mean
of the three tasks' medians (probe_index; {} where nothing ran since the last read). About 1-2 ms of CPU every
half second, BLAS held to one thread while the tasks run (threadpoolctl: their CPU time is then this thread's).

Each CPU has a speed of its own: on a 2-vCPU guest here each flipped between a fast and a slow state (the Python
loop x1.5) every few seconds, apart from the other (the hypervisor's other guests on the cores beneath). A probe
left where the scheduler puts it runs mostly on the CPU a busy server leaves free. Given a server to follow
(`shared("pid:<N>")` or `shared("title:<text>")`, the monitor's CPU wait source), the probe also runs its tasks
pinned on the CPU the server's busiest thread last ran on (ThreadCpu), after its unpinned run. The pinned runs
explained a vLLM server's wander better than the unpinned runs on closed loops and busy open ones (spread left
0.063-0.075 against 0.087-0.089), though over a 15-s window the two CPUs' pinned readings moved together
(correlation 0.87-0.90): the pinned run's place after a cache-warming one may count as much as its CPU
(thirty-fourth step); on open loops at 4-6 requests a second the unpinned ones explained more. Its readers read
the geometric mean of the two (reading()'s "own+index"): no worse than either on seven recordings, second to the
better on each of six and the narrowest on the seventh, recorded after it was named (thirty-seventh and
thirty-eighth steps).

The monitor judges the ITL mean at the host's speed with the server's elasticity to it, and the TTFT median at half
of it (tuner.monitor.config.MonitorConfig.host_speed_elasticity, host_speed_signals): vLLM's CPU build on one thread
at its capacity slowed with the index at an elasticity near 1 on three recordings (experiments/detection,
thirty-fourth step), its TTFT median at about half that (thirty-eighth and thirty-ninth steps).

Measured here (2 vCPUs, KVM; alone, the 4-MB product 150-165 us one day, 55-110 us another): a neighbour copying
24 MB arrays on the other core x1.4, 256 MB arrays x1.1, a pure-Python loop on the other core x1.0; the 64x64
product and the Python loop x1.0 under all three.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import ThreadpoolController

from tuner.monitor.contention import CpuWait

log = logging.getLogger(__name__)

TASKS = ("mv4_us", "mm64_us", "py_us")
KEEP_S = 1800.0  # how long the runs are kept for readers (HostSpeedReader)


def probe_index(medians: Mapping[str, float]) -> float | None:
    """The host's speed as one reading: the geometric mean of the three tasks' median CPU microseconds (their
    ratios to a reference multiply: the index moves by the mean of the tasks' log slowdowns). The work of a
    server on a CPU mixes the three kinds (interpreted Python, small products in the core's cache, weights
    streamed through the shared cache), and vLLM's CPU build on one thread slowed with this mean at an
    elasticity near 1 on three recordings (experiments/detection, thirty-fourth step). None where a task is
    missing or not positive."""
    vals = [medians.get(k, 0.0) for k in TASKS]
    if min(vals) <= 0:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def reading(taken: Mapping[str, Any], how: str = "index") -> float | None:
    """One reading of a take() (a recorded row's `speed`): "index", probe_index of the unpinned runs; "own" or
    "cpu<n>", that of the runs pinned there; "own+index", the geometric mean of those two (a followed probe runs
    both every period); a task's name (TASKS), its unpinned median. None where those runs are not in it."""
    if how == "own+index":
        own, unpinned = reading(taken, "own"), reading(taken, "index")
        return math.sqrt(own * unpinned) if own and unpinned else None
    runs = taken if how == "index" or how in TASKS else taken.get(how)
    if not isinstance(runs, Mapping) or not runs.get("runs"):
        return None
    return probe_index(runs) if how not in TASKS else (runs.get(how) or None)


class ThreadCpu:
    """The CPU a server's busiest thread ran on last (`/proc/<pid>/task/<tid>/stat`'s 39th field): the core its
    work is on, for a probe to follow. `pids`: the server's process id, or a function giving its processes' ids
    (tuner.monitor.contention.titled: a restarted server's new ones). The busiest thread (the most CPU time since
    the previous choice) is chosen again every `every` calls (all its processes' stat files read then; one file
    the calls between). None where no process is readable."""

    def __init__(self, pids: int | Callable[[], list[int]], every: int = 20,
                 proc_root: Path = Path("/proc")) -> None:
        self.pids: Callable[[], list[int]] = (lambda: [pids]) if isinstance(pids, int) else pids
        self.every, self.proc_root = every, proc_root
        self._calls = 0
        self._chosen: tuple[int, str] | None = None  # (pid, tid)
        self._cpu_ticks: dict[tuple[int, str], int] = {}

    def _stat(self, pid: int, tid: str) -> list[str] | None:
        try:
            text = (self.proc_root / str(pid) / "task" / tid / "stat").read_text()
        except OSError:
            return None
        return text[text.rindex(")") + 2:].split()  # the fields after the command's name (which may hold spaces)

    def _choose(self) -> None:
        ticks = {}
        for pid in self.pids():
            try:
                tids = [t.name for t in (self.proc_root / str(pid) / "task").iterdir()]
            except OSError:
                continue
            for tid in tids:
                f = self._stat(pid, tid)
                if f is not None and len(f) > 12:
                    ticks[(pid, tid)] = int(f[11]) + int(f[12])  # utime + stime (fields 14 and 15)
        self._chosen = max(ticks, key=lambda k: ticks[k] - self._cpu_ticks.get(k, 0)) if ticks else None
        self._cpu_ticks = ticks

    def __call__(self) -> int | None:
        if self._calls % self.every == 0 or self._chosen is None:
            self._choose()
        self._calls += 1
        f = self._stat(*self._chosen) if self._chosen is not None else None
        if f is None or len(f) <= 36:
            self._chosen = None
            return None
        return int(f[36])  # processor (field 39)


class HostSpeed:
    """The probe's thread and its runs: `take()` each task's medians since the last take (one reader: a
    recorder), `median_since(t)` the index (probe_index) since a time (any number of readers: HostSpeedReader).

    Each CPU of a host has a speed of its own: on this 2-vCPU guest each flips between a fast and a slow state
    (a pure-Python loop x1.5, the 4-MB product x1.3) at a few seconds' scale, apart from the other's (the
    hypervisor's other guests on the cores beneath; experiments/detection, thirty-fourth step). A probe that runs
    where the scheduler puts it reads mostly the core the server leaves free. `follow`: a function giving the CPU
    the server works on (ThreadCpu); each period the tasks then also run pinned there (`own` in take()), and the
    readers read the geometric mean of those runs' index and the unpinned runs' (median_since). `cpus`: CPUs the
    tasks also run pinned on each period, for a recorder (`cpu<n>` in take())."""

    def __init__(self, period_s: float = 0.5, seed: int = 0, keep_s: float = KEEP_S, *,
                 follow: Callable[[], int | None] | None = None, cpus: Sequence[int] = ()) -> None:
        rng = np.random.default_rng(seed)
        n = int((4e6 / 4) ** 0.5)  # 4 MB of float32
        self._w = rng.standard_normal((n, n), dtype=np.float32)
        self._x = rng.standard_normal(n, dtype=np.float32)
        self._a = rng.standard_normal((64, 64), dtype=np.float32)
        self._tasks: dict[str, tuple[Callable[[], object], int]] = {
            "mv4_us": (lambda: self._w @ self._x, 3),
            "mm64_us": (lambda: self._a @ self._a, 50),
            "py_us": (lambda: sum(range(2000)), 5),
        }
        self._keep = int(keep_s / period_s) + 1  # runs kept: a probe nobody takes from holds no more
        self._follow = follow
        self._cpus = tuple(cpus)
        # runs since the last take: "" unpinned, "own" on the followed CPU, "cpu<n>" pinned on CPU n
        self._runs: dict[str, deque[dict[str, float]]] = {}
        self._own_cpus: Counter[int] = Counter()  # the followed CPU of each period since the last take
        # (monotonic s, the period's runs the readers read: "" unpinned, and "own" where the probe follows a server)
        self._recent: deque[tuple[float, dict[str, dict[str, float]]]] = deque(maxlen=self._keep)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._period_s = period_s
        self._thread = threading.Thread(target=self._loop, name="host-speed-probe", daemon=True)
        self._blas = ThreadpoolController()

    def _once(self) -> dict[str, float]:
        out = {}
        with self._blas.limit(limits=1, user_api="blas"):  # the products on this thread alone
            for name, (f, reps) in self._tasks.items():
                t0 = time.thread_time_ns()
                for _ in range(reps):
                    f()
                out[name] = (time.thread_time_ns() - t0) / reps / 1e3
        return out

    def _pinned(self, cpu: int) -> dict[str, float] | None:
        """One run of the tasks on `cpu` alone (None where this thread may not run there)."""
        try:
            os.sched_setaffinity(0, {cpu})  # 0: this thread
        except OSError:
            return None
        return self._once()

    def _period(self) -> tuple[dict[str, dict[str, float]], int | None]:
        # unpinned first, every period: a followed probe's pinned runs then come after it as they did in the
        # recordings that measured them (their cache warmed by it; experiments/detection, thirty-fourth step)
        runs = {"": self._once()}
        own = self._follow() if self._follow is not None else None
        wanted = set(self._cpus) | ({own} if own is not None else set())
        if wanted:
            mask = os.sched_getaffinity(0)
            try:
                for cpu in sorted(wanted):
                    one = self._pinned(cpu)
                    if one is not None:
                        if cpu in self._cpus:
                            runs[f"cpu{cpu}"] = one
                        if cpu == own:
                            runs["own"] = one
            finally:
                os.sched_setaffinity(0, mask)
        return runs, own

    def _loop(self) -> None:
        failed = False
        while not self._stop.wait(self._period_s):
            try:
                runs, own = self._period()
            except Exception:  # a probe that failed once (an unreadable /proc, a CPU taken away) tries again
                if not failed:
                    log.warning("host speed probe: a period failed; it goes on (named once)", exc_info=True)
                failed = True
                continue
            with self._lock:
                for where, one in runs.items():
                    self._runs.setdefault(where, deque(maxlen=self._keep)).append(one)
                if own is not None:
                    self._own_cpus[own] += 1
                if self._follow is None or "own" in runs:
                    self._recent.append((time.monotonic(), {k: v for k, v in runs.items() if k in ("", "own")}))

    def start(self) -> HostSpeed:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def take(self) -> dict[str, Any]:
        """Each task's median CPU microseconds per run since the last take (unpinned), and `runs`: how many (0: no
        task field); with `follow`, `own` (the same of the runs on the followed CPU) and `own_cpus` (CPU -> the
        periods it was the followed one); with `cpus`, `cpu<n>` of the runs pinned on each."""
        with self._lock:
            runs, self._runs = self._runs, {}
            own_cpus, self._own_cpus = self._own_cpus, Counter()
        out: dict[str, Any] = _summary(runs.get("", deque()))
        for where, got in runs.items():
            if where:
                out[where] = _summary(got)
        if self._follow is not None:
            out["own_cpus"] = {str(c): n for c, n in sorted(own_cpus.items())}
        return out

    def median_since(self, t0: float) -> float | None:
        """The readers' index since `t0` (time.monotonic()); None if nothing ran. Unfollowed: probe_index of the
        runs (each task's median, their geometric mean). Following a server: the geometric mean of the index of
        the runs on its CPU and of the same periods' unpinned runs (reading()'s "own+index"), which explained a
        vLLM server's wander no worse than either alone on seven recordings, the narrowest on a recording made
        after it was named (experiments/detection, thirty-seventh and thirty-eighth steps)."""
        with self._lock:
            got = [runs for t, runs in self._recent if t > t0]
        if not got:
            return None
        taken = {**_summary([runs[""] for runs in got]),
                 **({"own": _summary([runs["own"] for runs in got])} if self._follow is not None else {})}
        return reading(taken, "own+index" if self._follow is not None else "index")


def _medians(runs: Collection[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in TASKS}


def _summary(runs: Collection[dict[str, float]]) -> dict[str, Any]:
    """Runs as take() gives them: `runs` (how many) and each task's median where there are any."""
    return {"runs": float(len(runs)), **(_medians(runs) if runs else {})}


_shared: dict[str, HostSpeed] = {}
_shared_lock = threading.Lock()


def shared(follow: str = "") -> HostSpeed:
    """This process's one probe, started at the first call (the host's speed is the host's, not an agent's); with
    `follow` (a CPU wait source naming the server's processes, `pid:<N>` or `title:<text>`:
    tuner.monitor.contention.CpuWait) one per server, following the CPU its busiest thread is on (ThreadCpu)."""
    with _shared_lock:
        if follow not in _shared:
            _shared[follow] = HostSpeed(follow=follows(follow) if follow else None).start()
        return _shared[follow]


def follows(source: str) -> ThreadCpu:
    """The ThreadCpu of a CPU wait source that names processes, `pid:<N>` or `title:<text>` (read as
    tuner.monitor.contention.CpuWait reads it)."""
    try:
        wait = CpuWait(source)
    except ValueError:
        wait = None
    if wait is None or not wait.names_processes or (wait.title is not None and not wait.title.strip()):
        raise ValueError(f"a probe follows a server's processes, pid:<N> or title:<text>; got {source!r}")
    return ThreadCpu(wait.processes)


class HostSpeedReader:
    """One reader of a probe's windows (the daemon's monitor of one agent): `read()` gives the monitor's signal
    for the time since its previous read."""

    def __init__(self, probe: HostSpeed) -> None:
        self.probe = probe
        self._since = time.monotonic()

    def read(self) -> dict[str, float]:
        """{'host_probe_us': the probe's index (probe_index) over its runs since the last read}, or {} where it did
        not run since."""
        now = time.monotonic()
        got = self.probe.median_since(self._since)
        self._since = now
        return {} if got is None else {"host_probe_us": got}
