"""The KV-cache pool: one slot of max_model_len + 1 positions per running sequence.

Sized by `kv_pool_mb`: capacity = pool bytes // slot bytes. With `pre_allocate` the whole pool is
allocated (and touched) at start-up; otherwise it starts empty and grows by doubling when a sequence
needs a slot, which reallocates and copies the pool (if the device has no memory left for that, the
pool keeps the size it has). When every slot is taken, `acquire` returns None and the scheduler keeps
the request waiting.
"""

from __future__ import annotations

import heapq
import logging

import torch

from tuner.engine.config import ModelConfig, check_pool, slot_bytes

log = logging.getLogger(__name__)


class KVPool:
    def __init__(self, mc: ModelConfig, *, dtype: torch.dtype, device: str, pool_mb: int,
                 pre_allocate: bool) -> None:
        dtype_name = str(dtype).removeprefix("torch.")
        self.mc = mc
        self.dtype = dtype
        self.device = device
        self.positions = mc.max_model_len + 1  # the last one is a scratch column
        self.slot_bytes = slot_bytes(mc, dtype_name)
        self.capacity = check_pool(mc, dtype_name, pool_mb)
        self.allocated = 0
        self.data: torch.Tensor | None = None
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self._free: list[int] = []
        self.used = 0
        self.grow_count = 0
        if pre_allocate:
            self._grow(self.capacity)

    @property
    def total_bytes(self) -> int:
        return self.allocated * self.slot_bytes

    def usage(self) -> float:
        """Fraction of the pool's capacity held by sequences (0..1)."""
        return self.used / self.capacity

    def _grow(self, n: int) -> None:
        mc = self.mc
        new = torch.zeros(mc.num_layers, 2, n, mc.num_kv_heads, self.positions, mc.head_dim,
                          dtype=self.dtype, device=self.device)
        if self.data is not None:
            new[:, :, : self.allocated].copy_(self.data)
        for s in range(self.allocated, n):
            heapq.heappush(self._free, s)
        self.data = new
        self.k = [new[i, 0] for i in range(mc.num_layers)]
        self.v = [new[i, 1] for i in range(mc.num_layers)]
        if self.allocated:
            self.grow_count += 1
            log.info("KV pool grew from %d to %d slots", self.allocated, n)
        self.allocated = n

    def acquire(self) -> int | None:
        """The lowest free slot, growing the pool if allowed; None when the pool is full."""
        if not self._free:
            if self.allocated >= self.capacity:
                return None
            try:
                self._grow(min(self.capacity, max(1, 2 * self.allocated)))
            except torch.OutOfMemoryError:
                if not self.allocated:
                    raise
                # the device cannot hold more: the pool stops here and requests wait for a slot
                log.warning("KV pool cannot grow past %d slots (out of device memory): capping it there",
                            self.allocated)
                self.capacity = self.allocated
                return None
        self.used += 1
        return heapq.heappop(self._free)

    def release(self, slot: int) -> None:
        heapq.heappush(self._free, slot)
        self.used -= 1

    def swap(self, a: int, b: int, upto: int) -> None:
        """Exchange the first `upto` positions of slots a and b (all layers, k and v)."""
        if a == b or upto <= 0 or self.data is None:
            return
        d = self.data
        idx = torch.tensor([a, b], device=d.device)
        rev = torch.tensor([b, a], device=d.device)
        d[:, :, idx, :, :upto] = d[:, :, rev, :, :upto]

    def is_free(self, slot: int) -> bool:
        return slot in self._free

    def move(self, src: int, dst: int, upto: int) -> None:
        """Move a sequence's first `upto` positions from slot src to the free slot dst; src becomes free."""
        self._free.remove(dst)
        heapq.heappush(self._free, src)
        heapq.heapify(self._free)
        if upto > 0 and self.data is not None:
            self.data[:, :, dst, :, :upto] = self.data[:, :, src, :, :upto]
