"""The server guard: runs a server command as its child and takes the whole process group down when the
tuner dies, however it dies.

    python -I guard.py LIFELINE_FD -- argv...

ServerProcess starts this script as the leader of a new process group, with the read end of a pipe whose
write end only the tuner holds (the lifeline). The server runs as the guard's child in the same group,
and so do the server's own children (vLLM's workers, a launcher's shards). When the tuner exits or is
SIGKILLed the kernel closes the write end; the guard reads EOF, sends SIGTERM to the group, and SIGKILL
after a grace period. The parent-death signal the server used to get reached only the server itself, not
its children, which then held their GPUs until the next start reaped them.

The guard ignores the SIGTERM/SIGINT/SIGHUP the tuner sends to the group on a normal stop (the server
handles them) and exits with the server's own status: the same code, or the same signal. Standard library
only, and run in isolated mode, so it starts in milliseconds whatever the server's environment.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

GRACE_S = 5.0


def _hold(fd: int, child: subprocess.Popen[bytes]) -> None:
    """Block on the lifeline; at EOF (the tuner is gone) stop the whole group."""
    try:
        while os.read(fd, 1):
            pass
    except OSError:
        pass
    try:
        os.killpg(0, signal.SIGTERM)
        child.wait(timeout=GRACE_S)
    except (OSError, subprocess.TimeoutExpired):
        pass
    os.killpg(0, signal.SIGKILL)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: guard.py LIFELINE_FD -- command [args...]", file=sys.stderr)
        return 2
    fd = int(argv[0])
    # a caught signal is reset to its default in the exec'd child (an ignored one would stay ignored)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    try:
        child = subprocess.Popen(argv[2:], stdin=subprocess.DEVNULL)  # noqa: S603 - an argument list
    except OSError as exc:
        print(f"cannot start {argv[2]!r}: {exc}", file=sys.stderr, flush=True)
        return 127
    threading.Thread(target=_hold, args=(fd, child), daemon=True).start()
    rc = child.wait()
    if rc < 0:  # killed by a signal: die of the same one, so the tuner sees what the server saw
        signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
        return 128 - rc
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
