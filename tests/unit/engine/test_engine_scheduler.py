"""The engine's scheduler on the CPU: greedy output whatever the batching, waiting on a full pool,
static vs continuous admission, scheduling policies, seeded sampling, EOS and aborts."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterable
from typing import Any

import pytest
import torch

from tests.support.gpu_doubles import LaggedHostCopy, RerunGraphs
from tuner.engine.config import EngineConfig
from tuner.engine.engine import Engine, EngineStats, Request

BASE = {"cpu_threads": 1, "prefill_chunk_tokens": 16, "batch_timeout_ms": 5.0}
PROMPTS = [list(range(7 + 3 * i, 7 + 3 * i + n)) for i, n in enumerate([5, 33, 17, 90, 9, 48, 2, 64])]
MAX_TOKENS = [12, 5, 20, 8, 16, 3, 11, 9]


class Recorder(EngineStats):
    def __init__(self) -> None:
        self.max_running = 0
        self.max_waiting = 0

    def queue(self, running: int, waiting: int, kv_usage: float) -> None:
        self.max_running = max(self.max_running, running)
        self.max_waiting = max(self.max_waiting, waiting)


class Harness:
    """An engine in this process; collects outputs and the global order of events."""

    def __init__(self, stats: EngineStats | None = None, graph_backend: Any = None, host_copy: Any = None,
                 **knobs: Any) -> None:
        self.tokens: dict[int, list[int]] = {}
        self.reasons: dict[int, str] = {}
        self.events: list[tuple[str, int]] = []  # ("first"|"finish", request id)
        self.done: dict[int, threading.Event] = {}
        self.lock = threading.Lock()
        self.engine = Engine(EngineConfig(**{**BASE, **knobs}), emit=self._emit, stats=stats,
                             graph_backend=graph_backend, host_copy=host_copy)

    def _emit(self, items: list[Any]) -> None:
        with self.lock:
            for req, toks, reason in items:
                got = self.tokens.setdefault(req.id, [])
                if not got and toks:
                    self.events.append(("first", req.id))
                got.extend(toks)
                if reason is not None:
                    self.reasons[req.id] = reason
                    self.events.append(("finish", req.id))
                    self.done[req.id].set()

    def __enter__(self) -> Harness:
        self.engine.start()
        assert self.engine.ready.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        self.engine.stop()

    def submit(self, prompt: list[int], max_tokens: int, **kw: Any) -> Request:
        kw.setdefault("ignore_eos", True)
        req = Request(prompt=prompt, max_tokens=max_tokens, **kw)
        self.done[req.id] = threading.Event()
        self.engine.submit(req)
        return req

    def wait(self, reqs: Iterable[Request]) -> list[list[int]]:
        out = []
        for r in reqs:
            assert self.done[r.id].wait(60), "request did not finish"
            out.append(self.tokens[r.id])
        return out

    def first_token(self, req: Request) -> None:
        for _ in range(6000):
            with self.lock:
                if self.tokens.get(req.id):
                    return
            threading.Event().wait(0.005)
        raise AssertionError("no first token")


def run_all(order: list[int] | None = None, **knobs: Any) -> list[list[int]]:
    order = order if order is not None else list(range(len(PROMPTS)))
    with Harness(**knobs) as h:
        reqs = {i: h.submit(PROMPTS[i], MAX_TOKENS[i]) for i in order}
        outs = h.wait([reqs[i] for i in range(len(PROMPTS))])
    assert [len(o) for o in outs] == MAX_TOKENS
    return outs


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    """Each request alone: batch size 1."""
    return run_all(batching="continuous", max_batch_size=1)


@pytest.mark.parametrize("knobs", [
    {"batching": "static", "max_batch_size": 8},
    {"batching": "static", "max_batch_size": 3},
    {"batching": "continuous", "max_batch_size": 8},
    {"batching": "continuous", "max_batch_size": 3, "pre_allocate": True},
    {"batching": "continuous", "max_batch_size": 8, "kv_pool_mb": 7},  # 3 slots, growing on demand
    {"batching": "continuous", "max_batch_size": 5, "scheduling_policy": "shortest-prompt-first"},
    {"batching": "continuous", "max_batch_size": 8, "attention": "matmul"},
], ids=["static8", "static3", "cont8", "cont3-prealloc", "cont8-smallpool", "cont5-spf", "cont8-matmul"])
def test_greedy_output_is_the_same_whatever_the_batching(reference: list[list[int]], knobs: dict) -> None:
    assert run_all(**knobs) == reference


@pytest.mark.parametrize("knobs", [
    {"batching": "continuous", "max_batch_size": 8},
    {"batching": "continuous", "max_batch_size": 8, "cuda_graph_max_batch": 4, "warmup": True},
    {"batching": "static", "max_batch_size": 6},
    {"batching": "continuous", "max_batch_size": 5, "scheduling_policy": "shortest-prompt-first"},
    {"batching": "continuous", "max_batch_size": 3, "attention": "matmul"},
], ids=["cont8", "cont8-graphs-to-4-warm", "static6", "cont5-spf", "cont3-matmul"])
def test_greedy_output_with_graph_replays_equals_the_reference(reference: list[list[int]], knobs: dict) -> None:
    """CUDA-graph bookkeeping on the CPU: the captured steps are replayed by re-running them
    (tests/support/gpu_doubles.py). Batches are padded to captured sizes while other sequences finish
    their prefill in the same iteration."""
    backend = RerunGraphs()
    assert run_all(graph_backend=backend, cuda_graphs=True, pre_allocate=True, **knobs) == reference
    assert backend.captures > 0 and backend.replays > 0


def test_a_sequence_finishing_its_prefill_beside_a_padded_batch_keeps_its_state() -> None:
    """Three short prompts decode (3 rows, padded to a captured batch of 4) in the iteration where the
    fourth finishes its prefill in slot 3: the padded row must not clobber that sequence's decode state
    (it used to: position max_model_len + 1, an out-of-range RoPE index, a failed engine)."""
    prompts = [[5, 6], [7, 8], [9, 10], list(range(20, 40))]
    knobs: dict[str, Any] = {"batching": "continuous", "max_batch_size": 8}
    outs = []
    for kw in ({}, {"graph_backend": RerunGraphs(), "cuda_graphs": True, "pre_allocate": True}):
        with Harness(**knobs, **kw) as h:
            outs.append(h.wait([h.submit(p, 6) for p in prompts]))
            assert h.engine.fatal is None
    assert outs[1] == outs[0] and [len(o) for o in outs[0]] == [6] * 4


@pytest.mark.parametrize("knobs", [
    {"batching": "continuous", "max_batch_size": 8},
    {"batching": "static", "max_batch_size": 3},
    {"batching": "continuous", "max_batch_size": 5, "cuda_graphs": True, "pre_allocate": True},
], ids=["cont8", "static3", "cont5-graphs"])
def test_async_output_delivers_the_same_tokens_one_iteration_late(reference: list[list[int]], knobs: dict) -> None:
    """async_output's delivery lag on the CPU (tests/support/gpu_doubles.py stands in for the pinned
    copy and its CUDA event)."""
    copy = LaggedHostCopy()
    extra = {"graph_backend": RerunGraphs()} if knobs.get("cuda_graphs") else {}
    assert run_all(host_copy=copy, async_output=True, **extra, **knobs) == reference
    assert copy.copies > 0 and copy.waits > 0


def test_async_output_stops_at_eos_and_frees_slots_after_an_abort(reference: list[list[int]]) -> None:
    ref = reference[2]
    eos = ref[3]
    copy = LaggedHostCopy()
    h = Harness(batching="continuous", max_batch_size=4, kv_pool_mb=7, async_output=True, host_copy=copy)
    h.engine.mc = dataclasses.replace(h.engine.mc, eos_token_id=eos)
    with h:
        stops = h.submit(PROMPTS[2], MAX_TOKENS[2], ignore_eos=False)
        long = h.submit(PROMPTS[0], 400)
        h.first_token(long)
        h.engine.abort(long)
        (out_stop,) = h.wait([stops])
        (after,) = h.wait([h.submit(PROMPTS[1], 4)])
        deadline = time.monotonic() + 10
        while h.engine.pool.used and time.monotonic() < deadline:
            time.sleep(0.01)
    assert out_stop == ref[: ref.index(eos) + 1] and h.reasons[stops.id] == "stop"
    assert len(after) == 4 and long.aborted and h.engine.pool.used == 0


def test_greedy_output_does_not_depend_on_arrival_order(reference: list[list[int]]) -> None:
    assert run_all(order=list(reversed(range(len(PROMPTS)))), batching="continuous",
                   max_batch_size=4) == reference


def test_engine_matches_a_cache_free_reference(reference: list[list[int]]) -> None:
    """Greedy decoding by re-running the whole prefix every step (no KV reuse) gives the same tokens."""
    with Harness(batching="continuous", max_batch_size=1, pre_allocate=True) as h:
        model, pool = h.engine.model, h.engine.pool
        for i in (0, 2):
            seq = list(PROMPTS[i])
            out = []
            with torch.inference_mode():
                for _ in range(MAX_TOKENS[i]):
                    logits = model.prefill(torch.tensor(seq), 0, 0, pool.k, pool.v)
                    out.append(int(logits.argmax()))
                    seq.append(out[-1])
            assert out == reference[i]


def test_full_pool_makes_requests_wait(reference: list[list[int]]) -> None:
    stats = Recorder()
    # 5 MiB holds 2 sequences of the tiny preset (2 MiB each): 8 requests, a batch of 8 allowed
    with Harness(stats=stats, batching="continuous", max_batch_size=8, kv_pool_mb=5) as h:
        assert h.engine.pool.capacity == 2
        reqs = [h.submit(PROMPTS[i], MAX_TOKENS[i]) for i in range(len(PROMPTS))]
        outs = h.wait(reqs)
        assert h.engine.fatal is None and not h.engine.running and not h.engine.waiting
    assert outs == reference
    assert stats.max_running == 2
    assert stats.max_waiting >= 5


def _late_joiner(batching: str) -> tuple[list[tuple[str, int]], Request, Request, Request]:
    with Harness(batching=batching, max_batch_size=3, batch_timeout_ms=0.0) as h:
        a = h.submit(PROMPTS[0], 60)
        b = h.submit(PROMPTS[1], 60)
        h.first_token(a)
        c = h.submit(PROMPTS[2], 5)
        h.wait([a, b, c])
        return list(h.events), a, b, c


def test_static_batch_runs_to_completion_before_new_requests_join() -> None:
    events, a, b, c = _late_joiner("static")
    assert events.index(("first", c.id)) > max(events.index(("finish", a.id)), events.index(("finish", b.id)))


def test_continuous_batching_lets_new_requests_join() -> None:
    events, a, b, c = _late_joiner("continuous")
    assert events.index(("finish", c.id)) < events.index(("finish", a.id))


def test_static_batch_forms_once_full_without_waiting_the_timeout() -> None:
    with Harness(batching="static", max_batch_size=2, batch_timeout_ms=600_000.0) as h:
        outs = h.wait([h.submit(PROMPTS[0], 3), h.submit(PROMPTS[1], 3)])
    assert [len(o) for o in outs] == [3, 3]


@pytest.mark.parametrize("policy,expected", [
    ("fcfs", ["long", "short", "mid"]),
    ("shortest-prompt-first", ["short", "mid", "long"]),
    ("priority", ["mid", "short", "long"]),
])
def test_scheduling_policy_orders_the_waiting_queue(policy: str, expected: list[str]) -> None:
    with Harness(batching="continuous", max_batch_size=1, scheduling_policy=policy) as h:
        blocker = h.submit(PROMPTS[0], 80)
        h.first_token(blocker)
        reqs = {"long": h.submit(list(range(80)), 2, priority=5),
                "short": h.submit(list(range(10)), 2, priority=1),
                "mid": h.submit(list(range(40)), 2, priority=0)}
        h.wait([blocker, *reqs.values()])
        finish = [rid for kind, rid in h.events if kind == "finish"]
    by_id = {r.id: name for name, r in reqs.items()}
    assert [by_id[i] for i in finish if i in by_id] == expected


def test_seeded_sampling_is_reproducible_whatever_the_batch() -> None:
    with Harness(batching="continuous", max_batch_size=8) as h:
        a = h.submit(PROMPTS[3], 20, temperature=0.9, seed=7)
        others = [h.submit(PROMPTS[i], 10, temperature=0.9, seed=i) for i in range(3)]
        b = h.submit(PROMPTS[3], 20, temperature=0.9, seed=7)
        c = h.submit(PROMPTS[3], 20, temperature=0.9, seed=8)
        ta, tb, tc = h.wait([a, b, c])
        h.wait(others)
    with Harness(batching="continuous", max_batch_size=1) as h:
        (alone,) = h.wait([h.submit(PROMPTS[3], 20, temperature=0.9, seed=7)])
    assert ta == tb == alone
    assert ta != tc


def test_eos_stops_a_request_unless_ignored(reference: list[list[int]]) -> None:
    ref = reference[2]
    eos = ref[3]
    stop_at = ref.index(eos)
    h = Harness(batching="continuous", max_batch_size=4)
    h.engine.mc = dataclasses.replace(h.engine.mc, eos_token_id=eos)
    with h:
        stops = h.submit(PROMPTS[2], MAX_TOKENS[2], ignore_eos=False)
        ignores = h.submit(PROMPTS[2], MAX_TOKENS[2], ignore_eos=True)
        out_stop, out_ignore = h.wait([stops, ignores])
    assert out_stop == ref[: stop_at + 1] and h.reasons[stops.id] == "stop"
    assert out_ignore == ref and h.reasons[ignores.id] == "length"


def test_abort_frees_the_slot() -> None:
    with Harness(batching="continuous", max_batch_size=4, kv_pool_mb=3) as h:  # one slot
        a = h.submit(PROMPTS[0], 400)
        h.first_token(a)
        h.engine.abort(a)
        (out,) = h.wait([h.submit(PROMPTS[1], 4)])
        assert len(out) == 4 and a.aborted and h.engine.pool.used == 0


class TokenLog(EngineStats):
    """The order in which the engine reports a request's tokens."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []

    def admitted(self, req: Request, queue_s: float) -> None:
        self.events.append(("admitted", len(req.prompt)))

    def generated(self, tokens: int) -> None:
        self.events.append(("generated", tokens))

    def finished(self, req: Request, reason: str, e2e_s: float) -> None:
        self.events.append(("finished", req.emitted))


def test_tokens_are_reported_as_made_and_the_prompt_at_its_admission() -> None:
    """As vLLM counts them (prompt tokens at the prefill, generation tokens per step), so a scrape between two
    steps of a long request already counts what it has made: the monitor's token throughput per window."""
    log = TokenLog()
    with Harness(stats=log, batching="continuous", max_batch_size=4) as h:
        h.wait([h.submit(PROMPTS[3], 20)])
    kinds = [k for k, _ in log.events]
    assert kinds[0] == "admitted" and log.events[0][1] == len(PROMPTS[3])
    done = kinds.index("finished")
    assert log.events[done][1] == 20
    assert sum(n for k, n in log.events[:done] if k == "generated") >= 19  # all but the last step's before its end
    assert sum(n for k, n in log.events if k == "generated") == 20
