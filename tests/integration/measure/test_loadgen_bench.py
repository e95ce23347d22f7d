"""`tuner bench` through Typer's CliRunner against the fake server."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from tests.support.fake_openai_server import start_fake_server
from tuner.cli.bench import parse_goodput, register
from tuner.errors import ConfigError


def make_app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """test app"""

    register(app)
    return app


# The keys `vllm bench serve --save-result --save-detailed` writes for a generation run (vllm/benchmarks/serve.py:
# the run metadata, benchmark()'s result dict, the statistics of the default percentile metrics), and those it
# adds with --max-concurrency (client queue time; with a finite rate, latency including it).
VLLM_KEYS = {
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts", "request_rate",
    "burstiness", "max_concurrency", "duration", "completed", "failed", "total_input_tokens",
    "total_output_tokens", "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
    "input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "queue_times", "generated_texts",
    "errors", "max_output_tokens_per_s", "max_concurrent_requests", "rtfx",
    *(f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "std", "p99")),
}
VLLM_QUEUE_KEYS = {f"{s}_{m}_ms" for m in ("client_queue_time", "e2el_including_client_queue")
                   for s in ("mean", "median", "std", "p99")}
VLLM_PER_REQUEST = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "queue_times",
                    "generated_texts", "errors")


def test_bench_json_has_vllms_keys_and_shapes(tmp_path: Path) -> None:
    out = tmp_path / "res.json"
    with start_fake_server(ttft_ms=2, itl_ms=1, error_status=500, error_every=3) as srv:
        r = CliRunner().invoke(make_app(), [
            "bench", "--url", srv.url, "--rate", "100", "--concurrency", "4", "--requests", "9",
            "--prompt-tokens", "16", "--output-tokens", "3", "--tokenizer", "byte", "--json", str(out)])
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    missing = (VLLM_KEYS | VLLM_QUEUE_KEYS) - set(res)
    assert not missing, f"vLLM keys missing: {sorted(missing)}"
    assert "tuner" in res and not (set(res) - VLLM_KEYS - VLLM_QUEUE_KEYS - {"tuner"}
                                   - {f"p{p}_{m}_ms" for p in (50, 90, 95) for m in (
                                       "ttft", "tpot", "itl", "e2el", "client_queue_time",
                                       "e2el_including_client_queue")})
    for key in VLLM_PER_REQUEST:  # parallel to the requests, failed ones included
        assert len(res[key]) == 9, key
    failed = [i for i, e in enumerate(res["errors"]) if e]
    assert len(failed) == 3 and res["failed"] == 3
    for i in failed:  # a failed request's figures are not measured: null, never 0
        assert res["ttfts"][i] is None and res["latencies"][i] is None and res["output_lens"][i] == 0
        assert res["errors"][i].startswith("http_5xx")
    ok = [i for i in range(9) if i not in failed]
    assert all(res["ttfts"][i] > 0 and len(res["itls"][i]) == 2 and res["generated_texts"][i] for i in ok)
    assert res["tuner"]["error_details"]["http_5xx"]["count"] == 3
    assert "tpot" in res["tuner"]["definitions"] and res["tuner"]["request"]["stream"] is True
    # start_times + clock_origin_s: time.perf_counter() values, the clock of vLLM's own start_times
    assert 0 < res["tuner"]["clock_origin_s"] + res["start_times"][0] < time.perf_counter()


def test_bench_without_streaming_does_not_report_ttft(tmp_path: Path) -> None:
    out = tmp_path / "res.json"
    with start_fake_server(ttft_ms=2, itl_ms=1) as srv:
        r = CliRunner().invoke(make_app(), [
            "bench", "--url", srv.url, "--concurrency", "2", "--requests", "4", "--prompt-tokens", "8",
            "--output-tokens", "3", "--no-stream", "--no-ignore-eos", "--extra-body", '{"temperature": 0}',
            "--json", str(out)])
        assert r.exit_code == 0, r.output
        assert "not measured (stream off)" in r.output
        res = json.loads(out.read_text())
        assert res["completed"] == 4 and res["ttfts"] == [None] * 4 and res["mean_ttft_ms"] is None
        assert res["median_tpot_ms"] is None and res["p99_itl_ms"] is None and res["mean_e2el_ms"] > 0
        assert res["total_output_tokens"] == 12 and res["tuner"]["not_measured"] == ["ttft", "tpot", "itl"]
        body = srv.state.last_body
        assert body["stream"] is False and "ignore_eos" not in body and body["temperature"] == 0
        r = CliRunner().invoke(make_app(), ["bench", "--url", srv.url, "--requests", "2", "--no-stream",
                                            "--goodput", "ttft:100"])
        assert r.exit_code == 2 and "not measured without streaming" in r.output


def test_bench_prints_a_summary_and_writes_vllm_json(tmp_path: Path) -> None:
    out = tmp_path / "res.json"
    with start_fake_server(ttft_ms=5, itl_ms=2) as srv:
        r = CliRunner().invoke(make_app(), [
            "bench", "--url", srv.url, "--concurrency", "2", "--requests", "10", "--prompt-tokens", "32",
            "--output-tokens", "4", "--tokenizer", "byte", "--goodput", "ttft:500", "--goodput", "tpot:100",
            "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "Successful requests" in r.output and "TTFT" in r.output
    res = json.loads(out.read_text())
    assert res["model_id"] == "fake" and res["completed"] == 10 and res["failed"] == 0
    assert res["total_input_tokens"] == 320 and res["total_output_tokens"] == 40
    assert res["request_goodput"] == pytest.approx(res["request_throughput"])
    assert res["max_concurrency"] == 2 and res["request_rate"] == "inf"
    for key in ("mean_ttft_ms", "p99_itl_ms", "median_tpot_ms", "p99_e2el_ms", "output_throughput"):
        assert res[key] > 0
    assert len(res["ttfts"]) == 10 and len(res["itls"][0]) == 3 and res["errors"] == [""] * 10


def test_bench_workload_file_rate_and_errors(tmp_path: Path) -> None:
    wf = tmp_path / "w.yaml"
    wf.write_text("arrival: {kind: poisson, rate_per_s: 200}\nnum_requests: 12\nendpoint: chat\n"
                  "output_tokens: {dist: fixed, value: 3}\n")
    with start_fake_server(ttft_ms=1, itl_ms=1, error_status=500, error_every=4) as srv:
        r = CliRunner().invoke(make_app(), ["bench", "--url", srv.url, "--workload", str(wf),
                                            "--json", str(tmp_path / "o.json")])
    assert r.exit_code == 0, r.output
    res = json.loads((tmp_path / "o.json").read_text())
    assert res["completed"] == 9 and res["failed"] == 3 and res["request_goodput"] is None
    assert res["backend"] == "openai-chat" and res["request_rate"] == 200
    assert res["tuner"]["errors_http_5xx"] == 3 and "errors: http_5xx 3 (first: " in r.output


def test_bench_rejects_bad_options(tmp_path: Path) -> None:
    app = make_app()
    r = CliRunner().invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--model", "m", "--goodput", "ttft=5"])
    assert r.exit_code == 2 and "--goodput" in r.output
    wf = tmp_path / "w.yaml"
    wf.write_text("num_requests: 5\nbogus: 1\n")
    r = CliRunner().invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--model", "m", "--workload", str(wf)])
    assert r.exit_code == 2 and "w.yaml:2" in r.output and "bogus" in r.output
    # nothing listens: every request fails to connect, the run still reports, exit code 1
    r = CliRunner().invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--model", "m", "--requests", "3"])
    assert r.exit_code == 1 and "connect" in r.output


def test_parse_goodput() -> None:
    assert parse_goodput(["ttft:200 tpot:50", "e2el:1000"]) == {"ttft": 200.0, "tpot": 50.0, "e2el": 1000.0}
    with pytest.raises(ConfigError):
        parse_goodput(["itl:5"])
