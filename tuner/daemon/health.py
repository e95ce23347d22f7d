"""The daemon's heartbeat file, its /health and /metrics endpoint, and `tuner check`."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

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


def serve_endpoint(rt: Runtime, port: int) -> ThreadingHTTPServer:
    """/health (JSON; 200 when the last cycles did not fail, else 503) and /metrics on 127.0.0.1."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server API
            if self.path.startswith("/metrics"):
                body = rt.metrics.render()
                self._send(200, body, "text/plain; version=0.0.4; charset=utf-8")
            elif self.path.startswith("/health"):
                snap = rt.snapshot()
                self._send(200 if snap["healthy"] else 503, json.dumps(snap).encode(), "application/json")
            else:
                self._send(404, b"not found\n", "text/plain")

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server API
            log.debug("endpoint: " + format, *args)

    srv = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, name="tuner-endpoint", daemon=True).start()
    return srv


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
