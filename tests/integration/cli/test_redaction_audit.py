"""The redaction audit: a URL's password or token that reaches the tuner through a command target's argv, a
server's error message (the load generator's request records), a log line or an exception's traceback never
reaches the output, the logs, the trial's log file, the Optuna study or MLflow (tuner.base.redact, through
tuner.base.logs.RedactFilter for every log line)."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tuner.base.logs import RedactFilter
from tuner.cli.main import app

REPO = Path(__file__).resolve().parents[3]
FAULTY = REPO / "tests" / "support" / "faulty_server.py"
PASSWORD, TOKEN = "pw-hunter2-s3cret", "tok-0123456789abcdef"
LEAKY_URL = f"http://svc:{PASSWORD}@backend:8000/v1?access_token={TOKEN}"


def _no_secret(text: str, where: str) -> None:
    assert PASSWORD not in text and TOKEN not in text, f"a secret reached {where}:\n{text[-3000:]}"


@pytest.mark.parametrize("fmt", ["plain", "json"])
def test_log_lines_and_tracebacks_are_redacted_whoever_logs_them(fmt: str, monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    from tuner.base.textfmt import log_handler

    monkeypatch.setenv("TUNER_LOG_FORMAT", fmt)
    buf = io.StringIO()
    handler = log_handler(buf)
    handler.addFilter(RedactFilter())
    lg = logging.getLogger(f"redaction-audit-{fmt}")
    lg.addHandler(handler)
    lg.propagate = False
    try:
        lg.warning("cannot reach %s", LEAKY_URL)  # the URL as an argument
        lg.warning(f"upstream {LEAKY_URL} failed")  # noqa: G004 - the URL inside the message itself
        try:
            raise RuntimeError(f"connection to {LEAKY_URL} refused")
        except RuntimeError:
            lg.exception("a daemon cycle failed")
    finally:
        lg.removeHandler(handler)
    out = buf.getvalue()
    _no_secret(out, f"a {fmt} log")
    assert out.count("svc:***@backend:8000") == 3 and "access_token=***" in out
    assert "RuntimeError" in out  # the traceback is still there, redacted


def _command_agent(tmp_path: Path) -> Path:
    p = tmp_path / "agent.yaml"
    p.write_text(
        "name: leaky\ntarget:\n  kind: command\n"
        f"  command: ['{{python}}', '{FAULTY}', --port, '{{port}}', --model, m, --mode, http500,"
        f" --itl-ms, '{{itl}}', --error-message, 'upstream {LEAKY_URL} failed']\n"
        "  model: m\n"
        "search_space:\n  params:\n    itl: {type: int, low: 1, high: 5, default: 1}\n"
        "workload: {num_requests: 4, arrival: {kind: closed, concurrency: 2}, prompt_tokens: {dist: fixed, value: 8},"
        " output_tokens: {dist: fixed, value: 4}}\n"
        "objectives: [{metric: request_throughput, direction: maximize}]\nbudget: {trials: 1}\n")
    return p


def test_show_command_hides_a_url_secret_in_the_argv(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["validate", str(_command_agent(tmp_path)), "--show-command"])
    assert r.exit_code == 0, r.output
    _no_secret(r.output, "validate --show-command")
    assert "svc:***@backend" in r.output


@pytest.mark.slow
def test_a_trial_of_a_command_target_leaks_no_url_secret(tmp_path: Path) -> None:
    """The server's argv holds the URL (the `starting server` log line, the trial log's header) and its error
    answers repeat it (the requests' error details, the trial's error): none of them leaks."""
    agent = _command_agent(tmp_path)
    sd = tmp_path / "state"
    env = {**os.environ, "TUNER_LOG_FORMAT": "plain"}
    r = subprocess.run([sys.executable, "-m", "tuner.cli", "-v", "run", str(agent), "--trials", "1",
                        "--state-dir", str(sd)], cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode in (0, 3), r.stdout + r.stderr  # 3: no feasible trial (every request got a 500)
    _no_secret(r.stdout + r.stderr, "the output and the log")
    assert "starting server" in r.stderr and "svc:***@backend" in r.stderr
    for f in (sd / "logs").glob("*.log"):
        _no_secret(f.read_text(errors="replace"), str(f))
    import optuna

    from tuner.study.study import default_storage, open_storage

    trials = optuna.load_study(study_name="leaky", storage=open_storage(default_storage(sd))).trials
    cause = trials[0].user_attrs.get("cause") if trials else None
    assert cause in ("server_errors", "all_requests_failed"), trials[0].user_attrs
    _no_secret(json.dumps([t.user_attrs for t in trials], default=str), "the Optuna study")
    assert "svc:***@backend" in trials[0].user_attrs["error"]
    from mlflow.tracking import MlflowClient

    from tuner.tracking.tracker import default_tracking_uri

    client = MlflowClient(tracking_uri=default_tracking_uri(sd))
    exp = client.get_experiment_by_name("leaky")
    runs = client.search_runs([exp.experiment_id])
    assert any(r.data.tags.get("kind") == "trial" for r in runs)
    for run in runs:
        _no_secret(json.dumps([run.data.params, run.data.tags]), f"MLflow run {run.info.run_name}")
        root = Path(client.download_artifacts(run.info.run_id, "", str(tmp_path / run.info.run_id)))
        for f in root.rglob("*"):
            if f.is_file():
                _no_secret(f.read_text(errors="replace"), f"MLflow artifact {f.name}")


def test_bench_hides_a_url_secret_in_the_servers_error_answers(tmp_path: Path) -> None:
    from tests.support.postgres import free_port

    port = free_port()
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        srv = subprocess.Popen([sys.executable, str(FAULTY), "--port", str(port), "--mode", "http500",
                                "--error-message", f"upstream {LEAKY_URL} failed"], stdout=out,
                               stderr=subprocess.STDOUT)
    try:
        import time
        import urllib.request

        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                    break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
        result = tmp_path / "bench.json"
        r = CliRunner().invoke(app, ["bench", "--url", f"http://127.0.0.1:{port}", "--model", "fake",
                                     "--requests", "3", "--concurrency", "1", "--prompt-tokens", "8",
                                     "--output-tokens", "4", "--json", str(result)])
        _no_secret(r.output, "tuner bench's output")
        if result.exists():
            _no_secret(result.read_text(), "tuner bench's result file")
            assert "svc:***@backend" in result.read_text()
        else:
            assert "svc:***@backend" in r.output, r.output
    finally:
        srv.terminate()
        srv.wait(10)
