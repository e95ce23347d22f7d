"""A real HAProxy (Debian's /usr/sbin/haproxy) on 127.0.0.1 for the rollout tests and the canary experiment.

`running_haproxy(dir, {"stable0": "127.0.0.1:PORT", ...})` writes a configuration (one HTTP frontend, one
round-robin backend health-checked on /health, an admin stats socket in `dir`), starts HAProxy in the
foreground (-db: no daemon, no systemd) and ends it afterwards. A missing binary skips the test, except under
CI (CI=true), where .ci/run installs the package first and a missing one is a failure. Keep this module free of
pytest imports at module level: experiments/canary/ uses it as a plain script.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.sysprog import debian_program, group_process

HAPROXY = "/usr/sbin/haproxy"


def haproxy_binary() -> str:
    """The haproxy program, or skip (fail under CI) saying how to install it."""
    return debian_program(HAPROXY, "haproxy", "haproxy")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Balancer:
    url: str  # the frontend, http://127.0.0.1:PORT
    socket: Path  # the admin stats socket
    backend: str
    log: Path
    proc: subprocess.Popen[bytes]
    metrics_backend: str | None = None  # the backend /metrics goes to (same servers, no request limit), if any

    def log_tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.is_file() else ""


def config_text(socket_path: Path, port: int, servers: Mapping[str, str], *, backend: str,
                check_inter_ms: int = 500, metrics_backend: str | None = None) -> str:
    """`metrics_backend`: a second backend of the same servers that /metrics goes to, so that a scrape never
    waits in the queue of the LLM backend's requests (a server limited by maxconn)."""
    server_lines = [f"    server {name} {addr} weight 100 check inter {check_inter_ms}ms fall 2 rise 1"
                    for name, addr in servers.items()]
    lines = [
        "global",
        f"    stats socket {socket_path} mode 600 level admin",
        "defaults",
        "    mode http",
        "    timeout connect 5s",
        "    timeout client 300s",
        "    timeout server 300s",
        "    timeout queue 300s",  # a request waits this long for a server with room (maxconn)
        "    retries 2",
        "    option redispatch",
        "frontend llm_in",
        f"    bind 127.0.0.1:{port}",
        *([f"    use_backend {metrics_backend} if {{ path /metrics }}"] if metrics_backend else []),
        f"    default_backend {backend}",
        f"backend {backend}",
        "    balance roundrobin",
        "    option httpchk GET /health",
        *server_lines,
    ]
    if metrics_backend:
        lines += [f"backend {metrics_backend}", "    balance roundrobin", "    option httpchk GET /health",
                  *server_lines]
    return "\n".join(lines) + "\n"


@contextmanager
def running_haproxy(workdir: Path, servers: Mapping[str, str], *, backend: str = "llm",
                    timeout_s: float = 30.0, metrics_backend: str | None = None) -> Iterator[Balancer]:
    """Start HAProxy in front of `servers` (name -> host:port); yield it once its socket answers."""
    exe = haproxy_binary()
    workdir.mkdir(parents=True, exist_ok=True)
    sock = workdir / "haproxy.sock"
    if len(str(sock)) > 100:  # a unix socket path holds at most 107 bytes
        import tempfile

        sock = Path(tempfile.mkdtemp(prefix="hx-")) / "haproxy.sock"
    port = free_port()
    cfg = workdir / "haproxy.cfg"
    cfg.write_text(config_text(sock, port, servers, backend=backend, metrics_backend=metrics_backend))
    log = workdir / "haproxy.log"
    with group_process([exe, "-f", str(cfg), "-db"], log, lambda: _answers(sock), timeout_s=timeout_s) as proc:
        yield Balancer(url=f"http://127.0.0.1:{port}", socket=sock, backend=backend, log=log, proc=proc,
                       metrics_backend=metrics_backend)


def _answers(sock: Path) -> bool:
    if not sock.exists():
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect(str(sock))
            s.sendall(b"show info\n")
            return bool(s.recv(100))
    except OSError:
        return False
