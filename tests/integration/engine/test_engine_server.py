"""The engine's HTTP server as a real subprocess: the OpenAI protocol (with the `openai` package as the
client), error bodies, metrics, start-up failures, and the tuner's load generator against it."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")

MODEL = "torch-engine-tiny"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _post(url: str, body: Any) -> tuple[int, dict[str, Any]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def start_server(tmp: Path, *args: str) -> tuple[subprocess.Popen[bytes], str, Path]:
    port = _free_port()
    log = tmp / f"server-{port}.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "tuner.engine.server", "--port", str(port),
                                 "--cpu-threads", "1", *args], stdout=f, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}", log


def wait_ready(proc: subprocess.Popen[bytes], base: str, timeout_s: float = 60) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        assert proc.poll() is None, "server exited"
        try:
            if _get(base + "/health")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError("server not ready")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc, base, _ = start_server(tmp_path_factory.mktemp("engine"), "--batching", "continuous",
                                 "--max-batch-size", "8", "--max-model-len", "256", "--kv-pool-mb", "16")
    try:
        wait_ready(proc, base)
        yield base
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture()
def client(server: str) -> Any:
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)


def test_models_and_health(server: str) -> None:
    status, body = _get(server + "/v1/models")
    assert status == 200 and json.loads(body)["data"][0]["id"] == MODEL
    assert _get(server + "/health")[0] == 200


def test_streaming_with_the_openai_client(client: Any) -> None:
    stream = client.completions.create(model=MODEL, prompt="Hello, engine", max_tokens=12, temperature=0,
                                       stream=True, stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True})
    chunks = list(stream)
    text_chunks = [c for c in chunks if c.choices]
    assert len(text_chunks) == 12 and all(c.choices[0].text for c in text_chunks)
    assert text_chunks[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in text_chunks[:-1])
    usage = chunks[-1].usage
    assert not chunks[-1].choices and usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (13, 12, 25)
    whole = client.completions.create(model=MODEL, prompt="Hello, engine", max_tokens=12, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert whole.choices[0].text == "".join(c.choices[0].text for c in text_chunks)  # greedy: same text
    assert whole.usage.completion_tokens == 12


def test_stream_ends_with_done(server: str) -> None:
    req = urllib.request.Request(server + "/v1/completions", data=json.dumps(
        {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 3, "stream": True, "temperature": 0,
         "ignore_eos": True}).encode())
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        events = [e for e in r.read().decode().split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]" and len(events) == 4  # 3 tokens, no usage unless asked


def test_seeded_sampling_through_the_api(client: Any) -> None:
    def sample(seed: int) -> str:
        r = client.completions.create(model=MODEL, prompt="abc", max_tokens=16, temperature=1.0, seed=seed,
                                      extra_body={"ignore_eos": True})
        return str(r.choices[0].text)

    assert sample(1) == sample(1)
    assert sample(1) != sample(2)


def test_token_id_prompts_and_token_ids_out(server: str) -> None:
    status, body = _post(server + "/v1/completions", {"model": MODEL, "prompt": [72, 105], "max_tokens": 4,
                                                       "temperature": 0, "ignore_eos": True,
                                                       "return_token_ids": True})
    assert status == 200
    choice = body["choices"][0]
    assert len(choice["token_ids"]) == 4 and choice["prompt_token_ids"] == [72, 105]
    status, text_body = _post(server + "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 4,
                                                            "temperature": 0, "ignore_eos": True,
                                                            "return_token_ids": True})
    assert text_body["choices"][0]["token_ids"] == choice["token_ids"]  # "Hi" is bytes [72, 105]


@pytest.mark.parametrize("body,status,param", [
    ({"model": MODEL, "prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    ({"model": "gpt-4", "prompt": "x"}, 404, "model"),
    ({"model": MODEL, "prompt": "x" * 250, "max_tokens": 16}, 400, "prompt"),  # 266 > max_model_len 256
    ({"model": MODEL, "prompt": [1, 99999]}, 400, "prompt"),
    ({"model": MODEL, "prompt": ""}, 400, "prompt"),
    ({"model": MODEL, "prompt": "x", "temperature": -0.5}, 400, "temperature"),
    ({"model": MODEL, "prompt": "x", "n": 2}, 400, "n"),
])
def test_bad_requests_get_4xx_with_an_openai_error_body(server: str, body: dict, status: int,
                                                         param: str) -> None:
    got, err = _post(server + "/v1/completions", body)
    assert got == status
    assert set(err["error"]) == {"message", "type", "param", "code"}
    assert err["error"]["param"] == param and err["error"]["code"] == status and err["error"]["message"]


def test_bad_json_and_the_openai_client_errors(server: str, client: Any) -> None:
    status, err = _post(server + "/v1/completions", b"{not json")
    assert status == 400 and "error" in err
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="x", max_tokens=-3)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x")


def test_metrics_use_vllm_names(server: str, client: Any) -> None:
    client.completions.create(model=MODEL, prompt="warm", max_tokens=3, extra_body={"ignore_eos": True})
    status, body = _get(server + "/metrics")
    text = body.decode()
    assert status == 200
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
                 "vllm:generation_tokens_total"):
        assert name + "{" in text, name
    for phase in ("load", "allocate", "capture", "compile", "warmup"):
        assert f'tuner_engine_startup_phase_seconds{{model_name="{MODEL}",phase="{phase}"}}' in text
    # parsed by prometheus_client's own parser: every series is vLLM's or ours (prefixed), none unprefixed,
    # and the series the tuner's scraper reads are there
    from prometheus_client.parser import text_string_to_metric_families

    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert all(n.startswith(("vllm:", "tuner_engine_")) for n in fams), sorted(fams)
    samples = {s.name: s.value for f in fams.values() for s in f.samples}
    assert samples["vllm:num_preemptions_total"] == 0  # KV slots are reserved at admission
    assert samples["vllm:prefix_cache_queries_total"] >= len("warm")
    assert samples["vllm:prefix_cache_hits_total"] == 0
    assert samples["vllm:request_queue_time_seconds_count"] >= 1
    assert samples["tuner_engine_ready"] == 1
    # the length histograms (vLLM's 1-2-5 buckets up to the context length, 256 here) tuner.observe reads
    assert samples["vllm:request_generation_tokens_sum"] >= 3 and samples["vllm:request_prompt_tokens_count"] >= 1
    les = {s.labels["le"] for s in fams["vllm:request_prompt_tokens"].samples if s.name.endswith("_bucket")}
    assert les == {"1.0", "2.0", "5.0", "10.0", "20.0", "50.0", "100.0", "200.0", "+Inf"}
    assert not any(n.endswith("_created") for n in samples)


def test_concurrent_clients_beyond_the_pool_all_complete(server: str) -> None:
    """16 MiB at max_model_len 256 holds 15 sequences; 24 concurrent requests wait, none fails."""

    async def main() -> list[int]:
        aclient = openai.AsyncOpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)
        rs = await asyncio.gather(*[aclient.completions.create(
            model=MODEL, prompt=[i % 200 + 1] * 20, max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
            for i in range(24)])
        return [r.usage.completion_tokens for r in rs]

    assert asyncio.run(main()) == [10] * 24


def test_loadgen_measures_the_engine(server: str) -> None:
    from tuner.measure.loadgen import measure_endpoint
    from tuner.spec import Arrival, LengthDist, WorkloadSpec

    w = WorkloadSpec(arrival=Arrival(kind="closed", concurrency=4), prompt_tokens=LengthDist(dist="fixed", value=24),
                     output_tokens=LengthDist(dist="fixed", value=8), num_requests=12, ignore_eos=True)
    m = measure_endpoint(server, model=MODEL, workload=w, goodput_ms={}, seed=0, tokenizer="byte",
                         metrics_url=server + "/metrics")
    assert m.summary["completed"] == 12 and m.summary["failed"] == 0
    assert m.summary["total_input_tokens"] == 12 * 24 and m.summary["total_output_tokens"] == 12 * 8
    assert all(len(r.token_times_s) == 8 for r in m.records if not r.warmup)


def test_gpu_knob_on_cpu_exits_with_a_clear_error(tmp_path: Path) -> None:
    proc, _, log = start_server(tmp_path, "--device", "cpu", "--cuda-graphs", "--pre-allocate")
    assert proc.wait(60) == 2
    assert "argument --cuda-graphs" in log.read_text() and "needs a CUDA GPU" in log.read_text()


def test_missing_weights_exit_non_zero(tmp_path: Path) -> None:
    proc, _, log = start_server(tmp_path, "--weights", str(tmp_path / "nowhere"))
    assert proc.wait(60) != 0
    assert "nowhere" in log.read_text()


def test_health_is_503_until_the_engine_is_ready() -> None:
    from tuner.engine.config import EngineConfig
    from tuner.engine.server import EngineServer

    srv = EngineServer(EngineConfig(cpu_threads=1))  # the engine thread is not started
    resp = asyncio.run(srv.health(None))  # type: ignore[arg-type]
    assert resp.status == 503
    srv.engine.ready.set()
    assert asyncio.run(srv.health(None)).status == 200  # type: ignore[arg-type]
    srv.engine.fatal = RuntimeError("boom")
    assert asyncio.run(srv.health(None)).status == 503  # type: ignore[arg-type]


def test_client_disconnect_mid_stream_frees_the_request(server: str) -> None:
    """A client that goes away mid-stream is aborted: nothing stays running, the server keeps serving."""
    body = json.dumps({"model": MODEL, "prompt": "bye", "max_tokens": 200, "stream": True, "temperature": 0,
                       "ignore_eos": True}).encode()
    host, port = server.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        got = b""
        while b"data: " not in got:
            chunk = s.recv(4096)
            assert chunk, "connection closed before the first token"
            got += chunk
    end = time.monotonic() + 30
    while True:
        text = _get(server + "/metrics")[1].decode()
        running = [ln for ln in text.splitlines() if ln.startswith("vllm:num_requests_running{")]
        if running and float(running[0].split()[-1]) == 0.0:
            break
        assert time.monotonic() < end, running
        time.sleep(0.1)
    status, out = _post(server + "/v1/completions", {"model": MODEL, "prompt": "still here", "max_tokens": 2})
    assert status == 200 and out["usage"]["completion_tokens"] == 2


def test_chat_completions_with_the_openai_client(client: Any) -> None:
    from tuner.engine.chat import ChatTemplate
    from tuner.engine.checkpoint import CHAT_TEMPLATE

    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Hello, engine"}]
    prompt = ChatTemplate(CHAT_TEMPLATE, "preset").render(msgs)
    assert prompt == "<|system|>be brief\n<|user|>Hello, engine\n<|assistant|>"  # the preset's template
    stream = client.chat.completions.create(model=MODEL, messages=msgs, max_completion_tokens=6, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(text) == 6 and text[-1].choices[0].finish_reason == "length"
    usage = chunks[-1].usage
    assert not chunks[-1].choices and usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (len(prompt.encode()), 6)  # byte-level prompt
    whole = client.chat.completions.create(model=MODEL, messages=msgs, max_completion_tokens=6, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert whole.choices[0].message.role == "assistant" and whole.choices[0].finish_reason == "length"
    assert whole.choices[0].message.content == "".join(c.choices[0].delta.content for c in text)  # greedy
    assert whole.usage.completion_tokens == 6
    # the same answer as a completion of the rendered prompt
    same = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert same.choices[0].text == whole.choices[0].message.content


@pytest.mark.parametrize("body, fragment", [
    ({"model": MODEL}, "messages must be a non-empty list"),
    ({"model": MODEL, "messages": [{"content": "x"}]}, "string role"),
    ({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "only text parts"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}, "max_tokens"),
])
def test_bad_chat_requests_get_400_with_a_json_body(server: str, body: dict, fragment: str) -> None:
    status, err = _post(server + "/v1/chat/completions", body)
    assert status == 400 and fragment in err["error"]["message"], err


def test_chat_template_from_a_checkpoint(tmp_path: Path) -> None:
    from tuner.engine.chat import ChatTemplate

    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages[0]['content'] }}!"}))
    t = ChatTemplate.for_weights(str(tmp_path))
    assert t.origin == "checkpoint" and t.render([{"role": "user", "content": "hi"}]) == "hi!"
    (tmp_path / "chat_template.jinja").write_text("[{{ messages | length }}]")
    assert ChatTemplate.for_weights(str(tmp_path)).render([{"role": "user", "content": "a"}]) == "[1]"
    assert ChatTemplate.for_weights(None).origin == "preset"


def test_tuner_bench_chat_against_the_engine(server: str, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tuner.cli.main import app

    out = tmp_path / "chat.json"
    r = CliRunner().invoke(app, ["bench", "--url", server, "--endpoint", "chat", "--concurrency", "2",
                                 "--requests", "4", "--prompt-tokens", "16", "--output-tokens", "4",
                                 "--tokenizer", "byte", "--json", str(out)])
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    assert res["completed"] == 4 and res["output_lens"] == [4] * 4 and res["backend"] == "openai-chat"
    assert all(n > 16 for n in res["input_lens"])  # the template's tokens are the server's count


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_tuner_bench_fits_prompts_to_the_engines_count_by_default(server: str, tmp_path: Path,
                                                                  endpoint: str) -> None:
    from typer.testing import CliRunner

    from tuner.cli.main import app

    out = tmp_path / "fit.json"
    r = CliRunner().invoke(app, ["bench", "--url", server, "--endpoint", endpoint, "--concurrency", "2",
                                 "--requests", "4", "--prompt-tokens", "40", "--output-tokens", "2",
                                 "--json", str(out)])
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    lengths = res["tuner"]["prompt_lengths"]
    # no /tokenize here: fitted to the usage of probe requests; for chat the count includes the template
    assert lengths["method"] == "usage_calibration" and lengths["fit_max_error_tokens"] == 0, lengths
    assert res["input_lens"] == [40] * 4 and lengths["within_2pct_frac"] == 1.0
