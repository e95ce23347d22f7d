"""Process helpers with no tuner dependency: free ports, process identity from /proc, process-group liveness,
and the parent-death signal for children. Used by the process targets, the study (trial ownership) and
promotion (apply commands)."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any


# ---------------------------------------------------------------- ports
def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------- process identity
def process_start_ticks(pid: int) -> int | None:
    """The start time of `pid` in clock ticks since boot (/proc/<pid>/stat field 22), or None if gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError, OSError):
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    rest = data[data.rfind(")") + 2:].split()
    try:
        return int(rest[19])  # field 22 overall; rest starts at field 3
    except (IndexError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = data[data.rfind(")") + 2:].split()[0]
    return state not in ("Z", "X")


def group_alive(pgid: int) -> bool:
    """True if some non-zombie process is still in process group `pgid`."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            data = (entry / "stat").read_text()
        except OSError:
            continue
        fields = data[data.rfind(")") + 2:].split()
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return True
    return False


# ---------------------------------------------------------------- parent-death signal
_PR_SET_PDEATHSIG = 1
_libc: Any = None
try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _prctl: Any = _libc.prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None


def parent_death_preexec(parent_pid: int) -> Callable[[], None] | None:
    """preexec_fn for Popen: ask for SIGKILL when the parent dies; exit if it already has."""
    if _prctl is None:
        return None
    prctl = _prctl
    sig = int(signal.SIGKILL)

    def _preexec() -> None:  # runs in the child between fork and exec: keep it tiny
        prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return _preexec


KILL_AT_ENV = "TUNER_KILL_AT"  # fault injection: the named kill point SIGKILLs the process (see kill_point)


def kill_point(name: str) -> None:
    """Fault injection between the steps of a crash-consistent sequence: SIGKILL this process here when
    $TUNER_KILL_AT names this point (the crash tests and the fault campaign set it in the subprocess they kill);
    a no-op otherwise."""
    if os.environ.get(KILL_AT_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
