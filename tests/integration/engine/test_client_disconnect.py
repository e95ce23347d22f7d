"""A request whose client goes away is aborted, whatever its kind (issue 30): completions and chat, streamed and
not, several prompts per request. Real sockets are closed mid-request against a real engine process (tiny preset,
CPU); the engine's own counters and step log say what happened, so nothing here depends on the machine's speed:
the abandoned sequences are counted as aborted and none as finished, the running and waiting counts drop to 0, and
the next request runs alone (every engine step while it ran carried one sequence)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.process

WAIT_S = 120.0  # generous: a bound for what takes well under a second on a quiet machine
MAX_TOKENS = 420  # the tiny preset's context is 512: hundreds of decode steps, so nothing ends on its own first


@dataclass
class Engine:
    url: str
    port: int
    steps: Path
    log: Path

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(self.url + "/metrics", timeout=WAIT_S) as r:
            text = r.read().decode()
        return sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith(name + "{") or line.startswith(name + " "))

    def busy(self) -> float:
        return self.metric("vllm:num_requests_running") + self.metric("vllm:num_requests_waiting")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    d = tmp_path_factory.mktemp("engine")
    port = _free_port()
    eng = Engine(f"http://127.0.0.1:{port}", port, d / "steps.jsonl", d / "server.log")
    with open(eng.log, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "tuner.engine.server", "--port", str(port), "--cpu-threads",
                                 "1", "--max-batch-size", "8", "--step-log", str(eng.steps)],
                                stdout=f, stderr=subprocess.STDOUT)
    try:
        end = time.monotonic() + WAIT_S
        while True:
            assert proc.poll() is None, eng.log.read_text()[-2000:]
            assert time.monotonic() < end, "engine not ready: " + eng.log.read_text()[-2000:]
            try:
                with urllib.request.urlopen(eng.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        yield eng
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert "Traceback" not in eng.log.read_text(), eng.log.read_text()[-3000:]


def _body(path: str, stream: bool, prompts: int) -> dict[str, Any]:
    body: dict[str, Any] = {"max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": stream}
    if path == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": "hello"}]
    else:
        body["prompt"] = ["hello"] * prompts if prompts > 1 else "hello"
    return body


def _send(engine: Engine, path: str, body: dict[str, Any]) -> socket.socket:
    raw = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", engine.port), timeout=WAIT_S)
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: engine\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw)
    return s


def _wait(cond: Any, what: str) -> None:
    end = time.monotonic() + WAIT_S
    while not cond():
        assert time.monotonic() < end, what
        time.sleep(0.02)


def _abandon(engine: Engine, path: str, stream: bool, prompts: int, clients: int) -> None:
    """`clients` requests of `prompts` sequences each, closed once the engine holds every sequence; then the
    engine must count them aborted (none finished) and go idle."""
    aborted0, done0 = engine.metric("tuner_engine_aborted_requests_total"), engine.metric("vllm:request_success_total")
    sockets = [_send(engine, path, _body(path, stream, prompts)) for _ in range(clients)]
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


def _served_alone(engine: Engine) -> None:
    """The next request is served at once and alone: every step while it ran carried only it."""
    assert engine.busy() == 0
    before = engine.steps.read_text().count("\n") if engine.steps.exists() else 0
    req = urllib.request.Request(engine.url + "/v1/completions", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"prompt": "next", "max_tokens": 8, "ignore_eos": True}).encode())
    with urllib.request.urlopen(req, timeout=WAIT_S) as r:
        choice = json.loads(r.read())["choices"][0]
    assert choice["finish_reason"] == "length"
    steps = [json.loads(line) for line in engine.steps.read_text().splitlines()[before:]]
    assert steps, "the step log shows no step for the request"
    assert max(s["running"] + s["waiting"] for s in steps) <= 1, "the request shared the engine with others"
    assert len(steps) <= 8 + 3, f"{len(steps)} engine steps for 8 tokens"


@pytest.mark.parametrize(("path", "stream", "prompts"), [
    ("/v1/completions", False, 3),
    ("/v1/completions", True, 3),
    ("/v1/completions", False, 1),
    ("/v1/chat/completions", False, 1),
    ("/v1/chat/completions", True, 1),
])
def test_an_abandoned_request_is_aborted(engine: Engine, path: str, stream: bool, prompts: int) -> None:
    _abandon(engine, path, stream, prompts, clients=2)
    _served_alone(engine)


def test_many_abandoned_requests_queued_beyond_the_batch_are_all_dropped(engine: Engine) -> None:
    # 6 clients x 4 sequences: 24 sequences for a batch of 8, so most of them wait when their clients go
    _abandon(engine, "/v1/completions", False, 4, clients=6)
    _served_alone(engine)
