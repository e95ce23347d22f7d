"""`tuner bench` and the command target against OpenAI-compatible servers nobody here wrote, installed from the
package registry (`make interop-venvs`) and run locally on the CPU: guidellm's mock server, and Hugging Face's
`transformers serve` with a tiny local model. Both endpoints, stream on and off, and each request variant."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.support.thirdparty import (
    Server,
    free_port,
    guidellm_mock_argv,
    hfserve_argv,
    hfserve_env,
    running,
)
from tests.support.tiny_model import make_tiny_model
from tuner.cli.main import app

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    d = tmp_path_factory.mktemp("guidellm")
    port = free_port()
    with running(guidellm_mock_argv(port, ttft_ms=20, itl_ms=4), port=port, model="mock",
                 log=d / "mock.log") as srv:
        yield srv


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory, tiny: Path) -> Iterator[Server]:
    d = tmp_path_factory.mktemp("hfserve")
    port = free_port()
    with running(hfserve_argv(port, tiny), port=port, model=str(tiny), log=d / "serve.log",
                 env=hfserve_env(d / "hub")) as srv:
        yield srv


def bench(srv: Server, tmp_path: Path, *args: str, requests: int = 4) -> tuple[int, str, dict]:
    out = tmp_path / "res.json"
    out.unlink(missing_ok=True)
    r = CliRunner().invoke(app, ["bench", "--url", srv.url, "--model", srv.model, "--concurrency", "2",
                                 "--requests", str(requests), "--prompt-tokens", "24", "--output-tokens", "6",
                                 "--json", str(out), *args])
    res = json.loads(out.read_text()) if out.is_file() else {}
    return r.exit_code, r.output, res


def check_ok(code: int, output: str, res: dict, *, stream: bool, n: int = 4, exact_out: bool = True) -> None:
    assert code == 0, output
    assert res["completed"] == n and res["failed"] == 0, output
    if exact_out:
        assert res["output_lens"] == [6] * n
    else:  # without ignore_eos a model may stop early (a random model picks its end token now and then)
        assert all(1 <= x <= 6 for x in res["output_lens"])
    assert all(e == "" for e in res["errors"]) and all(t for t in res["generated_texts"])
    if stream:
        assert all(t is not None and t > 0 for t in res["ttfts"]) and res["median_tpot_ms"] is not None
        assert all(e in ("done", "eof_after_finish") for e in res["tuner"]["stream_ends"])
    else:
        assert res["ttfts"] == [None] * n and res["mean_ttft_ms"] is None and "not measured" in output
        assert res["mean_e2el_ms"] > 0


# ------------------------------------------------------------------ guidellm's mock server
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
@pytest.mark.parametrize("stream", [True, False])
def test_guidellm_mock_server_default_options(mock: Server, tmp_path: Path, endpoint: str, stream: bool) -> None:
    code, output, res = bench(mock, tmp_path, "--endpoint", endpoint, "--stream" if stream else "--no-stream")
    check_ok(code, output, res, stream=stream)
    if stream:  # the mock waits 20 ms for the first token and 4 ms between tokens
        assert res["median_ttft_ms"] >= 15 and res["tuner"]["stream_ends"] == ["done"] * 4
    # prompts fitted to the mock's own count (from usage) before the run
    assert res["tuner"]["prompt_lengths"]["method"] == "usage_calibration" and res["input_lens"] == [24] * 4


def test_guidellm_mock_server_variants_and_refusals(mock: Server, tmp_path: Path) -> None:
    code, output, res = bench(mock, tmp_path, "--no-ignore-eos", "--extra-body", '{"temperature": 0}')
    check_ok(code, output, res, stream=True, exact_out=False)
    # it takes text prompts only: token ids are refused, and the console shows the server's own words
    code, output, res = bench(mock, tmp_path, "--prompt-format", "token_ids", "--tokenizer", "byte")
    assert code == 1 and res["failed"] == 4
    assert "errors: http_4xx 4 (first: " in output and "valid string" in output


# ------------------------------------------------------------------ transformers serve (tiny model, CPU)
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
@pytest.mark.parametrize("stream", [True, False])
def test_transformers_serve_endpoints(hf: Server, tiny: Path, tmp_path: Path, endpoint: str, stream: bool) -> None:
    code, output, res = bench(hf, tmp_path, "--endpoint", endpoint, "--stream" if stream else "--no-stream",
                              "--no-ignore-eos", "--tokenizer", str(tiny))
    check_ok(code, output, res, stream=stream, exact_out=False)
    if endpoint == "completions":  # text prompts built to be exactly 24 tokens under the model's tokenizer
        assert res["input_lens"] == [24] * 4
    if stream:  # this server ends its streams without [DONE]: still complete
        assert res["tuner"]["stream_ends"] == ["eof_after_finish"] * 4
        assert sum(res["output_lens"]) == sum(len(x) + 1 for x in res["itls"])


def test_transformers_serve_default_options_and_refusals_on_screen(hf: Server, tiny: Path, tmp_path: Path) -> None:
    # default options: it refuses ignore_eos; sent again without it, and said so
    code, output, res = bench(hf, tmp_path, "--tokenizer", str(tiny))
    check_ok(code, output, res, stream=True, exact_out=False)
    assert "refused ignore_eos" in output and any("refused ignore_eos" in n for n in res["tuner"]["notes"])
    code, output, res = bench(hf, tmp_path, "--ignore-eos")  # insisted on: every request fails, on screen
    assert code == 1 and res["failed"] == 4
    assert "errors: http_4xx 4" in output and "ignore_eos" in output and "--no-ignore-eos" in output
    assert res["tuner"]["error_details"]["http_4xx"]["count"] == 4
    code, output, res = bench(hf, tmp_path, "--no-ignore-eos", "--prompt-format", "token_ids", "--tokenizer",
                              "byte")
    assert code == 1 and "prompt must be a string" in output


def test_default_prompts_are_the_asked_length_as_the_server_counts(hf: Server, tmp_path: Path) -> None:
    # no tokenizer: fitted before the run to the usage this server reports (it has no /tokenize)
    code, output, res = bench(hf, tmp_path, "--no-ignore-eos", "--prompt-tokens", "64", requests=3)
    assert code == 0, output
    lengths = res["tuner"]["prompt_lengths"]
    assert lengths["method"] == "usage_calibration" and lengths["probes"] >= 1, lengths
    assert all(abs(n - 64) <= 0.02 * 64 for n in res["input_lens"]), res["input_lens"]
    assert lengths["within_2pct_frac"] == 1.0 and "prompt lengths: usage_calibration" in output
    # --tokenizer approx: not fitted; a count far off the asked one is a warning
    code, output, res = bench(hf, tmp_path, "--no-ignore-eos", "--tokenizer", "approx", requests=2)
    assert code == 0, output
    assert res["tuner"]["prompt_lengths"]["method"] == "approximate"
    asked, counted = 24, res["input_lens"][0]
    if abs(counted - asked) / asked > 0.10:
        assert "prompt length mismatch" in output and any("mismatch" in n for n in res["tuner"]["notes"])
    else:
        assert "prompt length mismatch" not in output


# ------------------------------------------------------------------ command-target tuning runs
AGENT = """\
name: {name}
target:
  kind: command
  command: {command}
  model: {model}
  startup_timeout_s: 240
  flags: {flags}
  env: {env}
search_space:
  params: {params}
workload:
  arrival: {{kind: closed, concurrency: 2}}
  num_requests: 4
  prompt_tokens: {{dist: fixed, value: 16}}
  output_tokens: {{dist: fixed, value: 4}}
  ignore_eos: {ignore_eos}
objectives: [{{metric: output_throughput, direction: maximize}}]
slos: [{{metric: error_rate, max: 0.0}}]
budget: {{trials: 2}}
tracking: {{enabled: false}}
"""


def tune(tmp_path: Path, **fields: str) -> tuple[str, dict]:
    """Validate (with the baseline's command shown), run two trials, and return what status says."""
    agent = tmp_path / "agent.yaml"
    agent.write_text(AGENT.format(**fields))
    sd = tmp_path / "state"
    r = CliRunner().invoke(app, ["validate", str(agent), "--show-command"])
    assert r.exit_code == 0, r.output
    shown = r.output
    r = CliRunner().invoke(app, ["run", str(agent), "--state-dir", str(sd)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["status", str(agent), "--state-dir", str(sd), "--json"])
    assert r.exit_code == 0, r.output
    status = json.loads(r.output)
    c = status["trials"]  # a configuration proposed again is a repeat (REPEATS), no budget trial
    assert c["COMPLETE"] - c["REPEATS"] == 2 and c["FEASIBLE"] == 2, status
    base = status["baseline"]
    assert base["cause"] is None and base["metrics"]["completed"] == 4, status
    return shown, status


def test_command_target_tunes_guidellms_mock_server(tmp_path: Path) -> None:
    exe = guidellm_mock_argv(0)[0]
    shown, _ = tune(
        tmp_path, name="gl-mock", model="mock", ignore_eos="true",
        command=json.dumps([exe, "mock-server", "--host", "127.0.0.1", "--port", "{port}", "--model", "mock"]),
        flags=json.dumps({"itl_ms": "--itl-ms", "ttft_ms": {"flag": "--ttft-ms", "style": "equals"}}),
        env="{}",
        params=json.dumps({"itl_ms": {"type": "float", "low": 1.0, "high": 10.0, "default": 10.0},
                           "ttft_ms": {"type": "float", "low": 1.0, "high": 20.0, "default": 20.0}}))
    assert "--itl-ms" not in shown and "--ttft-ms" not in shown  # the baseline: the server's own defaults


def test_command_target_tunes_transformers_serve(tmp_path: Path, tiny: Path) -> None:
    exe = hfserve_argv(0, tiny)[0]
    env = hfserve_env(tmp_path / "hub")
    shown, _ = tune(
        tmp_path, name="hf-serve", model=str(tiny), ignore_eos="false",
        command=json.dumps([exe, "serve", str(tiny), "--host", "127.0.0.1", "--port", "{port}", "--device", "cpu"]),
        flags=json.dumps({"seed": "--default-seed"}), env=json.dumps(env),
        params=json.dumps({"seed": {"type": "int", "low": 1, "high": 9, "default": 1}}))
    assert "--default-seed" not in shown
