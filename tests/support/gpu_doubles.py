"""Stand-ins for the engine's GPU-only mechanisms on a machine without a GPU, passed to the Engine (or
the Runner): CUDA graphs (RerunGraphs) and async output's pinned-memory copy (LaggedHostCopy).

A CUDA graph records the kernels of one call of the decode step and replays them on the same buffers.
This double records nothing: `capture` runs the step once (so the runner's state handling around a
capture is exercised) and `replay` runs the same closure again, on the same buffers, with the batch size
and attention length it was captured with. What it cannot show is a real capture's own rules (no host
synchronisation inside, fixed addresses): the GPU tests (tests/integration/test_engine_gpu.py) do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tuner.engine.runner import GraphBackend, HostCopy


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
