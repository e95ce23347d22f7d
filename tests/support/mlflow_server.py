"""A real `mlflow server` for tests: a backend store URL (PostgreSQL here), artifacts under a folder, 127.0.0.1.

    with start_mlflow_server(pg.url("mlflow"), tmp / "artifacts", env=pg.env()) as uri:
        ...   # http://127.0.0.1:<port>; the password stays in the environment (PGPASSWORD)
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

from tests.support.postgres import free_port


@contextlib.contextmanager
def start_mlflow_server(backend_uri: str, artifacts: Path, *, env: Mapping[str, str],
                        timeout_s: float = 180.0) -> Iterator[str]:
    port = free_port()
    artifacts.mkdir(parents=True, exist_ok=True)
    log_path = artifacts.parent / f"mlflow-server-{port}.log"
    argv = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend_uri,
            "--artifacts-destination", artifacts.resolve().as_uri(), "--host", "127.0.0.1", "--port", str(port),
            "--workers", "1"]
    server_env = {**env, "MLFLOW_DISABLE_TELEMETRY": "true"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=server_env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server not up in {timeout_s:.0f} s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        import os
        import signal

        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
