"""The daemon's heartbeat file, its /health and /metrics endpoint, and `tuner check`."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from aiohttp import web

from tuner.base.files import atomic_write
from tuner.base.redact import redact_text
from tuner.daemon.runtime import HEARTBEAT_INTERVAL_S, Runtime
from tuner.promotion.audit import champion_summary

log = logging.getLogger(__name__)


def heartbeat_path(state_dir: Path) -> Path:
    """Where the daemon writes its heartbeat (made by the writer: `tuner check` reads and creates nothing)."""
    return Path(state_dir) / "daemon" / "heartbeat.json"


def write_heartbeat(rt: Runtime, **extra: Any) -> None:
    try:
        atomic_write(heartbeat_path(rt.state_dir), json.dumps({**rt.snapshot(), **extra}, default=str))
    except OSError as exc:
        log.warning("cannot write the heartbeat: %s", exc)


def heartbeat_loop(rt: Runtime, done: threading.Event) -> None:
    """Every HEARTBEAT_INTERVAL_S until `done`: refresh the champions' ages and write the heartbeat."""
    while not done.wait(HEARTBEAT_INTERVAL_S):
        for name in rt.agents:
            try:
                champ = champion_summary(rt.state_dir, name)
            except Exception:  # noqa: BLE001 - a torn read never stops the heartbeat
                champ = None
            if champ is not None:
                rt.metrics.champion_age.labels(name).set(champ["age_s"])
        write_heartbeat(rt)


ENDPOINT_TIMEOUT_S = 10.0  # a connection that has not sent a whole request this long after it opened (or after
#                            its last answer) is closed: idle sockets and slow header writers alike
ENDPOINT_MAX_CONNECTIONS = 512  # open connections beyond this are closed as soon as they are accepted


class _Refused(asyncio.Protocol):
    """A connection over the cap: closed at once, before it costs anything."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.Transport, transport).abort()


class Endpoint:
    """/health (JSON; 200 when the last cycles did not fail, else 503) and /metrics on 127.0.0.1.

    One asyncio loop in one thread (aiohttp's low-level server) serves every connection, so a connection costs
    a socket, never a thread; each is closed after `timeout_s` without a whole request (aiohttp's keep-alive
    timer runs from the moment a connection opens); connections beyond `max_connections` are closed on accept."""

    def __init__(self, rt: Runtime, port: int, *, timeout_s: float = ENDPOINT_TIMEOUT_S,
                 max_connections: int = ENDPOINT_MAX_CONNECTIONS) -> None:
        self._rt, self._max = rt, max_connections
        self._loop = asyncio.new_event_loop()
        self._listener = self._loop.run_until_complete(self._listen(port, timeout_s))
        self.port: int = self._listener.sockets[0].getsockname()[1]
        self._thread = threading.Thread(target=self._loop.run_forever, name="tuner-endpoint", daemon=True)
        self._thread.start()

    async def _listen(self, port: int, timeout_s: float) -> asyncio.Server:
        self._server = web.Server(self._handle, keepalive_timeout=timeout_s, access_log=None)
        factory = cast(Callable[[], asyncio.Protocol], self._protocol)
        return await self._loop.create_server(factory, "127.0.0.1", port, reuse_address=True)

    @property
    def server_address(self) -> tuple[str, int]:
        return "127.0.0.1", self.port

    def _protocol(self) -> asyncio.BaseProtocol:
        if len(self._server.connections) >= self._max:
            return _Refused()
        return self._server()

    async def _handle(self, request: web.BaseRequest) -> web.Response:
        if request.method not in ("GET", "HEAD"):
            return web.Response(status=405, text="method not allowed\n", headers={"Allow": "GET, HEAD"})
        if request.path.startswith("/metrics"):
            return web.Response(body=self._rt.metrics.render(),
                                headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})
        if request.path.startswith("/health"):
            snap = self._rt.snapshot()
            return web.Response(status=200 if snap["healthy"] else 503, body=json.dumps(snap).encode(),
                                content_type="application/json")
        return web.Response(status=404, text="not found\n")

    def connections(self) -> int:
        """Connections open now (read from the loop's thread)."""
        return asyncio.run_coroutine_threadsafe(self._count(), self._loop).result(timeout=10)

    async def _count(self) -> int:
        return len(self._server.connections)

    def shutdown(self) -> None:
        """Stop listening, close every connection, end the loop's thread."""
        async def stop() -> None:
            self._listener.close()
            await self._server.shutdown(1.0)

        if self._loop.is_closed():
            return
        try:
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=10)
        except Exception as exc:  # noqa: BLE001 - a slow close never keeps the daemon from stopping
            log.debug("endpoint shutdown: %s", exc)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()


def serve_endpoint(rt: Runtime, port: int, **limits: Any) -> Endpoint:
    """Start the daemon's /health and /metrics endpoint (see Endpoint) in the background."""
    return Endpoint(rt, port, **limits)


def _daemon_gone(snap: dict[str, Any]) -> str | None:
    """Why the heartbeat's daemon is not running, if this host can tell (its PID gone, or reused by another
    process since); None when it runs or ran on another host."""
    from tuner.base.proc import pid_alive, process_start_ticks

    pid = snap.get("pid")
    if not isinstance(pid, int) or snap.get("host", socket.gethostname()) != socket.gethostname():
        return None
    if not pid_alive(pid):
        age_s = time.time() - float(snap.get("time", 0))
        return f"daemon pid {pid} is not running (killed?); its last heartbeat is {age_s:.0f}s old"
    ticks = snap.get("pid_start_ticks")
    if ticks is not None and process_start_ticks(pid) != ticks:
        return f"daemon pid {pid} is not running (the PID now belongs to another process)"
    return None


def check_alive(*, url: str | None = None, state_dir: Path | None = None,
                max_age_s: float | None = None) -> tuple[bool, str]:
    """Is the daemon alive and did its last cycle(s) succeed? (ok, one-line reason)."""
    if url is not None:
        health = url.rstrip("/")
        if not health.endswith("/health"):
            health += "/health"
        try:
            with urllib.request.urlopen(health, timeout=5) as r:
                snap = json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as exc:
            return False, f"{health} answered {exc.code}: the last cycle failed"
        except (OSError, ValueError) as exc:
            return False, redact_text(f"{health} does not answer: {exc}")
        return True, f"daemon pid {snap.get('pid')} healthy"
    hb = heartbeat_path(Path(state_dir or "."))
    if not hb.is_file():
        return False, f"no heartbeat at {hb}"
    try:
        snap = json.loads(hb.read_text())
    except (OSError, ValueError) as exc:
        return False, f"unreadable heartbeat {hb}: {exc}"
    age = time.time() - float(snap.get("time", 0))
    limit = max_age_s if max_age_s is not None else 3 * float(snap.get("interval_s", HEARTBEAT_INTERVAL_S)) + 5
    if snap.get("stopped"):
        return False, f"daemon pid {snap.get('pid')} stopped"
    gone = _daemon_gone(snap)
    if gone:
        return False, gone
    if age > limit:
        return False, f"heartbeat is {age:.0f}s old (limit {limit:.0f}s)"
    failed = [f"{n}: {a.get('last_error')}" for n, a in snap.get("agents", {}).items() if a.get("last_ok") is False]
    if failed:
        return False, "last cycle failed: " + "; ".join(failed)
    return True, f"daemon pid {snap.get('pid')} alive, heartbeat {age:.0f}s old"
