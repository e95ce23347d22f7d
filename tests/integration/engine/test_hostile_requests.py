"""The engine's server against hostile requests, as a real subprocess: the requests that used to kill it
(a seed past 2**64, a temperature of 1e-320), JSON errors for every status, body size and nesting limits,
then a fuzz run (hypothesis over the request schema and over raw bytes) after which /health is 200 and a
normal completion works."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tuner.engine.schema import MAX_BODY_BYTES, MAX_JSON_DEPTH  # noqa: E402

MODEL = "torch-engine-tiny"
MAX_LEN = 64


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engine") / "server.log"


@pytest.fixture(scope="module")
def base(server_log: Path) -> Iterator[str]:
    port = _free_port()
    log = server_log
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "tuner.engine.server", "--port", str(port), "--cpu-threads",
                                 "1", "--max-model-len", str(MAX_LEN), "--max-batch-size", "4", "--kv-pool-mb", "8"],
                                stdout=f, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 90
        while time.monotonic() < end:
            assert proc.poll() is None, log.read_text()[-2000:]
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        else:
            raise AssertionError("server not ready: " + log.read_text()[-2000:])
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)  # a server with a stuck request used to take 62 s to stop
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError("the server took over 15 s to stop after SIGTERM") from None


@pytest.fixture(scope="module")
def client(base: str) -> Iterator[Any]:
    with httpx.Client(base_url=base, timeout=30) as c:
        yield c


def _alive(client: Any) -> None:
    assert client.get("/health").status_code == 200
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "Hello", "max_tokens": 3,
                                             "temperature": 0.8, "seed": 7})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] in ("length", "stop")


def _json_error(r: Any, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json"), r.headers
    err = r.json()["error"]
    assert err["code"] == status and err["message"]
    return err


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": "hi", "seed": 18446744073709551616}, "seed"),
    ({"prompt": "hi", "seed": -(2**63) - 1}, "seed"),
    ({"prompt": "hi", "max_tokens": 10**30}, "max_tokens"),
    ({"prompt": "hi", "temperature": -1e-320}, "temperature"),
    ({"prompt": "hi", "top_p": 1.5}, "top_p"),
    ({"prompt": "hi", "n": 2}, "n"),
    ({"prompt": "hi", "stop": ["\n"]}, "stop"),
    ({"prompt": "hi", "stop": 5}, "stop"),
    ({"prompt": "hi", "logprobs": 3}, "logprobs"),
    ({"prompt": "hi", "stream": "yes"}, "stream"),
    ({"prompt": "hi", "priority": 2**70}, "priority"),
    ({"prompt": [[1, 2], "x", 3]}, "prompt"),
    ({"prompt": [2**70]}, "prompt"),
    ({"prompt": ["x"] * 1000}, "prompt"),
])
def test_sampling_parameters_are_checked_at_the_edge(client: Any, body: dict[str, Any], param: str) -> None:
    err = _json_error(client.post("/v1/completions", json=body), 400)
    assert err["param"] == param
    _alive(client)


def test_a_subnormal_temperature_is_greedy_not_a_dead_engine(client: Any) -> None:
    greedy = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 4, "temperature": 0,
                                                  "ignore_eos": True}).json()
    tiny = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 4, "temperature": 1e-320,
                                                "ignore_eos": True})
    assert tiny.status_code == 200, tiny.text
    assert tiny.json()["choices"][0]["text"] == greedy["choices"][0]["text"]
    _alive(client)


@pytest.mark.parametrize("raw", [b"NaN", b'{"prompt": "x", "temperature": NaN}', b'{"prompt": "x", "seed": Infinity}',
                                 b"\xff\xfe", b"{", b""])
def test_bodies_that_are_not_strict_json_get_400(client: Any, raw: bytes) -> None:
    _json_error(client.post("/v1/completions", content=raw), 400)


def test_nesting_and_size_limits(client: Any) -> None:
    deep = b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1)
    assert "nested" in _json_error(client.post("/v1/completions", content=deep), 400)["message"]
    very_deep = b'{"prompt":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    _json_error(client.post("/v1/completions", content=very_deep), 400)
    _json_error(client.post("/v1/completions", content=b" " * (MAX_BODY_BYTES + 1)), 413)
    _alive(client)


def test_every_status_has_a_json_body(client: Any) -> None:
    _json_error(client.get("/nowhere"), 404)
    err = client.get("/v1/completions")
    _json_error(err, 405)
    assert "POST" in err.headers.get("allow", "")
    _json_error(client.post("/v1/completions", json={"prompt": "x", "model": "other"}), 404)


def _post_raw(client: Any, path: str, body: Any) -> Any:
    """JSON with \\u escapes (json.dumps' ASCII form), so a lone surrogate reaches the server as JSON sends it."""
    return client.post(path, content=json.dumps(body).encode(), headers={"Content-Type": "application/json"})


_CHAT = "/v1/chat/completions"


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", {"prompt": "a\ud800b"}, "prompt"),
    ("/v1/completions", {"prompt": ["ok", "\udfff"]}, "prompt"),
    ("/v1/completions", {"prompt": "hi", "stop": "\udbff"}, "stop"),
    ("/v1/completions", {"prompt": "hi", "model": "m\ud800"}, "model"),
    ("/v1/completions", {"prompt": "hi", "user": {"name": "\ud834"}}, "user"),
    ("/v1/completions", {"prompt": "hi", "x\ud800": 1}, None),
    (_CHAT, {"messages": [{"role": "user", "content": "\ud800"}]}, "messages"),
    (_CHAT, {"messages": [{"role": "user\udc00", "content": "hi"}]}, "messages"),
    (_CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud83d"}]}]}, "messages"),
])
def test_invalid_unicode_anywhere_is_a_400(client: Any, server_log: Path, path: str, body: dict[str, Any],
                                           param: str | None) -> None:
    err = _json_error(_post_raw(client, path, body), 400)
    assert "not valid Unicode" in err["message"] and err["param"] == param
    _alive(client)
    assert "Traceback" not in server_log.read_text()


def test_a_valid_surrogate_pair_is_text(client: Any) -> None:
    r = _post_raw(client, "/v1/completions", {"prompt": "\ud83d\ude00", "max_tokens": 2})
    assert r.status_code == 200, r.text


# ---------------------------------------------------------------------------- fuzzing
# text with lone surrogates too (JSON's \\ud800 escapes), sent as json.dumps writes it (see _post_raw)
_text = st.one_of(st.text(max_size=20), st.text(st.characters(codec=None, categories=["Cs", "L", "N", "P", "Zs"]),
                                                min_size=1, max_size=12))
_scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                     st.floats(allow_nan=False, allow_infinity=False), _text)
_json = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                     max_leaves=12)
_small_floats = st.one_of(st.floats(min_value=-2, max_value=3, allow_nan=False), st.just(1e-320), st.just(5e-324),
                          st.just(1e308), st.integers(-3, 3))
_prompt = st.one_of(st.text(max_size=40), _text, st.lists(st.integers(-5, 300), max_size=20),
                    st.lists(st.one_of(_text, st.lists(st.integers(0, 255), max_size=5)), max_size=3),
                    _json)
_requests = st.fixed_dictionaries({}, optional={
    "model": st.one_of(st.just(MODEL), _json), "prompt": _prompt,
    "max_tokens": st.one_of(st.integers(-2, 8), st.integers(MAX_LEN - 4, 2**66), _json),
    "temperature": st.one_of(_small_floats, _json), "top_p": st.one_of(_small_floats, _json),
    "seed": st.one_of(st.integers(-(2**66), 2**66), st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63)]),
                      _json),
    "n": st.one_of(st.integers(-1, 3), _json), "stop": _json, "logprobs": _json, "echo": _json,
    "stream": st.one_of(st.booleans(), _json), "stream_options": _json, "ignore_eos": st.one_of(st.booleans(), _json),
    "priority": st.one_of(st.integers(-(2**40), 2**40), _json), "return_token_ids": _json,
    "extra": _json})
_message = st.fixed_dictionaries({}, optional={
    "role": st.one_of(st.sampled_from(["user", "system", "assistant", "tool"]), _text, _json),
    "content": st.one_of(_text, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": _text}),
                                         max_size=2), _json),
    "name": _text})
_chat_requests = st.fixed_dictionaries({}, optional={
    "model": st.one_of(st.just(MODEL), _json), "messages": st.one_of(st.lists(_message, max_size=3), _json),
    "max_tokens": st.one_of(st.integers(-2, 8), _json), "stream": st.one_of(st.booleans(), _json),
    "stop": _json, "extra": _json})

_FUZZ = settings(max_examples=250, deadline=None, derandomize=True, database=None,
                 suppress_health_check=list(HealthCheck))


def _no_harm(r: Any) -> None:
    assert r.status_code in (200, 400, 404, 413), r.text
    assert r.headers["content-type"].startswith(("application/json", "text/event-stream")), r.headers
    if r.status_code != 200:
        json.loads(r.content)


@_FUZZ
@given(body=_requests)
def test_fuzzed_requests_never_hurt_the_engine(client: Any, body: dict[str, Any]) -> None:
    _no_harm(_post_raw(client, "/v1/completions", body))


@settings(_FUZZ, max_examples=120)
@given(body=_chat_requests)
def test_fuzzed_chat_requests_never_hurt_the_engine(client: Any, body: dict[str, Any]) -> None:
    _no_harm(_post_raw(client, _CHAT, body))


@settings(_FUZZ, max_examples=120)
@given(raw=st.one_of(st.binary(max_size=200), _json.map(lambda v: json.dumps(v).encode()),
                     _requests.map(lambda v: json.dumps(v).encode()[: len(json.dumps(v)) // 2])))
def test_fuzzed_raw_bodies_never_hurt_the_engine(client: Any, raw: bytes) -> None:
    _no_harm(client.post("/v1/completions", content=raw))


def test_after_the_fuzzing_the_engine_still_serves(client: Any, server_log: Path) -> None:
    _alive(client)
    assert "Traceback" not in server_log.read_text(), server_log.read_text()[-3000:]
