"""The daemon's /health and /metrics endpoint stays bounded under idle, slow and too many connections (issue 30)."""

from __future__ import annotations

import json
import resource
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tuner.daemon.health import Endpoint, serve_endpoint
from tuner.daemon.metrics import DaemonMetrics
from tuner.daemon.runtime import Runtime

WAIT_S = 60.0  # generous: how long a test waits for something that should happen in well under a second


def _runtime(tmp_path: Path) -> Runtime:
    return Runtime(state_dir=tmp_path, stop=threading.Event(), agents={}, locks={}, metrics=DaemonMetrics(),
                   grace_s=1.0)


@contextmanager
def _endpoint(tmp_path: Path, **limits: float) -> Iterator[Endpoint]:
    srv = serve_endpoint(_runtime(tmp_path), 0, **limits)
    try:
        yield srv
    finally:
        srv.shutdown()


def _health(port: int) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=WAIT_S) as r:
        assert r.status == 200
        return dict(json.loads(r.read()))


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    return s


def _closed_by_server(s: socket.socket) -> bool:
    """Wait (bounded) for the server to close `s`: True when it did, False when it still held it open."""
    s.settimeout(WAIT_S)
    try:
        return s.recv(1024) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def _wait_for(cond: object, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_hundreds_of_idle_sockets_cost_no_thread_and_health_still_answers(tmp_path: Path) -> None:
    n_idle = 300
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * n_idle + 200  # both ends live in this process
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.skip(f"needs {need} file descriptors, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    with _endpoint(tmp_path, timeout_s=WAIT_S) as srv:
        _health(srv.port)
        threads_before = threading.active_count()
        idle = [_connect(srv.port) for _ in range(n_idle)]
        try:
            _wait_for(lambda: srv.connections() >= n_idle, f"the endpoint never held the {n_idle} connections")
            assert threading.active_count() <= threads_before + 2, "a thread per connection"
            assert _health(srv.port)["healthy"] is True
            body = urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/metrics", timeout=WAIT_S).read()
            assert b"# TYPE" in body
        finally:
            for s in idle:
                s.close()
        _wait_for(lambda: srv.connections() == 0, "closed client sockets were kept")
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_silent_or_slow_header_writer_is_closed_after_the_timeout(tmp_path: Path) -> None:
    with _endpoint(tmp_path, timeout_s=1.0) as srv:
        silent = _connect(srv.port)
        assert _closed_by_server(silent), "an idle connection was never closed"
        slow = _connect(srv.port)
        slow.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        deadline = time.monotonic() + WAIT_S
        closed = False
        while time.monotonic() < deadline and not closed:
            try:
                slow.sendall(b"X")  # one byte of a header that never ends, every 0.2 s
            except OSError:
                closed = True
                break
            slow.settimeout(0.2)
            try:
                closed = slow.recv(1024) == b""
            except TimeoutError:
                pass
            except ConnectionResetError:
                closed = True
        assert closed, "a connection trickling its headers was held open for ever"
        assert _health(srv.port)["healthy"] is True
        silent.close()
        slow.close()


def test_connections_over_the_cap_are_closed_and_the_endpoint_recovers(tmp_path: Path) -> None:
    cap = 20
    with _endpoint(tmp_path, timeout_s=WAIT_S, max_connections=cap) as srv:
        held = [_connect(srv.port) for _ in range(cap)]
        _wait_for(lambda: srv.connections() == cap, "the endpoint did not hold the connections")
        extra = _connect(srv.port)
        assert _closed_by_server(extra), "a connection over the cap was kept"
        assert srv.connections() == cap
        for s in held:
            s.close()
        _wait_for(lambda: srv.connections() == 0, "closed client sockets were kept")
        assert _health(srv.port)["healthy"] is True
        extra.close()
