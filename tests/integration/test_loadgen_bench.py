"""`tuner bench` through Typer's CliRunner against the fake server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from tests.support.fake_openai_server import start_fake_server
from tuner.bench import parse_goodput, register
from tuner.errors import ConfigError


def make_app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """test app"""

    register(app)
    return app


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
    assert len(res["ttfts"]) == 10 and len(res["itls"][0]) == 3 and res["errors"] == []


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
    assert res["tuner"]["errors_http_5xx"] == 3 and "errors: http_5xx" in r.output


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
