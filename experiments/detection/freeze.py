"""A server slowed from outside: its processes stopped (SIGSTOP) a set share of the time, in short cycles.

A server that runs only a share 1 - s of the wall-clock time takes 1 / (1 - s) as long for all its work, at
the same load and with nothing in its configuration changed: the issue's "server slowdown at unchanged load" for a
server that has no slowdown option of its own (vLLM; the reference engine has `--step-slowdown-frac`). Stopped
threads are on no run queue, so the CPU wait the monitor corrects for does not count this time (as for a
hypervisor's steal the guest cannot see, or a GPU that runs its kernels slower).

    with Freezer([pid], slowdown_frac=0.3):  # every piece of the server's work 1.3 times as long
        ...

The stopped share is held on target over the whole run (each stop is sized from the time stopped so far against
the time elapsed), so a late wake-up of this thread does not change the slowdown on average. The processes are
always continued when the block ends, whatever ended it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Sequence
from types import TracebackType

DEFAULT_PERIOD_S = 0.1  # one stop and one run per 100 ms: 150 of them in a 15-s scrape window
# (measured on vLLM's CPU build at 2 req/s, stopped 0.23 of the time: ITL x1.32 at a 100-ms period, x1.49 at
# 20 ms and x1.45 at 5 ms; each stop costs the server more than its length, which shorter periods multiply)


def stopped_share(slowdown_frac: float) -> float:
    """The share of the time a server must be stopped for its work to take 1 + slowdown_frac times as long."""
    if not slowdown_frac >= 0:
        raise ValueError(f"slowdown_frac must be >= 0, got {slowdown_frac}")
    return 1.0 - 1.0 / (1.0 + slowdown_frac)


class Freezer:
    """Stops `pids` for stopped_share(slowdown_frac) of every `period_s` in a thread of its own while entered."""

    def __init__(self, pids: Sequence[int], slowdown_frac: float, period_s: float = DEFAULT_PERIOD_S) -> None:
        if not pids:
            raise ValueError("Freezer needs at least one process id")
        if not period_s > 0:
            raise ValueError(f"period_s must be > 0, got {period_s}")
        self.pids = list(pids)
        self.share = stopped_share(slowdown_frac)
        self.period_s = period_s
        self.stopped_s = 0.0  # the time the processes were held stopped so far
        self.elapsed_s = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _signal(self, sig: signal.Signals) -> None:
        for pid in self.pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                continue

    def _run(self) -> None:
        start = time.monotonic()
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                # stop for as long as puts the stopped share back on target at the end of this period
                hold = self.share * (now - start + self.period_s) - self.stopped_s
                if hold > 0:
                    t0 = time.monotonic()
                    self._signal(signal.SIGSTOP)
                    try:
                        self._stop.wait(hold)
                    finally:
                        self._signal(signal.SIGCONT)
                    self.stopped_s += time.monotonic() - t0
                self._stop.wait(max(0.0, start + self.stopped_s / self.share - time.monotonic())
                                if self.share > 0 else self.period_s)
        finally:
            self._signal(signal.SIGCONT)
            self.elapsed_s = time.monotonic() - start

    def __enter__(self) -> Freezer:
        if self.share > 0:
            self._thread = threading.Thread(target=self._run, name="freezer", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._signal(signal.SIGCONT)

    def share_held(self) -> float:
        """The share of the time the processes were stopped (after the block ends)."""
        return self.stopped_s / self.elapsed_s if self.elapsed_s > 0 else 0.0
