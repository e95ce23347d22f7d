"""The server's wait for a CPU: how much of a window it was ready to run but a neighbour held the CPU.

A server that shares its host (a busy node, a container's CPU quota, other tenants) gets slower without any
change of its own: every latency stretches by the time it spent waiting for a CPU. The monitor reads that
time as the signal `cpu_wait_frac`, the share of the window the server waited, and uses it to correct its
latency expectation (tuner.monitor.expect), so a noisy neighbour is not taken for a slower champion.

A virtual machine has a neighbour its own kernel cannot see waiting for: the hypervisor running other guests
on the physical CPUs while this guest's vCPUs were ready. Inside the guest that time passes as if the server
ran (its schedstat counts no wait); Linux counts it as `steal` in /proc/stat (node_exporter's
node_cpu_seconds_total{mode="steal"}). `CpuSteal` reads the signal `cpu_steal_frac`, the share of the
host's runnable CPU time (user, nice, system, irq, softirq, steal) that was stolen, from the host's
/proc/stat or from Prometheus (a fleet's node_exporter series); the monitor adds it to the wait
(tuner.monitor.classify).

Two sources of the wait, both cumulative counters of Linux, differenced between reads:
- a PSI file (`cpu.pressure` of the server's cgroup v2, or the host's /proc/pressure/cpu): `some ... total=`
  microseconds during which at least one task of the group waited for a CPU;
- a process (`pid`): /proc/<pid>/task/<tid>/schedstat of each of its threads (nanoseconds on a CPU,
  nanoseconds waiting on a run queue, timeslices); the share of its busiest thread, the one that wanted a CPU
  longest, running or waiting (a server's latency follows its engine loop: the others' waits overlap it; the
  thread that waited most was that loop on nearly every window recorded in experiments/detection, but on a busy
  host a helper thread that barely ran waited as long now and then, and read a wait of 0.65 of its ready time
  where the loop's was 0.2: experiments/detection, twenty-sixth step). For that thread also
  `cpu_ready_wait_frac`: the share of the time it was ready to run (on a CPU or waiting for one) that it
  waited, wait / (run + wait). A thread that needed c seconds of CPU took c / (1 - that share) to get them,
  whatever the share of the window it slept (a sleep, a GPU's work, no request): its work was that many times
  as slow (MonitorConfig.wait_law "ready"); the share of the window says so only for a thread never idle.
  `title:<text>` names the processes by their title instead, looked up at each read (a restarted server's
  new processes): the threads of all of them, read as one process's. vLLM runs the model in a worker process
  (`title:VLLM::Worker`) while its engine core (`title:EngineCore`) waits for each step's result on a
  shared-memory queue; both spin there between their turns, so neither's wait is the model's alone: at
  capacity the worker's followed its latency better, below it the engine core's (experiments/detection,
  thirty-second step). Served with vLLM's `uni` executor (VLLM_ENABLE_V1_MULTIPROCESSING=0) on one OpenMP
  thread, the engine core runs the model itself, nothing spins, and its wait is the model's (thirty-third step).

The first read gives nothing (no window yet); a thread that ended, a counter that went down (a new process)
or an unreadable file gives nothing for that window (named once in the log), never an error. The same for
the steal.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path

from tuner.monitor.signals import MissingSeries
from tuner.monitor.telemetry import RUNNABLE_MODES, node_steal_reading

log = logging.getLogger(__name__)

# the first columns of /proc/stat's cpu lines (node_exporter's modes of node_cpu_seconds_total)
PROC_STAT_COLUMNS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
MAX_WAIT_FRAC = 0.99  # a share above it says nothing more (the server barely ran)


def stretch(w: float) -> float:
    """log 1 / (1 - w): how much longer, on the log scale, a server's work takes when it lost a share w of it to
    neighbours (capped at MAX_WAIT_FRAC)."""
    return -math.log1p(-min(w, MAX_WAIT_FRAC))


def share_of(s: float) -> float:
    """The share w whose stretch log 1 / (1 - w) is `s` (stretch's inverse below MAX_WAIT_FRAC)."""
    return -math.expm1(-s)


def psi_some_total_us(text: str) -> float | None:
    """The `some` line's total (microseconds) of a PSI file's text; None when it has none."""
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "some":
            for p in parts[1:]:
                if p.startswith("total="):
                    try:
                        return float(p[len("total="):])
                    except ValueError:
                        return None
    return None


Threads = dict[str, tuple[float, float]]  # thread id -> (ns on a CPU, ns waiting): schedstat_ns


def schedstat_ns(threads: dict[str, str]) -> Threads:
    """Thread id -> (its time on a CPU, its run-queue wait), ns, from each thread's schedstat line
    ('<cpu ns> <wait ns> <slices>')."""
    out: Threads = {}
    for tid, line in threads.items():
        parts = line.split()
        if len(parts) >= 2:
            try:
                out[tid] = (float(parts[0]), float(parts[1]))
            except ValueError:
                continue
    return out


def busiest(before: Threads, after: Threads) -> tuple[float, float] | None:
    """(ns on a CPU, ns waiting) between two schedstat readings (schedstat_ns) of the thread in both that wanted a
    CPU longest, running or waiting: the one doing the server's work; None when no thread is in both."""
    common = [k for k in after if k in before]
    if not common:
        return None
    return max(((after[k][0] - before[k][0], after[k][1] - before[k][1]) for k in common), key=lambda d: d[0] + d[1])


def read_schedstat(pid: int, proc_root: Path = Path("/proc")) -> dict[str, str]:
    """Thread id -> the text of its schedstat file ({} when the process is gone)."""
    out: dict[str, str] = {}
    try:
        tasks = list((proc_root / str(pid) / "task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            out[task.name] = (task / "schedstat").read_text()
        except OSError:
            continue
    return out


def titled(text: str, proc_root: Path = Path("/proc")) -> list[int]:
    """The processes whose title (cmdline) or name (comm) holds `text`, in id order."""
    out = []
    for d in proc_root.iterdir():
        if not d.name.isdigit():
            continue
        try:
            seen = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            seen = ""
        try:
            seen += " " + (d / "comm").read_text()
        except OSError:
            pass
        if text in seen:
            out.append(int(d.name))
    return sorted(out)


class CpuWait:
    """cpu_wait_frac per window from successive cumulative readings (fed by `update`, read by `read`)."""

    def __init__(self, source: str, *, proc_root: Path = Path("/proc"),
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`source`: `pid:<N>` (that process's threads), `title:<text>` (the threads of every process whose title
        or name holds the text, looked up again at each read: a restarted server's new processes; vLLM's model
        worker is `title:VLLM::Worker`) or the path of a PSI file."""
        self.source = source
        self.proc_root = proc_root
        self.clock = clock
        self.missing = MissingSeries("CPU wait source")
        self._last: tuple[float, float | dict[str, tuple[float, float]]] | None = None
        self.title = source[len("title:"):] if source.startswith("title:") else None
        if self.title == "":
            raise ValueError(f"cpu wait source {source!r}: title:<text> needs the text of a process's title")
        if source.startswith("pid:"):
            try:
                self.pid: int | None = int(source[4:])
            except ValueError:
                raise ValueError(f"cpu wait source {source!r}: pid:<N> needs a process id") from None
        else:
            self.pid = None

    @property
    def names_processes(self) -> bool:
        """Whether the source names the server's processes (pid: or title:), not a PSI file."""
        return self.pid is not None or self.title is not None

    def processes(self) -> list[int]:
        """The ids of the processes the source names, looked up now for a title ([] for a PSI file)."""
        if self.pid is not None:
            return [self.pid]
        return titled(self.title, self.proc_root) if self.title is not None else []

    def read(self) -> dict[str, float]:
        """{'cpu_wait_frac': share of the time since the previous read, and from a process 'cpu_ready_wait_frac'},
        or {} (first read, nothing readable)."""
        t = self.clock()
        if self.names_processes:
            threads = {k: v for pid in self.processes() for k, v in read_schedstat(pid, self.proc_root).items()}
            return self.update(t, schedstat_ns(threads) if threads else None)
        try:
            text = Path(self.source).read_text()
        except OSError:
            text = ""
        return self.update(t, psi_some_total_us(text))

    def update(self, t: float, reading: float | dict[str, tuple[float, float]] | None) -> dict[str, float]:
        """One cumulative reading at time `t` (seconds): a PSI total in microseconds, or thread id -> (on-CPU ns,
        wait ns)."""
        if reading is None or (isinstance(reading, dict) and not reading):
            self.missing.note(f"wait counter at {self.source}")
            self._last = None
            return {}
        last, self._last = self._last, (t, reading)
        if last is None or t <= last[0]:
            return {}
        dt, before = t - last[0], last[1]
        if isinstance(reading, dict) and isinstance(before, dict):
            common = [k for k in reading if k in before]
            if not common or any(reading[k][i] < before[k][i] for k in common for i in (0, 1)):
                return {}
            ran_ns, waited_ns = busiest(before, reading) or (0.0, 0.0)
            ran, waited = ran_ns / 1e9, waited_ns / 1e9  # seconds on a CPU, seconds waiting
            ready = ran + waited
            return {"cpu_wait_frac": min(MAX_WAIT_FRAC, max(0.0, waited / dt)),
                    "cpu_ready_wait_frac": min(MAX_WAIT_FRAC, waited / ready) if ready > 0 else 0.0}
        if isinstance(reading, float) and isinstance(before, float):
            waited = (reading - before) / 1e6
            if waited < 0:
                return {}
        else:
            return {}
        return {"cpu_wait_frac": min(MAX_WAIT_FRAC, max(0.0, waited / dt))}


def proc_stat_steal(text: str) -> tuple[float, float] | None:
    """(steal, runnable) cumulative ticks of the aggregate `cpu` line of a /proc/stat text: runnable is every
    column but idle and iowait (user, nice, system, irq, softirq, steal: guest time is inside user and nice);
    None when the text has no such line or a kernel too old for a steal column."""
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            try:
                ticks = dict(zip(PROC_STAT_COLUMNS, (float(v) for v in parts[1:9]), strict=True))
            except ValueError:
                return None
            return ticks["steal"], sum(ticks[m] for m in RUNNABLE_MODES)
    return None


class CpuSteal:
    """cpu_steal_frac per window from successive readings of a /proc/stat, or of node_exporter's CPU seconds in
    Prometheus (fed by `update`, read by `read`)."""

    def __init__(self, source: str = "/proc/stat", selector: str = "") -> None:
        """`source`: the path of the server's host's /proc/stat (this host's by default), or the http(s) URL of
        a Prometheus holding node_exporter's node_cpu_seconds_total of that host, which the label matchers
        `selector` pick (e.g. `instance="node-1:9100"`; empty: every host it has)."""
        self.source = source
        self.selector = selector
        self.prometheus = source.startswith(("http://", "https://"))
        self.missing = MissingSeries("CPU steal source")
        self._last: tuple[float, float] | None = None

    def read(self) -> dict[str, float]:
        """{'cpu_steal_frac': the stolen share since the previous read}, or {} (first read, nothing readable)."""
        if self.prometheus:
            return self.update(node_steal_reading(self.source, self.selector))
        try:
            text = Path(self.source).read_text()
        except OSError:
            text = ""
        return self.update(proc_stat_steal(text))

    def update(self, reading: tuple[float, float] | None) -> dict[str, float]:
        """One reading of proc_stat_steal's (steal, runnable) ticks."""
        if reading is None:
            self.missing.note("node_cpu_seconds_total (node_exporter) in Prometheus" if self.prometheus
                              else f"steal column of {self.source}")
            self._last = None
            return {}
        last, self._last = self._last, reading
        if last is None:
            return {}
        stolen, runnable = reading[0] - last[0], reading[1] - last[1]
        if stolen < 0 or runnable < 0:  # the counters went down: another host, a reboot
            return {}
        return {"cpu_steal_frac": min(MAX_WAIT_FRAC, stolen / runnable) if runnable > 0 else 0.0}
