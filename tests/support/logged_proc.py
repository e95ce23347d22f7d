"""Long-running subprocesses of the integration tests (daemons), their output in a file.

Not a pipe: a test polls state for a minute or more without reading, and a pipe nobody reads fills at
64 KiB and blocks the child on its next log line, which the test would see as a daemon that stopped working.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path


def start_logged(argv: list[str], log: Path, cwd: Path, env: Mapping[str, str] | None = None
                 ) -> subprocess.Popen[str]:
    """Start argv with stdout and stderr appended to `log` (appended: a restarted daemon keeps the first log)."""
    with log.open("a") as out:
        return subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, text=True,
                                env=dict(env) if env is not None else None)


def output(log: Path, last: int = 3000) -> str:
    """The last `last` characters the process wrote."""
    return log.read_text(errors="replace")[-last:] if log.is_file() else ""


def finish(proc: subprocess.Popen[str], log: Path, timeout: float) -> str:
    """Wait for the process to exit (after a signal) and return everything it wrote."""
    proc.wait(timeout=timeout)
    return log.read_text(errors="replace")


def wait_while_running(what: Callable[[], bool], procs: Sequence[subprocess.Popen[str]], log: Path,
                       timeout_s: float, doing: str = "waiting") -> None:
    """Poll `what` until it holds; fail with the log's tail if one of `procs` exits first or it times out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for p in procs:
            assert p.poll() is None, f"{p.args[:4]} exited while {doing}: {output(log)}"
        if what():
            return
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout_s:.0f} s {doing}: {output(log)}")


def stop_all(procs: Sequence[subprocess.Popen[str]], server: subprocess.Popen[bytes]) -> None:
    """Kill the processes still running, then stop the server (SIGTERM, 10 s)."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    server.terminate()
    server.wait(10)
