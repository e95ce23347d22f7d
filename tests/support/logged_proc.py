"""Long-running subprocesses of the integration tests (daemons), their output in a file.

Not a pipe: a test polls state for a minute or more without reading, and a pipe nobody reads fills at
64 KiB and blocks the child on its next log line, which the test would see as a daemon that stopped working.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
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
