"""The load-balancer seam and its HAProxy adapter.

A LoadBalancer knows one backend: its servers (name, address, weight, health), how to set a server's weight,
and how to add and remove the canary's server. Weights change at run time, never through a reload, so the
traffic share moves while requests flow. HAProxy (Debian's 2.6) is driven through its runtime API: one command
per connection on the stats socket (`stats socket ... level admin`), a unix socket or a TCP address.
Other balancers (nginx with its API, Envoy's admin, a Kubernetes Service patched through kubectl; see
docs/rollout.md) implement the same five methods.
"""

from __future__ import annotations

import csv
import io
import socket
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import PromotionError

MAX_WEIGHT = 256  # HAProxy's largest server weight


class LoadBalancerError(PromotionError):
    """The load balancer refused a command or cannot be reached."""


@dataclass(frozen=True)
class Server:
    name: str
    addr: str  # host:port
    weight: int
    status: str  # UP, DOWN, MAINT, NOLB, no check ...
    requests: int = 0  # requests sent to it since the balancer started (HAProxy: stot)
    errors_5xx: int = 0  # 5xx answers it gave (hrsp_5xx)
    errors_conn: int = 0  # connection and response errors (econ + eresp)
    sessions: int = 0  # requests it is serving now (HAProxy: scur)
    check: str = ""  # the last health check's result (HAProxy: check_status, INI before the first one)

    @property
    def checked_up(self) -> bool:
        """Up, and (when it is health-checked) by a check it passed, not by the initial assumption."""
        return self.up and not self.check.startswith("INI")

    @property
    def up(self) -> bool:
        return self.status.startswith("UP") or self.status == "no check"


class LoadBalancer(ABC):
    """One backend of a load balancer."""

    backend: str

    @abstractmethod
    def servers(self) -> dict[str, Server]:
        """The backend's servers by name."""

    @abstractmethod
    def set_weight(self, server: str, weight: int) -> None:
        """Give `server` this weight (0: no new requests)."""

    @abstractmethod
    def add_server(self, server: str, addr: str, *, weight: int, health_path: str,
                   maxconn: int | None = None) -> None:
        """Add a server (weight `weight`, health-checked on `health_path`, at most `maxconn` requests at once:
        set_maxconn) and put it in service."""

    @abstractmethod
    def remove_server(self, server: str) -> None:
        """Take `server` out: no new requests, its sessions ended, then gone (idempotent)."""

    def set_maxconn(self, server: str, maxconn: int) -> None:
        """Let `server` hold at most `maxconn` requests at once (0: no limit); the others wait in the balancer's
        queue, which any server with room and weight takes from: a replacement takes the queue over at once."""
        raise LoadBalancerError(f"{type(self).__name__} cannot limit a server's concurrent requests")

    def describe(self) -> dict[str, str]:
        """Where the balancer is (kept in the rollout journal to find it again after a crash)."""
        return {"backend": self.backend}


class HAProxy(LoadBalancer):
    """HAProxy's runtime API on `address`: a unix socket path, or HOST:PORT of a TCP stats socket."""

    def __init__(self, address: str | Path, backend: str, *, timeout_s: float = 5.0) -> None:
        self.address = str(address)
        self.backend = backend
        self.timeout_s = timeout_s

    def describe(self) -> dict[str, str]:
        return {"kind": "haproxy", "socket": self.address, "backend": self.backend}

    # ------------------------------------------------------------ the runtime API
    def command(self, line: str) -> str:
        """Send one command, return the whole answer (HAProxy closes the connection after it)."""
        host, sep, port = self.address.rpartition(":")
        tcp = bool(sep) and port.isdigit() and "/" not in self.address
        try:
            if tcp:
                sock = socket.create_connection((host, int(port)), timeout=self.timeout_s)
            else:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(self.timeout_s)
                sock.connect(self.address)
        except OSError as exc:
            raise LoadBalancerError(f"cannot reach HAProxy's runtime API at {self.address}: {exc}") from None
        with sock:
            try:
                sock.sendall(line.encode() + b"\n")
                chunks = []
                while data := sock.recv(65536):
                    chunks.append(data)
            except OSError as exc:
                raise LoadBalancerError(f"HAProxy's runtime API at {self.address}: {line!r}: {exc}") from None
        return b"".join(chunks).decode("utf-8", "replace")

    def _ok(self, line: str, *, accept: tuple[str, ...] = ()) -> str:
        out = self.command(line).strip()
        low = out.lower()
        bad = ("no such", "unknown", "not found", "require", "invalid", "error", "can't", "cannot", "failed",
               "unexpected", "refused", "permission denied")
        if any(b in low for b in bad) and not any(a in low for a in accept):
            raise LoadBalancerError(f"HAProxy refused {line!r}: {out[:300]}")
        return out

    # ------------------------------------------------------------ the seam
    def servers(self) -> dict[str, Server]:
        text = self.command("show stat")
        if not text.startswith("# "):
            raise LoadBalancerError(f"HAProxy's show stat answered {text[:200]!r}")
        rows = csv.DictReader(io.StringIO(text[2:]))
        out: dict[str, Server] = {}
        for r in rows:
            if r.get("pxname") != self.backend or r.get("svname") in ("BACKEND", "FRONTEND"):
                continue

            def num(key: str, row: dict[str, str] = r) -> int:
                v = row.get(key) or "0"
                return int(v) if v.isdigit() else 0

            out[r["svname"]] = Server(name=r["svname"], addr=r.get("addr") or "", weight=num("weight"),
                                      status=r.get("status") or "", requests=num("stot"),
                                      errors_5xx=num("hrsp_5xx"), errors_conn=num("econ") + num("eresp"),
                                      sessions=num("scur"), check=r.get("check_status") or "")
        if not out and f"\n{self.backend},BACKEND," not in "\n" + text[2:]:
            raise LoadBalancerError(f"HAProxy has no backend {self.backend!r}")
        return out

    def set_weight(self, server: str, weight: int) -> None:
        if not 0 <= weight <= MAX_WEIGHT:
            raise ValueError(f"weight {weight} outside 0..{MAX_WEIGHT}")
        self._ok(f"set server {self.backend}/{server} weight {int(weight)}")

    def set_maxconn(self, server: str, maxconn: int) -> None:
        if maxconn < 0:
            raise ValueError(f"maxconn {maxconn} < 0")
        self._ok(f"set maxconn server {self.backend}/{server} {int(maxconn)}")

    def add_server(self, server: str, addr: str, *, weight: int, health_path: str,
                   maxconn: int | None = None) -> None:
        # HAProxy checks it with the backend's own `option httpchk` (the path there; health_path is for balancers
        # that take one per server)
        self.remove_server(server)  # a leftover of an earlier rollout (its owner is gone: recovery ran)
        limit = f" maxconn {int(maxconn)}" if maxconn is not None else ""
        self._ok(f"add server {self.backend}/{server} {addr} weight {int(weight)}{limit} check inter 500ms fall 2 "
                 "rise 1",
                 accept=("new server registered",))
        self._ok(f"enable server {self.backend}/{server}")
        self._ok(f"enable health {self.backend}/{server}")

    def remove_server(self, server: str, drain_s: float = 10.0) -> None:
        if server not in self.servers():
            return
        self._ok(f"set server {self.backend}/{server} state maint")
        deadline = time.monotonic() + drain_s
        while True:
            out = self.command(f"del server {self.backend}/{server}").strip()
            if "deleted" in out.lower() or server not in self.servers():
                return
            if time.monotonic() >= deadline:  # streams still open: end them, then delete
                self.command(f"shutdown sessions server {self.backend}/{server}")
                out = self.command(f"del server {self.backend}/{server}").strip()
                if "deleted" in out.lower() or server not in self.servers():
                    return
                raise LoadBalancerError(f"HAProxy would not delete {self.backend}/{server}: {out[:300]}")
            time.sleep(0.2)


def replace_server(lb: LoadBalancer, old: str, new: str, addr: str, *, health_path: str = "/health",
                   up_timeout_s: float = 120.0, drain_s: float = 600.0, poll_s: float = 0.2,
                   maxconn: int | None = None) -> dict[str, float]:
    """Move a backend from server `old` to a new server `new` at `addr` without downtime (a blue-green step):
    `new` joins at `old`'s weight and must pass the health check within `up_timeout_s` (else it leaves again
    and `old` keeps the traffic: LoadBalancerError); then `old` gets weight 0 (no new requests: they all go to
    `new`), finishes the requests it holds (up to `drain_s`) and leaves. `maxconn`: the most requests `new`
    holds at once (LoadBalancer.set_maxconn; an engine's batch size): when `old` had a limit too, the requests
    waiting in the balancer's queue go to `new` the moment it takes the traffic, not through `old`'s backlog.
    Returns the seconds each step took (`up_s`: until `new` was UP, the moment traffic moved; `drain_s`: until
    `old`'s last request ended)."""
    t0 = time.monotonic()
    servers = lb.servers()
    if old not in servers:
        raise LoadBalancerError(f"backend {lb.backend!r} has no server {old!r} to replace")
    lb.add_server(new, addr, weight=max(1, servers[old].weight), health_path=health_path, maxconn=maxconn)
    deadline = time.monotonic() + up_timeout_s
    while not ((s := lb.servers().get(new)) is not None and s.checked_up):
        if time.monotonic() >= deadline:
            lb.remove_server(new)
            raise LoadBalancerError(f"{new} at {addr} did not pass {lb.backend!r}'s health check within "
                                    f"{up_timeout_s:.0f}s; {old} keeps the traffic")
        time.sleep(poll_s)
    lb.set_weight(old, 0)
    up_s = time.monotonic() - t0
    deadline = time.monotonic() + drain_s
    while (s := lb.servers().get(old)) is not None and s.sessions > 0 and time.monotonic() < deadline:
        time.sleep(poll_s)
    lb.remove_server(old)
    return {"up_s": up_s, "drain_s": time.monotonic() - t0 - up_s}


def load_balancer(spec: object, agent_dir: Path) -> LoadBalancer:
    """The LoadBalancer a `rollout.load_balancer` section names (a relative socket path: from the agent file)."""
    from tuner.spec import LoadBalancerSpec

    assert isinstance(spec, LoadBalancerSpec)
    addr = spec.socket
    host, sep, port = addr.rpartition(":")
    if not (sep and port.isdigit() and "/" not in addr) and not Path(addr).is_absolute():
        addr = str(agent_dir / addr)
    return HAProxy(addr, spec.backend)
