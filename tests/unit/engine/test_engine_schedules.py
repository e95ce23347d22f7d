"""Seeded random schedules of the engine on the CPU against each request decoded alone: batching, batch
and graph sizes, warm-up, async output, attention, pool sizes and prefill chunks drawn at random; CUDA graphs,
the async copy and the flash kernel stood in for by tests/support/gpu_doubles.py. Greedy tokens must not depend
on the schedule."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.support.engine_run import generate as run
from tests.support.gpu_doubles import LaggedHostCopy, ReferenceVarlen, RerunGraphs
from tuner.engine.config import EngineConfig


def generate(prompts: list[list[int]], max_tokens: list[int], **knobs: Any) -> list[list[int]]:
    cfg = EngineConfig(device="cpu", cpu_threads=1, max_model_len=160, **knobs)
    return run(cfg, prompts, max_tokens, ready_s=30, finish_s=60, graph_backend=RerunGraphs(),
               host_copy=LaggedHostCopy(), varlen=ReferenceVarlen())


@pytest.mark.parametrize("seed", range(10))
def test_a_random_schedule_gives_each_request_its_tokens_alone(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(3, 9)
    prompts = [[rng.randrange(3, 500) for _ in range(rng.randint(1, 100))] for _ in range(n)]
    max_tokens = [rng.randint(1, 160 - 1 - len(p)) if rng.random() < 0.2 else rng.randint(1, 24) for p in prompts]
    graphs = rng.random() < 0.6
    knobs: dict[str, Any] = {
        "batching": rng.choice(["static", "continuous"]),
        "max_batch_size": rng.randint(1, 10),
        "batch_timeout_ms": rng.choice([0.0, 5.0]),
        "prefill_chunk_tokens": rng.choice([7, 16, 64, 512]),
        "scheduling_policy": rng.choice(["fcfs", "shortest-prompt-first"]),
        "kv_pool_mb": rng.choice([1, 2, 8]),  # 6, 12 or 50 slots of 161 positions
        "pre_allocate": graphs or rng.random() < 0.5,
        "cuda_graphs": graphs,
        "cuda_graph_max_batch": rng.randint(1, 10),
        "warmup": rng.random() < 0.5,
        "async_output": rng.random() < 0.5,
        "attention": rng.choice(["sdpa", "matmul", "flash"]),
    }
    alone = generate(prompts, max_tokens, batching="continuous", max_batch_size=1, attention=knobs["attention"])
    assert generate(prompts, max_tokens, **knobs) == alone, knobs
