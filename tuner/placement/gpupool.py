"""A pool of GPU ids that parallel trials claim disjointly.

    pool = GpuPool([0, 1, 2, 3, 4, 5, 6, 7])       # or GpuPool(None): every GPU NVML sees
    with pool.claim(2, stop_event, label="trial-3") as gpus:   # blocks until 2 are free
        ...                                       # gpus == (0, 1), say; CUDA_VISIBLE_DEVICES for the trial

A claim larger than the pool raises InfeasibleConfig at once; a stop request while waiting raises
Interrupted. Every claim is recorded in `pool.history` (label, gpus, start, end) so that tests can prove
that no two claims ever overlapped in time on the same GPU.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from tuner.errors import InfeasibleConfig, Interrupted

log = logging.getLogger(__name__)


@dataclass
class Claim:
    """One claim of the pool: which GPUs, by whom, from when to when (monotonic seconds)."""

    label: str
    gpus: tuple[int, ...]
    start_s: float
    end_s: float | None = None


def visible_gpu_ids() -> list[int]:
    """The GPU indices NVML sees (empty without a driver or GPU)."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver, no library: no GPUs
        return []
    try:
        return list(range(int(pynvml.nvmlDeviceGetCount())))
    except Exception:  # noqa: BLE001
        return []
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


class GpuPool:
    """Thread-safe pool of GPU ids. Claims are disjoint; lower ids are handed out first."""

    def __init__(self, ids: Sequence[int] | None = None) -> None:
        chosen = visible_gpu_ids() if ids is None else list(ids)
        if len(set(chosen)) != len(chosen):
            raise ValueError(f"GPU ids must be distinct (got {chosen})")
        self.ids: tuple[int, ...] = tuple(chosen)
        self._free: set[int] = set(chosen)
        self._cond = threading.Condition()
        self._queue: deque[object] = deque()
        self.history: list[Claim] = []

    @property
    def total(self) -> int:
        return len(self.ids)

    @property
    def free(self) -> tuple[int, ...]:
        with self._cond:
            return tuple(sorted(self._free))

    def _take(self, n: int) -> tuple[int, ...]:
        # prefer a contiguous run of ids (NVLink neighbours on most nodes), else the lowest free ids
        free = sorted(self._free)
        order = [i for i in self.ids if i in self._free]
        for start in range(len(order) - n + 1):
            run = order[start:start + n]
            if all(self.ids.index(b) - self.ids.index(a) == 1 for a, b in zip(run, run[1:], strict=False)):
                return tuple(run)
        return tuple(free[:n])

    @contextlib.contextmanager
    def claim(
        self,
        n: int,
        stop_event: threading.Event | None = None,
        *,
        label: str = "",
        poll_s: float = 0.1,
    ) -> Iterator[tuple[int, ...]]:
        """Block until `n` GPUs are free, hold them for the with-block, then give them back."""
        if n < 0:
            raise ValueError(f"cannot claim {n} GPUs")
        if n > self.total:
            raise InfeasibleConfig(f"needs {n} GPUs, the node has {self.total}")
        with self._cond:
            # first come, first served: a big claim is never starved by a stream of small ones
            ticket = object()
            self._queue.append(ticket)
            try:
                while self._queue[0] is not ticket or len(self._free) < n:
                    if stop_event is not None and stop_event.is_set():
                        raise Interrupted(f"stop requested while waiting for {n} GPUs")
                    self._cond.wait(timeout=poll_s)
                if stop_event is not None and stop_event.is_set():
                    raise Interrupted(f"stop requested while waiting for {n} GPUs")
            finally:
                self._queue.remove(ticket)
                self._cond.notify_all()
            gpus = self._take(n)
            self._free.difference_update(gpus)
            record = Claim(label=label, gpus=gpus, start_s=time.monotonic())
            self.history.append(record)
        log.debug("%s claimed GPUs %s", label or "a trial", gpus)
        try:
            yield gpus
        finally:
            with self._cond:
                record.end_s = time.monotonic()
                self._free.update(gpus)
                self._cond.notify_all()
            log.debug("%s released GPUs %s", label or "a trial", gpus)


def overlaps(history: Sequence[Claim]) -> list[tuple[Claim, Claim]]:
    """Pairs of claims that held a common GPU at the same time (should always be empty)."""
    bad = []
    for i, a in enumerate(history):
        for b in history[i + 1:]:
            if not set(a.gpus) & set(b.gpus):
                continue
            a_end = a.end_s if a.end_s is not None else float("inf")
            b_end = b.end_s if b.end_s is not None else float("inf")
            if a.start_s < b_end and b.start_s < a_end:
                bad.append((a, b))
    return bad
