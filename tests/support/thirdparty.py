"""Third-party OpenAI-compatible servers, installed from the package registry into ignored venvs by
`make interop-venvs` (part of `make test`): guidellm's mock server and Hugging Face's `transformers serve`
running a tiny local model on the CPU.

A test that needs one skips with a loud reason when its venv is missing, except under CI (CI=true), where
`make test` builds the venvs first and a missing one is a failure.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUIDELLM_VENV = ROOT / ".venv-guidellm"
HFSERVE_VENV = ROOT / ".venv-hfserve"


def venv_program(venv: Path, program: str) -> Path:
    """The program from `venv`, or skip (fail under CI) naming the make target that builds it."""
    exe = venv / "bin" / program
    if not exe.is_file():
        msg = (f"THIRD-PARTY SERVER MISSING: {exe.relative_to(ROOT)} is not installed; run `make interop-venvs` "
               "(make test does) to test against it")
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return exe


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    url: str
    model: str
    log: Path
    proc: subprocess.Popen[bytes]

    def log_tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.is_file() else ""


def _wait_healthy(srv: Server, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if srv.proc.poll() is not None:
            raise RuntimeError(f"server exited with {srv.proc.returncode}:\n{srv.log_tail()}")
        try:
            with urllib.request.urlopen(srv.url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.25)
    raise RuntimeError(f"server not healthy after {timeout_s} s:\n{srv.log_tail()}")


@contextmanager
def running(argv: list[str], *, port: int, model: str, log: Path, env: dict[str, str] | None = None,
            timeout_s: float = 180.0) -> Iterator[Server]:
    """Start argv (its own process group, in this session: a new session would be a new scheduler autogroup,
    which starves a CPU server's front end on a busy host), wait for /health, yield it; the group is ended
    afterwards."""
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, process_group=0,
                                env={**os.environ, **(env or {})})
    srv = Server(url=f"http://127.0.0.1:{port}", model=model, log=log, proc=proc)
    try:
        _wait_healthy(srv, timeout_s)
        yield srv
    finally:
        for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            if proc.poll() is not None:
                break
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait)
            except subprocess.TimeoutExpired:
                continue


def guidellm_mock_argv(port: int, *, model: str = "mock", ttft_ms: float = 20.0, itl_ms: float = 5.0,
                       extra: list[str] | None = None) -> list[str]:
    exe = venv_program(GUIDELLM_VENV, "guidellm")
    return [str(exe), "mock-server", "--host", "127.0.0.1", "--port", str(port), "--model", model,
            "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms), *(extra or [])]


def hfserve_argv(port: int, model_dir: Path, *, extra: list[str] | None = None) -> list[str]:
    exe = venv_program(HFSERVE_VENV, "transformers")
    return [str(exe), "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
            "--log-level", "info", *(extra or [])]


def hfserve_env(cache_dir: Path) -> dict[str, str]:
    """Offline, with a cache directory that exists (its /v1/models fails with 500 without one)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    return {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_CACHE": str(cache_dir),
            "HF_HUB_DISABLE_TELEMETRY": "1", "OMP_NUM_THREADS": "1"}
