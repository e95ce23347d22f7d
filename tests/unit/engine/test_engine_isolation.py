"""A failure inside one request fails that request (or the batch it rode in), never the engine: a seed
torch refuses, an iteration that raises. Only failures in a row (a broken device) make the engine fatal."""

from __future__ import annotations

import threading
from typing import Any

import torch

from tests.support.gpu_doubles import LaggedHostCopy
from tuner.engine.config import EngineConfig
from tuner.engine.engine import MAX_CONSECUTIVE_FAILURES, Engine, Request

BASE = {"cpu_threads": 1, "prefill_chunk_tokens": 16, "batching": "continuous", "max_batch_size": 4}


class FailingHostCopy(LaggedHostCopy):
    """Fault injection: the copy of new tokens raises on the calls listed in `fail_on` (1-based)."""

    def __init__(self, fail_on: set[int]) -> None:
        super().__init__()
        self.fail_on = fail_on

    def start(self, out: torch.Tensor, stream: Any) -> tuple[torch.Tensor, Any]:
        if self.copies + 1 in self.fail_on:
            self.copies += 1
            raise RuntimeError("injected device fault")
        return super().start(out, stream)


class Outputs:
    def __init__(self) -> None:
        self.tokens: dict[int, list[int]] = {}
        self.reasons: dict[int, str] = {}
        self.done: dict[int, threading.Event] = {}

    def emit(self, items: list[Any]) -> None:
        for req, toks, reason in items:
            self.tokens.setdefault(req.id, []).extend(toks)
            if reason is not None:
                self.reasons[req.id] = reason
                self.done[req.id].set()

    def submit(self, engine: Engine, req: Request) -> Request:
        self.done[req.id] = threading.Event()
        engine.submit(req)
        return req

    def reason(self, req: Request) -> str:
        assert self.done[req.id].wait(60), "request did not finish"
        return self.reasons[req.id]


def _engine(out: Outputs, **kw: Any) -> Engine:
    host_copy = kw.pop("host_copy", None)
    engine = Engine(EngineConfig(**{**BASE, **kw}), emit=out.emit, host_copy=host_copy)
    engine.start()
    assert engine.ready.wait(60)
    return engine


def test_a_seed_torch_refuses_fails_that_request_alone() -> None:
    out = Outputs()
    engine = _engine(out)
    try:
        bad = out.submit(engine, Request(prompt=[5, 6, 7], max_tokens=4, temperature=0.7, seed=2**64))
        good = out.submit(engine, Request(prompt=[5, 6, 7], max_tokens=4, temperature=0.7, seed=3,
                                          ignore_eos=True))
        assert out.reason(bad).startswith("error:request refused")
        assert out.reason(good) == "length" and len(out.tokens[good.id]) == 4
        assert engine.fatal is None and engine.pool.used == 0
    finally:
        engine.stop()


def test_a_failing_iteration_fails_its_batch_and_the_engine_serves_on() -> None:
    out = Outputs()
    engine = _engine(out, async_output=True, host_copy=FailingHostCopy({2}))
    try:
        first = out.submit(engine, Request(prompt=[9, 10, 11], max_tokens=6, ignore_eos=True))
        assert out.reason(first).startswith("error:request failed: RuntimeError: injected device fault")
        after = out.submit(engine, Request(prompt=[9, 10, 11], max_tokens=6, ignore_eos=True))
        assert out.reason(after) == "length" and len(out.tokens[after.id]) == 6
        assert engine.fatal is None and engine.pool.used == 0
    finally:
        engine.stop()


def test_failures_in_a_row_make_the_engine_fatal() -> None:
    out = Outputs()
    fails = set(range(1, 100))
    engine = _engine(out, async_output=True, host_copy=FailingHostCopy(fails))
    try:
        reasons = []
        for _ in range(MAX_CONSECUTIVE_FAILURES):
            req = out.submit(engine, Request(prompt=[9, 10, 11], max_tokens=6, ignore_eos=True))
            reasons.append(out.reason(req))
        assert all(r.startswith("error:") for r in reasons)
        assert engine.fatal is not None
    finally:
        engine.stop()
