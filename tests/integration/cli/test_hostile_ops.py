"""An operator's slips and an attacker's reads: URLs with secrets redacted wherever they are printed,
`tuner check` on a SIGKILLed daemon, `tuner bench` on a malformed URL or an odd /v1/models, and the state
dir private whatever the umask."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tuner.base.redact import redact_mapping, redact_text, redact_url
from tuner.cli.main import app

SECRET = "hunter2-s3cret"


@pytest.mark.parametrize(("url", "expected"), [
    (f"postgresql+psycopg://tuner:{SECRET}@db:5432/optuna", "postgresql+psycopg://tuner:***@db:5432/optuna"),
    (f"http://u:{SECRET}@mlflow:5000", "http://u:***@mlflow:5000"),
    (f"https://mlflow/api?token={SECRET}&x=1", "https://mlflow/api?token=***&x=1"),
    (f"https://h/p?X-Amz-Signature={SECRET}", "https://h/p?X-Amz-Signature=***"),
    (f"https://{SECRET}{SECRET}@github.com/x", "https://***@github.com/x"),
    ("sqlite:////tmp/x.db", "sqlite:////tmp/x.db"),
    ("http://127.0.0.1:8000/v1?max_tokens=5", "http://127.0.0.1:8000/v1?max_tokens=5"),
])
def test_one_redaction_for_every_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected
    assert redact_text(f"cannot reach {url} (refused)") == f"cannot reach {expected} (refused)"


def test_secret_names_are_hidden_and_token_counts_are_not() -> None:
    out = redact_mapping({"api_key": SECRET, "HF_TOKEN": SECRET, "max_num_batched_tokens": 512,
                          "endpoint": f"http://u:{SECRET}@h/"})
    assert out == {"api_key": "***", "HF_TOKEN": "***", "max_num_batched_tokens": 512, "endpoint": "http://u:***@h/"}


def _cli(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, list(args))
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r.exit_code, r.output


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("url", ["http://exa mple.com", "ftp://host/", "http://:80", "http://host:99999",
                                 "http://host\n", "not a url"])
def test_bench_refuses_a_malformed_url_in_one_line(url: str) -> None:
    code, out = _cli("bench", "--url", url, "--requests", "1")
    assert code == 2, out
    assert "Traceback" not in out and out.strip().count("\n") == 0, out


@pytest.fixture()
def odd_models_server() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            body = json.dumps([{"id": "m"}]).encode()  # a list, not {"data": [...]}
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/?token={SECRET}"
    finally:
        srv.shutdown()


def test_bench_on_an_odd_models_payload_is_one_line_without_the_token(odd_models_server: str) -> None:
    code, out = _cli("bench", "--url", odd_models_server, "--requests", "1")
    assert code == 2, out
    assert "did not list a model" in out and SECRET not in out and "Traceback" not in out


def test_bench_on_a_closed_port_hides_the_password() -> None:
    code, out = _cli("bench", "--url", f"http://user:{SECRET}@127.0.0.1:{_free_port()}", "--requests", "1")
    assert code == 2, out
    assert SECRET not in out and "user:***@" in out


def test_an_unreachable_tracking_uri_is_logged_without_its_password(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    from tuner.tracking.tracker import Tracker

    tr = Tracker(f"http://user:{SECRET}@127.0.0.1:{_free_port()}", "x", call_timeout_s=5)
    assert tr.start_run("cycle-1") is None
    assert "failed" in caplog.text and SECRET not in caplog.text


def test_check_sees_a_sigkilled_daemon_at_once(tmp_path: Path) -> None:
    from tuner.base.proc import process_start_ticks
    from tuner.daemon.health import check_alive, heartbeat_path

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        beat = {"pid": proc.pid, "pid_start_ticks": process_start_ticks(proc.pid), "host": socket.gethostname(),
                "time": time.time(), "interval_s": 5.0, "agents": {}}
        heartbeat_path(tmp_path).parent.mkdir(parents=True)  # the daemon makes it (`tuner check` creates nothing)
        heartbeat_path(tmp_path).write_text(json.dumps(beat))
        ok, why = check_alive(state_dir=tmp_path)
        assert ok, why
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        ok, why = check_alive(state_dir=tmp_path)  # the heartbeat is fresh: only the PID tells
        assert not ok and "not running" in why, why
        beat["pid_start_ticks"] = (process_start_ticks(os.getpid()) or 0) + 1  # this PID, another start time
        beat["pid"] = os.getpid()
        heartbeat_path(tmp_path).write_text(json.dumps(beat))
        ok, why = check_alive(state_dir=tmp_path)
        assert not ok and "another process" in why, why
    finally:
        if proc.poll() is None:
            proc.kill()


def test_state_is_private_whatever_the_umask(tmp_path: Path) -> None:
    agent = Path(__file__).resolve().parents[3] / "agents" / "sim-8xa100.yaml"
    sd = tmp_path / "deep" / "state"
    old = os.umask(0)
    try:
        code, out = _cli("run", str(agent), "--trials", "1", "--state-dir", str(sd))
    finally:
        os.umask(old)
    assert code in (0, 3), out  # 3: the trial ran but broke an SLO (run's exit codes)
    for d in (tmp_path / "deep", sd):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, (d, oct(d.stat().st_mode))
    for f in ("optuna.db", "mlflow.db"):
        assert stat.S_IMODE((sd / f).stat().st_mode) == 0o600, (f, oct((sd / f).stat().st_mode))
