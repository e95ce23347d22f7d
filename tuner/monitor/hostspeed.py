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
how many runs that median is of; `read()` the monitor's signal, {'host_probe_us': the 4-MB product's median}
({} where nothing ran since the last read). About 1 ms of CPU every half second, BLAS held to one thread while
the tasks run (threadpoolctl: their CPU time is then this thread's).

The monitor judges latencies at the host's speed with the server's elasticity to it
(tuner.monitor.config.MonitorConfig.host_speed_elasticity): vLLM's CPU build on one thread at its capacity slowed
with the probe (experiments/detection, thirty-third step: the probe at least x1.1 in all 14 windows where vLLM's
CPU per step was x1.15, correlation 0.76).

Measured here (2 vCPUs, KVM, alone: 4-MB product 150-165 us): a neighbour copying 24 MB arrays on the other
core x1.4, 256 MB arrays x1.1, a pure-Python loop on the other core x1.0; the 64x64 product and the Python loop
x1.0 under all three.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from collections.abc import Callable

import numpy as np
from threadpoolctl import ThreadpoolController

TASKS = ("mv4_us", "mm64_us", "py_us")
KEEP_S = 1800.0  # how long the 4-MB product's runs are kept for readers (HostSpeedReader)


class HostSpeed:
    """The probe's thread and its runs: `take()` each task's medians since the last take (one reader: a
    recorder), `median_since(t)` the 4-MB product's since a time (any number of readers: HostSpeedReader)."""

    def __init__(self, period_s: float = 0.5, seed: int = 0, keep_s: float = KEEP_S) -> None:
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
        self._runs: dict[str, deque[float]] = {k: deque(maxlen=self._keep) for k in TASKS}
        self._recent: deque[tuple[float, float]] = deque(maxlen=self._keep)  # (monotonic s, us)
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

    def _loop(self) -> None:
        while not self._stop.wait(self._period_s):
            one = self._once()
            with self._lock:
                for k, v in one.items():
                    self._runs[k].append(v)
                self._recent.append((time.monotonic(), one["mv4_us"]))

    def start(self) -> HostSpeed:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def take(self) -> dict[str, float]:
        """Each task's median CPU microseconds per run since the last take, and `runs`: how many (0: no field)."""
        with self._lock:
            runs, self._runs = self._runs, {k: deque(maxlen=self._keep) for k in TASKS}
        n = min(len(v) for v in runs.values())
        out: dict[str, float] = {"runs": float(n)}
        if n:
            out.update({k: statistics.median(v) for k, v in runs.items()})
        return out

    def median_since(self, t0: float) -> float | None:
        """The 4-MB product's median CPU microseconds over its runs since `t0` (time.monotonic()), None if none."""
        with self._lock:
            got = [us for t, us in self._recent if t > t0]
        return statistics.median(got) if got else None


_shared: HostSpeed | None = None
_shared_lock = threading.Lock()


def shared() -> HostSpeed:
    """This process's one probe, started at the first call (the host's speed is the host's, not an agent's)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = HostSpeed().start()
        return _shared


class HostSpeedReader:
    """One reader of a probe's windows (the daemon's monitor of one agent): `read()` gives the monitor's signal
    for the time since its previous read."""

    def __init__(self, probe: HostSpeed) -> None:
        self.probe = probe
        self._since = time.monotonic()

    def read(self) -> dict[str, float]:
        """{'host_probe_us': the 4-MB product's median CPU microseconds since the last read}, or {} where it did
        not run since."""
        now = time.monotonic()
        got = self.probe.median_since(self._since)
        self._since = now
        return {} if got is None else {"host_probe_us": got}
