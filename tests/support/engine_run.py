"""Run a batch of greedy requests through an in-process Engine and return each request's tokens.

Shared by the CPU schedule tests and the GPU checks (tests/integration/engine/test_engine_gpu.py, which also runs
as a plain script on a GPU host without pytest: keep this module free of test-framework imports)."""

from __future__ import annotations

import threading
from typing import Any

from tuner.engine.config import EngineConfig
from tuner.engine.engine import Engine, Request


def generate(cfg: EngineConfig, prompts: list[list[int]], max_tokens: list[int], *, ready_s: float = 600,
             finish_s: float = 300, **engine_kw: Any) -> list[list[int]]:
    """Submit every prompt at once (ignore_eos), wait for all, check the engine neither failed nor kept a
    slot, and return the tokens in prompt order. engine_kw: Engine's doubles (graph_backend, host_copy)."""
    tokens: dict[int, list[int]] = {}
    done: dict[int, threading.Event] = {}

    def emit(items: list[Any]) -> None:
        for req, toks, reason in items:
            tokens.setdefault(req.id, []).extend(toks)
            if reason is not None:
                done[req.id].set()

    engine = Engine(cfg, emit=emit, **engine_kw)
    engine.start()
    assert engine.ready.wait(ready_s), "engine not ready"
    try:
        reqs = [Request(prompt=p, max_tokens=m, ignore_eos=True) for p, m in zip(prompts, max_tokens, strict=True)]
        for r in reqs:
            done[r.id] = threading.Event()
            engine.submit(r)
        for r in reqs:
            assert done[r.id].wait(finish_s), f"request did not finish ({cfg.knobs()})"
        assert engine.fatal is None
        assert engine.pool.used == 0, "a finished request kept its KV slot"
        return [tokens[r.id] for r in reqs]
    finally:
        engine.stop()
