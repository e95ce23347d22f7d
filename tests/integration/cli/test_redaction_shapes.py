"""Secrets in every shape a URL can carry them (issue 30): a password holding '/', '@', '?', '#', ':' or a
quote (the userinfo runs to the last '@' a host follows), a secret query pair in a URL or in a path-and-query
printed alone (urllib3's and MLflow's messages), libpq's `password=`; generated, never the examples. The spec
refuses such a password in storage and tracking.uri, and a run with MLFLOW_TRACKING_URI carrying one prints
it nowhere."""

from __future__ import annotations

import logging
import os
import random
import socket
import string
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest
import yaml
from typer.testing import CliRunner

from tests.support.agents import agent_spec
from tuner.base.logs import RedactFilter
from tuner.base.redact import redact_text, redact_url
from tuner.cli.main import app

REPO = Path(__file__).resolve().parents[3]
_HARD = "/@?#:%!$&'()*+,;=~"  # what a password may hold unencoded in a URL people paste


def _password(rng: random.Random) -> str:
    """12-20 characters, at least one of '/', '@', '?', '#', ':' among them, never the mask."""
    body = [rng.choice(string.ascii_letters + string.digits + _HARD) for _ in range(rng.randint(12, 20))]
    body[rng.randrange(len(body))] = rng.choice("/@?#:")
    body[0] = rng.choice(string.ascii_letters)
    return "".join(body)


def _url(rng: random.Random, password: str) -> str:
    scheme = rng.choice(["postgresql", "postgresql+psycopg", "mysql+pymysql", "http", "https", "redis"])
    host = rng.choice(["db", "127.0.0.1", "db.internal.example", "[::1]", "mlflow-svc"])
    port = rng.choice(["", ":5432", ":5000"])
    path = rng.choice(["", "/", "/optuna", "/api/2.0?x=1"])
    return f"{scheme}://{rng.choice(['tuner', 'u', 'svc_1'])}:{password}@{host}{port}{path}"


def _secret_parts(password: str) -> list[str]:
    """The stretches of the password that must not show (a printed fragment of 5+ characters)."""
    return [password[i:i + 5] for i in range(len(password) - 4)]


@pytest.mark.parametrize("seed", range(40))
def test_a_password_of_any_shape_is_masked_wherever_the_url_sits(seed: int) -> None:
    rng = random.Random(seed)
    pw = _password(rng)
    url = _url(rng, pw)
    context = rng.choice(["{u}", "cannot reach {u} (refused)", "storage={u!r}", "[{u}]", "'{u}': timeout"])
    text = context.format(u=url)
    for out in (redact_text(text), redact_url(url)):
        assert not any(part in out for part in _secret_parts(pw)), (text, out)
        assert "***" in out


@pytest.mark.parametrize("seed", range(20))
def test_a_secret_query_pair_is_masked_in_a_url_and_in_a_path_printed_alone(seed: int) -> None:
    rng = random.Random(seed)
    key = rng.choice(["token", "access_token", "api_key", "password", "secret", "auth", "signature", "sig",
                      "X-Amz-Signature", "client_secret", "key"])
    value = "".join(rng.choice(string.ascii_letters + string.digits + "-_.~%") for _ in range(24))
    query = f"?n=1&{key}={value}" if rng.random() < 0.5 else f"?{key}={value}&n=1"
    text = rng.choice([
        f"Retrying (Retry(total=2)) after connection broken by 'NewConnectionError()': /api/2.0/mlflow/runs/create"
        f"{query}",
        f"HTTPConnectionPool(host='127.0.0.1', port=5000): Max retries exceeded with url: /api{query} (Caused by",
        f"http://127.0.0.1:5000/api/2.0/mlflow/experiments/get{query}"])
    out = redact_text(text)
    assert value[:8] not in out and f"{key}=***" in out, out
    assert "n=1" in out  # the rest of the query stays


@pytest.mark.parametrize("seed", range(5))
def test_a_keyword_connection_string_password_is_masked(seed: int) -> None:
    pw = _password(random.Random(seed)).replace(" ", "x")
    out = redact_text(f"host=db port=5432 password={pw.replace('&', 'x').replace(';', 'x')} dbname=optuna")
    assert "password=***" in out and "dbname=optuna" in out


def test_names_that_count_tokens_are_not_masked() -> None:
    text = "?max_num_batched_tokens=8192&long_prefill_token_threshold=4 tokens=5"
    assert redact_text(text) == text


def _validate(tmp_path: Path, spec: dict) -> tuple[int, str]:
    p = tmp_path / "agent.yaml"
    p.write_text(yaml.safe_dump(spec, sort_keys=False))
    r = CliRunner().invoke(app, ["validate", str(p)])
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r.exit_code, r.output


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("field", ["storage", "tracking.uri", "watch.monitor.dcgm_prometheus_url",
                                   "watch.monitor.cpu_steal_source"])
def test_the_spec_refuses_a_password_of_any_shape(tmp_path: Path, seed: int, field: str) -> None:
    rng = random.Random(seed)
    pw = _password(rng)
    url = _url(rng, pw) if rng.random() < 0.7 else f"postgresql://db/optuna?password={quote(pw, safe='')}"
    watch = {"watch.url": "http://127.0.0.1:9/metrics"} if field.startswith("watch.") else {}
    code, out = _validate(tmp_path, agent_spec(at={**watch, field: url}))
    assert code == 2 and "a password in the URL is refused" in " ".join(out.split()), out
    assert not any(part in out for part in _secret_parts(pw)), out


def test_the_log_filter_redacts_arguments_exceptions_and_stacks() -> None:
    pw = "pa/ss@w?rd#9"
    records = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(self.format(record) + (record.stack_info or ""))

    h = Keep()
    h.addFilter(RedactFilter())
    lg = logging.getLogger("redaction-shapes")
    lg.addHandler(h)
    lg.propagate = False
    try:
        lg.warning("tracking at %s is down", f"http://u:{pw}@127.0.0.1:5000")
        lg.warning("retry %s", "/api/2.0/runs?token=t0k3nt0k3n")
        try:
            raise ConnectionError(f"postgresql://u:{pw}@db/x refused")
        except ConnectionError:
            lg.exception("store down")
        lg.warning("where %s", "here", stack_info=True)
    finally:
        lg.removeHandler(h)
    joined = "\n".join(records)
    assert pw not in joined and "t0k3nt0k3n" not in joined and "ConnectionError" in joined


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.process
def test_a_run_with_such_a_tracking_uri_in_the_environment_prints_no_secret(tmp_path: Path) -> None:
    """MLFLOW_TRACKING_URI holds a password with '/' and a ?token=; the store does not answer: the run's
    WARNING lines (the tracker's, MLflow's, urllib3's) name the store without either secret."""
    pw, token = "hu/nt@er2-s3cret", "tok-9f8e7d6c5b4a"
    agent = tmp_path / "agent.yaml"
    agent.write_text(yaml.safe_dump(agent_spec(at={"workload.num_requests": 20}), sort_keys=False))
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"http://svc:{pw}@127.0.0.1:{_closed_port()}/?token={token}",
           "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "tuner.cli", "run", str(agent), "--trials", "1", "--state-dir",
                        str(tmp_path / "state")], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "nt@er2" not in out and "s3cret" not in out and token not in out, out[-3000:]
    code = subprocess.run([sys.executable, "-m", "tuner.cli", "status", str(agent), "--state-dir",
                           str(tmp_path / "state")], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert "s3cret" not in code.stdout + code.stderr and token not in code.stdout + code.stderr
