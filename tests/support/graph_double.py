"""A stand-in for CUDA graphs on a machine without a GPU, passed to tuner.engine.runner.Runner.

A CUDA graph records the kernels of one call of the decode step and replays them on the same buffers.
This double records nothing: `capture` runs the step once (so the runner's state handling around a
capture is exercised) and `replay` runs the same closure again, on the same buffers, with the batch size
and attention length it was captured with. What it cannot show is a real capture's own rules (no host
synchronisation inside, fixed addresses): the GPU tests (tests/integration/test_engine_gpu.py) do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tuner.engine.runner import GraphBackend


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
