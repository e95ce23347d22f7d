"""The HAProxy adapter against a real HAProxy: servers and their health from `show stat`, weights that move
the traffic share without a reload, a server added and removed at run time, refusals as errors."""

from __future__ import annotations

import collections
import csv
import io
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.support.haproxy import running_haproxy
from tuner.rollout.lb import HAProxy, LoadBalancerError, replace_server

pytestmark = pytest.mark.process


class _Origin:
    """A plain HTTP origin that answers its own name (and /health 200 while healthy)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.healthy = True
        self.slow_s = 0.0  # how long a request off /health takes
        origin = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                ok = origin.healthy or self.path != "/health"
                if self.path != "/health":
                    time.sleep(origin.slow_s)
                body = origin.name.encode()
                self.send_response(200 if ok else 503)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.addr = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def origins() -> Iterator[dict[str, _Origin]]:
    out = {n: _Origin(n) for n in ("stable0", "other")}
    yield out
    for o in out.values():
        o.close()


def _spread(url: str, n: int) -> collections.Counter[str]:
    got: collections.Counter[str] = collections.Counter()
    for _ in range(n):
        with urllib.request.urlopen(url + "/v1/x", timeout=10) as r:
            got[r.read().decode()] += 1
    return got


def _ask(url: str, answers: list[str], failed: list[str], *, timeout_s: float) -> None:
    """One request through the balancer: its answer (the origin's name), or the error."""
    try:
        with urllib.request.urlopen(url + "/v1/x", timeout=timeout_s) as r:
            answers.append(r.read().decode())
    except OSError as exc:
        failed.append(str(exc))


def _wait(cond, timeout_s: float = 30.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.2)


def test_weights_add_remove_and_health(tmp_path: Path, origins: dict[str, _Origin]) -> None:
    with running_haproxy(tmp_path / "hx", {"stable0": origins["stable0"].addr}) as bal:
        lb = HAProxy(bal.socket, bal.backend)
        _wait(lambda: lb.servers()["stable0"].up)
        s = lb.servers()["stable0"]
        assert (s.addr, s.weight) == (origins["stable0"].addr, 100)

        lb.add_server("canary", origins["other"].addr, weight=0, health_path="/health")
        _wait(lambda: lb.servers()["canary"].up)
        assert lb.servers()["canary"].weight == 0
        assert _spread(bal.url, 20) == {"stable0": 20}  # weight 0: no traffic

        lb.set_weight("canary", 100)  # half the traffic, no reload
        got = _spread(bal.url, 40)
        assert 18 <= got["other"] <= 22 and sum(got.values()) == 40  # round robin by weight
        before = lb.servers()["canary"].requests
        lb.set_weight("canary", 25)  # 25 / 125 = a fifth
        got = _spread(bal.url, 50)
        assert 8 <= got["other"] <= 12
        assert lb.servers()["canary"].requests - before == got["other"]  # HAProxy's own count (stot) agrees

        origins["other"].healthy = False  # the health check takes it out of service
        _wait(lambda: not lb.servers()["canary"].up)
        assert _spread(bal.url, 10) == {"stable0": 10}

        lb.remove_server("canary")
        assert "canary" not in lb.servers()
        lb.remove_server("canary")  # idempotent

        with pytest.raises(LoadBalancerError, match="refused"):
            lb.set_weight("nosuch", 5)
        with pytest.raises(LoadBalancerError, match="no backend"):
            HAProxy(bal.socket, "nosuch").servers()
    with pytest.raises(LoadBalancerError, match="cannot reach"):
        lb.servers()


def test_a_server_is_replaced_without_a_failed_request(tmp_path: Path, origins: dict[str, _Origin]) -> None:
    """replace_server: requests in flight on the old server finish there, every new one goes to the new server,
    none fails; a new server that never passes its health check leaves and the old one keeps the traffic."""
    origins["stable0"].slow_s = 1.5
    with running_haproxy(tmp_path / "hx", {"stable0": origins["stable0"].addr}) as bal:
        lb = HAProxy(bal.socket, bal.backend)
        _wait(lambda: lb.servers()["stable0"].up)
        answers: list[tuple[float, str]] = []  # (when its request was sent, the origin that answered it)
        failed: list[str] = []
        stop = threading.Event()

        def client() -> None:
            while not stop.is_set():
                sent_s, got = time.monotonic(), []
                _ask(bal.url, got, failed, timeout_s=30)
                answers.extend((sent_s, a) for a in got)

        threads = [threading.Thread(target=client, daemon=True) for _ in range(4)]
        for t in threads:
            t.start()
        _wait(lambda: len(answers) >= 4)
        steps = replace_server(lb, "stable0", "green", origins["other"].addr, up_timeout_s=30, drain_s=30)
        assert set(lb.servers()) == {"green"} and steps["drain_s"] > 0  # the old one finished its requests
        replaced_s = time.monotonic()
        # judged by when each request was sent, not by when its thread got to note the answer (a busy host may
        # note an answer the old server gave before the swap after it)
        _wait(lambda: sum(sent_s > replaced_s for sent_s, _ in answers) >= 8)
        stop.set()
        for t in threads:
            t.join(timeout=30)
        assert failed == []
        assert {a for sent_s, a in answers if sent_s > replaced_s} == {"other"}
        assert min(answers)[1] == "stable0"

        origins["stable0"].healthy = False
        with pytest.raises(LoadBalancerError, match="health check"):
            replace_server(lb, "green", "blue", origins["stable0"].addr, up_timeout_s=3)
        assert set(lb.servers()) == {"green"} and lb.servers()["green"].weight == 100
        with pytest.raises(LoadBalancerError, match="no server"):
            replace_server(lb, "nosuch", "x", origins["other"].addr)


def _backend_queue(lb: HAProxy) -> int:
    """Requests waiting in the backend's queue (show stat's qcur of the backend and its servers)."""
    text = lb.command("show stat")
    rows = csv.DictReader(io.StringIO(text[2:]))
    return sum(int(r.get("qcur") or 0) for r in rows if r.get("pxname") == lb.backend)


def test_a_replacement_takes_the_balancers_queue_over(tmp_path: Path, origins: dict[str, _Origin]) -> None:
    """With a per-server limit the requests beyond it wait in HAProxy's queue, not in the old server's backlog:
    when a replacement takes the traffic, the waiting requests go to it at once."""
    origins["stable0"].slow_s = 3.0
    with running_haproxy(tmp_path / "hx", {"stable0": origins["stable0"].addr}) as bal:
        lb = HAProxy(bal.socket, bal.backend)
        _wait(lambda: lb.servers()["stable0"].up)
        lb.set_maxconn("stable0", 1)
        with pytest.raises(ValueError):
            lb.set_maxconn("stable0", -1)
        with pytest.raises(LoadBalancerError):
            lb.set_maxconn("nosuch", 1)
        answers: list[str] = []
        failed: list[str] = []

        threads = [threading.Thread(target=_ask, args=(bal.url, answers, failed), kwargs={"timeout_s": 60},
                                    daemon=True) for _ in range(4)]
        for t in threads:
            t.start()
        _wait(lambda: lb.servers()["stable0"].sessions == 1 and _backend_queue(lb) == 3)
        replace_server(lb, "stable0", "green", origins["other"].addr, up_timeout_s=30, drain_s=30, maxconn=4)
        for t in threads:
            t.join(timeout=60)
        assert failed == []
        # the one request stable0 held, the three that waited in the balancer went to the replacement
        assert sorted(answers) == ["other", "other", "other", "stable0"]
