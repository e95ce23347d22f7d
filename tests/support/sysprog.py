"""System programs the tests run for real (Debian's packages: Prometheus, HAProxy): find the binary, or skip
(fail under CI=true, where .ci/run installs the package), and run it in its own process group until ready.

No pytest import at module level: the experiments use these helpers as plain scripts."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def debian_program(path: str, name: str, package: str) -> str:
    """`path` (or `name` on PATH), or skip (fail under CI) saying how to install `package`."""
    exe = path if os.path.exists(path) else shutil.which(name)
    if exe is None:
        import pytest

        msg = (f"{name.upper()} MISSING: install Debian's package (`apt-get install {package}`; .ci/run does) to "
               "run this test")
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return exe


def log_tail(log: Path, n: int = 3000) -> str:
    return log.read_text(errors="replace")[-n:] if log.is_file() else ""


@contextmanager
def group_process(argv: list[str], log: Path, ready: Callable[[], bool], *, timeout_s: float,
                  poll_s: float = 0.1) -> Iterator[subprocess.Popen[bytes]]:
    """Start argv in its own process group (output appended to `log`), yield it once `ready()`; the group is
    ended (TERM, then KILL) afterwards."""
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{Path(argv[0]).name} did not start (exit {proc.poll()}):\n{log_tail(log)}")
            time.sleep(poll_s)
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
