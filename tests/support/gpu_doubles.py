"""Stand-ins for the engine's GPU-only mechanisms on a machine without a GPU, passed to the Engine (or
the Runner): CUDA graphs (RerunGraphs), async output's pinned-memory copy (LaggedHostCopy) and the flash
kernel of `attention=flash` (ReferenceVarlen).

A CUDA graph records the kernels of one call of the decode step and replays them on the same buffers.
This double records nothing: `capture` runs the step once (so the runner's state handling around a
capture is exercised) and `replay` runs the same closure again, on the same buffers, with the batch size
and attention length it was captured with. What it cannot show is a real capture's own rules (no host
synchronisation inside, fixed addresses): the GPU tests (tests/integration/engine/test_engine_gpu.py) do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tuner.engine.runner import GraphBackend, HostCopy
from tuner.engine.varlen import VarlenAttention


class RerunGraphs(GraphBackend):
    def __init__(self) -> None:
        self.captures = 0
        self.replays = 0

    def runs_on(self, device: str) -> bool:
        return True

    def pool(self) -> Any:
        return None

    def capture(self, step: Callable[[], object], pool: Any, stream: Any) -> Callable[[], None]:
        self.captures += 1
        step()

        def replay() -> None:
            self.replays += 1
            step()

        return replay


class LaggedHostCopy(HostCopy):
    """async_output on a CPU: the copy is made at once (there is no device to wait for); the engine still
    delivers each step's tokens one iteration late, which is the logic these tests exercise."""

    def __init__(self) -> None:
        self.copies = 0
        self.waits = 0

    def runs_on(self, device: str) -> bool:
        return True

    def start(self, out: torch.Tensor, stream: Any) -> tuple[torch.Tensor, Any]:
        self.copies += 1
        return out.clone(), object()

    def wait(self, event: Any) -> None:
        self.waits += 1


class ReferenceVarlen(VarlenAttention):
    """attention=flash on a CPU: the varlen kernel's contract (tuner.engine.varlen) computed sequence by
    sequence in float32, in any dtype. It checks what the kernel would not: that every sequence reads only
    its own keys and at most max_k of them."""

    def __init__(self) -> None:
        self.calls = 0

    def unavailable(self, device: str, dtype: str, head_dim: int | None = None) -> str | None:
        return None

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor,
                 cu_k: torch.Tensor, max_q: int, max_k: int, seqused_k: torch.Tensor, scale: float) -> torch.Tensor:
        self.calls += 1
        assert cu_q.dtype == cu_k.dtype == seqused_k.dtype == torch.int32
        assert q.shape[1] % k.shape[1] == 0, "query heads must be a multiple of KV heads"
        group = q.shape[1] // k.shape[1]
        out = torch.empty_like(q)
        for i in range(cu_q.numel() - 1):
            q0, q1, k0, n = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(seqused_k[i])
            assert 0 < q1 - q0 <= max_q and 0 < n <= max_k and k0 + n <= int(cu_k[i + 1]), (i, q0, q1, k0, n)
            keys = k[k0:k0 + n].float().repeat_interleave(group, dim=1)  # [n, Hq, D]
            vals = v[k0:k0 + n].float().repeat_interleave(group, dim=1)
            scores = torch.einsum("thd,nhd->htn", q[q0:q1].float(), keys) * scale
            out[q0:q1] = torch.einsum("htn,nhd->thd", scores.softmax(-1), vals).to(q.dtype)
        return out
