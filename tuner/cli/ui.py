"""`tuner ui`: the MLflow UI on the tuner's tracking store.

The server runs as a ServerProcess (its own process group under the guard), so SIGTERM or SIGINT to `tuner ui`
takes the MLflow server and all its workers down, and so does the death of `tuner ui` however it dies. The URL
is announced only once MLflow answers its health check.
"""

from __future__ import annotations

import signal
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from tuner.errors import ConfigError, TrialError, TunerError
from tuner.tracking.tracker import safe_url

READY_TIMEOUT_S = 300.0


def ui_argv(uri: str, artifact_root: str, host: str, port: int, workers: int) -> list[str]:
    return [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
            "--default-artifact-root", artifact_root, "--host", host, "--port", str(port),
            "--workers", str(workers)]


def _check_port(host: str, port: int) -> None:
    """A port something else holds would answer our health check with someone else's server."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server will: TIME_WAIT is no obstacle
        try:
            s.bind((host, port))
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; pick another with --port",
                              field="--port") from None


def serve(state_dir: Path, uri: str, *, host: str = "127.0.0.1", port: int = 5000, workers: int = 2,
          ready_timeout_s: float = READY_TIMEOUT_S, announce: Callable[[str], None] = print,
          stop: threading.Event | None = None) -> int:
    """Run the UI until stopped (SIGTERM/SIGINT, or `stop`). Returns 0 after a stop, else the server's status."""
    from tuner.targets.process import ServerProcess

    _check_port(host, port)
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    base = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    server = ServerProcess(
        ui_argv(uri, (state_dir / "mlartifacts").resolve().as_uri(), host, port, workers),
        log_path=state_dir / "logs" / "mlflow-ui.log", state_dir=state_dir, health_url=f"{base}/health",
        grace_s=10.0)
    server.start()
    try:
        try:
            ready_s = server.wait_ready(ready_timeout_s, stop_event=stop)
        except TrialError as exc:
            if stop.is_set():
                return 0
            raise TunerError(f"the MLflow UI did not start ({exc.cause}): {exc}\n{server.log_tail(20)}") from None
        # the UI's workflow switch defaults to GenAI (traces); the parameter opens the runs tables instead
        announce(f"MLflow UI on {base}/#/experiments?workflowType=machine_learning (ready in {ready_s:.0f} s; "
                 f"store {safe_url(uri)}); Ctrl-C to stop")
        while not stop.is_set() and server.alive():
            stop.wait(0.5)
        if stop.is_set():
            return 0
        return int(server.returncode or 0) or 1  # the server exited on its own: say so with a failure
    finally:
        server.stop()
