"""A request whose client goes away is aborted, whatever its kind (issue 30): completions and chat, streamed and
not, several prompts per request. Real sockets are closed mid-request against a real engine process (tiny preset,
CPU); the engine's own counters and step log say what happened, so nothing here depends on the machine's speed:
the abandoned sequences are counted as aborted and none as finished, the running and waiting counts drop to 0, and
the next request runs alone (every engine step while it ran carried one sequence)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.engine_proc import WAIT_S, EngineProcess

pytestmark = pytest.mark.process

MAX_TOKENS = 420  # the tiny preset's context is 512: hundreds of decode steps, so nothing ends on its own first


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    eng = EngineProcess(tmp_path_factory.mktemp("engine"))
    try:
        yield eng
    finally:
        clean = eng.stop()
    assert clean, eng.log.read_text()[-3000:]


def _body(path: str, stream: bool, prompts: int) -> dict[str, Any]:
    body: dict[str, Any] = {"max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": stream}
    if path == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": "hello"}]
    else:
        body["prompt"] = ["hello"] * prompts if prompts > 1 else "hello"
    return body


def _wait(cond: Any, what: str) -> None:
    end = time.monotonic() + WAIT_S
    while not cond():
        assert time.monotonic() < end, what
        time.sleep(0.02)


def _abandon(engine: EngineProcess, path: str, stream: bool, prompts: int, clients: int) -> None:
    """`clients` requests of `prompts` sequences each, closed once the engine holds every sequence; then the
    engine must count them aborted (none finished) and go idle."""
    aborted0, done0 = engine.metric("tuner_engine_aborted_requests_total"), engine.metric("vllm:request_success_total")
    sockets = [engine.post(path, _body(path, stream, prompts)) for _ in range(clients)]
    seqs = clients * prompts
    _wait(lambda: engine.busy() >= seqs, "the engine never held the requests")
    if stream:  # a streamed request has started answering
        for s in sockets:
            assert s.recv(1), "no answer began"
    for s in sockets:
        s.close()
    _wait(lambda: engine.busy() == 0, "abandoned sequences kept running")
    assert engine.metric("tuner_engine_aborted_requests_total") - aborted0 == seqs
    assert engine.metric("vllm:request_success_total") == done0, "an abandoned sequence ran to its end"


@pytest.mark.parametrize(("path", "stream", "prompts"), [
    ("/v1/completions", False, 3),
    ("/v1/completions", True, 3),
    ("/v1/completions", False, 1),
    ("/v1/chat/completions", False, 1),
    ("/v1/chat/completions", True, 1),
])
def test_an_abandoned_request_is_aborted(engine: EngineProcess, path: str, stream: bool, prompts: int) -> None:
    _abandon(engine, path, stream, prompts, clients=2)
    assert engine.served_alone() is None


def test_many_abandoned_requests_queued_beyond_the_batch_are_all_dropped(engine: EngineProcess) -> None:
    # 6 clients x 4 sequences: 24 sequences for a batch of 8, so most of them wait when their clients go
    _abandon(engine, "/v1/completions", False, 4, clients=6)
    assert engine.served_alone() is None
