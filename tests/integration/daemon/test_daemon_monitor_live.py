"""`tuner daemon` with `watch.monitor` against a live server, end to end. The reference engine serves traffic
from `tuner bench`: open-loop Poisson arrivals, or a closed loop of 2 users who send the next request when the last
is answered (its request rate is the server's answer: MonitorConfig.paced_rate). The daemon scrapes the server's
/metrics once a second and learns its normal; the server is then slowed from outside at the same load (its process
stopped half of every 100 ms: experiments/detection/freeze.py, as a throttled GPU or a noisy neighbour the guest
cannot see), and the daemon calls it a performance anomaly, not a drift, and "back to normal" once the server runs
freely again. The events are in the agent's events file, MLflow (a `monitor_event` run), the daemon's /metrics
and `tuner history`.

Nothing is asserted of the windows before the slowdown (a busy CI host may slow the server by itself; the monitor
corrects the latencies for the server's CPU wait, read from its threads' schedstat); the slowdown is twice the
issue's +30 %, so it stands out of any host's noise."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.engine.test_engine_server import _free_port, start_server, wait_ready
from tests.support.agents import write_agent
from tests.support.logged_proc import finish, start_logged, stop_all, wait_while_running
from tuner.measure.scrape import fetch
from tuner.monitor.records import read_events
from tuner.tracking.tracker import Tracker, default_tracking_uri

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "experiments" / "detection"))

from freeze import Freezer  # noqa: E402

pytestmark = [pytest.mark.process, pytest.mark.slow, pytest.mark.timeout(900)]

SCHEDSTAT = Path("/proc/self/schedstat").exists()


def daemon_metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def gauge(text: str, prefix: str) -> float | None:
    """The value of the first /metrics line that starts with `prefix` (None: no such line)."""
    return next((float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix)), None)


@dataclass
class Live:
    """A reference-engine server under `tuner bench` traffic and `tuner daemon` watching it (see live())."""

    server: subprocess.Popen[bytes]
    base: str
    agent: Path
    state: Path
    port: int
    log: Path
    daemon: subprocess.Popen[str]
    procs: list[subprocess.Popen[str]]
    bench: Callable[[], subprocess.Popen[str]]

    def events(self) -> list[dict]:
        return read_events(self.state, "live")

    def wait_for(self, what: Callable[[], bool], timeout_s: float, doing: str) -> None:
        wait_while_running(what, self.procs, self.log, timeout_s, doing)

    def stop_daemon(self) -> tuple[str, str]:
        """SIGTERM to the daemon: its /metrics just before, and its whole log."""
        text = daemon_metrics(self.port)
        self.daemon.send_signal(signal.SIGTERM)
        return text, finish(self.daemon, self.log, 120)


@contextmanager
def live(tmp_path: Path, server_args: list[str], load: list[str]) -> Iterator[Live]:
    """The server started with `server_args`, a bench of `load` on it (Live.bench starts another), the daemon
    watching it every second with `watch.monitor` (15 learning windows, the server's CPU wait read from its
    threads, on_anomaly: reverify, which with no champion is an alert; MLflow in the state dir), entered once the
    monitor's baseline is learnt and no anomaly is open; everything stopped at the end."""
    server, base, _ = start_server(tmp_path, "--batching", "continuous", "--max-model-len", "128",
                                   "--kv-pool-mb", "16", *server_args)
    sd = tmp_path / "state"
    port = _free_port()
    monitor: dict[str, object] = {"learn_windows": 15}
    if SCHEDSTAT:
        monitor["cpu_wait_source"] = f"pid:{server.pid}"
    agent = write_agent(tmp_path / "live.yaml", name="live", tracking={"enabled": True},
                        schedule={"every": "24h", "trials_per_cycle": 1},
                        watch={"url": base + "/metrics", "interval_s": 1.0, "window_s": 10, "monitor": monitor},
                        at={"workload.num_requests": 20, "workload.prompt_tokens.value": 16,
                            "workload.output_tokens.value": 24})  # the traffic's lengths: no legacy drift
    log = tmp_path / "daemon.log"
    procs: list[subprocess.Popen[str]] = []

    def bench() -> subprocess.Popen[str]:
        p = start_logged([sys.executable, "-m", "tuner.cli", "bench", "--url", base, *load, "--prompt-tokens",
                          "16", "--output-tokens", "24", "--duration-s", "800", "--timeout-s", "60"],
                         tmp_path / f"bench-{len(procs)}.log", REPO)
        procs.append(p)
        return p

    try:
        wait_ready(server, base)
        bench()
        daemon = start_logged([sys.executable, "-m", "tuner.cli", "daemon", str(agent), "--state-dir", str(sd),
                               "--port", str(port)], log, REPO)
        procs.append(daemon)

        def calm_baseline() -> bool:  # learnt (its ITL-mean test has a size) and no anomaly open
            try:
                text = daemon_metrics(port)
            except OSError:
                return False
            found_in = gauge(text, 'tuner_monitor_slowdown_windows{agent="live"}')
            opened = [line for line in text.splitlines()
                      if line.startswith('tuner_monitor_open{agent="live"') and not line.endswith(" 0.0")]
            return found_in is not None and found_in == found_in and not opened  # (NaN != NaN: not learnt)

        wait_while_running(calm_baseline, procs, log, 300, "waiting for the monitor's baseline")
        yield Live(server, base, agent, sd, port, log, daemon, procs, bench)
    finally:
        stop_all(procs, server)


# the slowdown held this long after its anomaly (windows of 1 s), the server's finished rate read over it and over
# as long before: a closed loop's rate falls by half, in a window or two (later than the ITL mean's alarm on a
# busy host, its rate's scale wider), and must not be taken for a drift
SLOWED_AFTER_S = 6.0
# the traffic's loop: bench's arguments, and whether its rate is the server's answer (a closed loop)
LOOPS = {"open": (["--rate", "8"], False), "closed": (["--concurrency", "2"], True)}


def finished_per_s(base: str, seconds: float) -> float:
    """The server's finished requests a second over the next `seconds` (its /metrics counter)."""
    before = fetch(base + "/metrics").counters.get("request_success", 0.0)
    time.sleep(seconds)
    return (fetch(base + "/metrics").counters.get("request_success", 0.0) - before) / seconds


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_the_daemon_finds_a_live_servers_slowdown_an_anomaly_and_its_recovery(tmp_path: Path, loop: str) -> None:
    load, closed = LOOPS[loop]
    with live(tmp_path, ["--max-batch-size", "16"], load) as lv:
        rate_before = finished_per_s(lv.base, SLOWED_AFTER_S)
        events_before = lv.events()
        with Freezer([lv.server.pid], slowdown_frac=1.0):  # every piece of the server's work twice as long
            # (60 s was once too short with two replays beside pytest on the 2 cores: a busier host's wider scale)
            lv.wait_for(lambda: any(e["kind"] == "anomaly" for e in lv.events()[len(events_before):]), 120,
                        "waiting for the slowdown's anomaly")
            rate_slowed = finished_per_s(lv.base, SLOWED_AFTER_S)
        lv.wait_for(lambda: any(e["kind"] == "recovery" for e in lv.events()[len(events_before):]), 120,
                    "waiting for the recovery")
        text, out = lv.stop_daemon()
        sd, agent = lv.state, lv.agent
    new = read_events(sd, "live")[len(events_before):]
    kinds = [e["kind"] for e in new]
    anomaly = next(e for e in new if e["kind"] == "anomaly")
    # a slower server at the same load: no drift of its inputs came first, and the latencies say so
    assert "drift" not in kinds[:kinds.index("anomaly")], new
    # its latencies up (the ITL mean's, or on a busy host, whose ITL mean wanders more, its p90s' first)
    assert anomaly["cause"] == "latency", anomaly
    assert any(x["value"] > 1.3 * x["baseline"] for x in anomaly["signals"].values() if x.get("baseline")), anomaly
    # no drift while it was slowed: a closed loop's rate, the server's answer, fell with its speed (the line says
    # why where it had fallen in the anomaly's own window; a busy host's wider rate scale may take one more)
    slowed = kinds[:kinds.index("recovery")] if "recovery" in kinds else kinds
    assert "drift" not in slowed, new
    if closed:
        # the rate fell: two users with no think time finish 2 / E2E a second, and the latencies rose by more than
        # x1.3 (above). Not by half: the freezer doubles the server's work on an idle host, but on a busy one its
        # closed loop's clients, idle while it is stopped, leave it more CPU when it runs (x1.28 in a CI run with
        # two workers); a closed loop's finished counts vary little, a fall of a tenth is beyond them
        assert rate_slowed < rate_before / 1.1, (rate_before, rate_slowed)
    else:
        assert "closed loop" not in anomaly["detail"], anomaly["detail"]
    assert anomaly["response"]["action"] == "alert" and "no champion" in anomaly["response"]["reason"]
    recovery = next(e for e in new if e["kind"] == "recovery")
    assert recovery["cause"] == "anomaly" and recovery["time"] > anomaly["time"]

    assert 'tuner_monitor_events_total{agent="live",cause="latency",kind="anomaly"}' in text
    assert gauge(text, 'tuner_monitor_events_total{agent="live",cause="latency",kind="anomaly"}') >= 1
    assert gauge(text, 'tuner_monitor_open{agent="live",cause="latency",kind="anomaly"}') == 0.0  # recovered
    assert "anomaly" in out  # the log line

    hist = subprocess.run([sys.executable, "-m", "tuner.cli", "history", str(agent), "--state-dir", str(sd),
                           "--json"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert hist.returncode == 0, hist.stderr
    listed = [(e["kind"], e["time"]) for e in json.loads(hist.stdout)["events"]]
    assert ("anomaly", anomaly["time"]) in listed and ("recovery", recovery["time"]) in listed

    tracker = Tracker(default_tracking_uri(sd), "live", artifact_dir=sd / "mlartifacts")
    runs = tracker.runs("tags.kind = 'monitor_event'")
    assert {"anomaly", "recovery"} <= {r.data.tags["event"] for r in runs}


def test_users_added_to_a_closed_loop_at_capacity_are_a_drift_that_starts_a_cycle(tmp_path: Path) -> None:
    """The server runs 2 requests at once and 2 users keep it busy; 2 more users join: the rate stays, the added
    requests wait, every request's TTFT grows by the wait at the same speed per token. The daemon calls it a drift
    (the load moved: MonitorConfig.queued_load) and starts a cycle on the observed traffic. The new users' client
    starting on this small host may slow the server for a window or two first: an anomaly then, which the drift
    names as this load once the queue settles."""
    with live(tmp_path, ["--max-batch-size", "2"], ["--concurrency", "2"]) as lv:
        events_before = lv.events()
        cycles = lv.state / "live" / "cycles.jsonl"
        ran = len(cycles.read_text().splitlines()) if cycles.is_file() else 0
        lv.bench()  # the users doubled
        # the drift waits for a window whose ITL mean and finished rate are each within their CUSUM's allowance
        # (the speed per token unchanged): a CI neighbour that slowed the server after its baseline was learnt
        # holds them beyond it (ITL z 1.6-2.6, finished z -1.4 to -2.0 for the windows around the users' arrival
        # with two CPU burners started after the baseline), an anomaly meanwhile; once the neighbour's load
        # passes the queue is named. Seen: no drift within 60 s in one full CI run of two workers
        lv.wait_for(lambda: any(e["kind"] == "drift" for e in lv.events()[len(events_before):]), 240,
                    "waiting for the users' drift")
        lv.wait_for(lambda: cycles.is_file() and len(cycles.read_text().splitlines()) > ran, 300,
                    "waiting for the cycle the drift starts")
        _, out = lv.stop_daemon()
    new = [e for e in lv.events()[len(events_before):] if e["kind"] != "recovery"]
    at = next(i for i, e in enumerate(new) if e["kind"] == "drift")
    drift = new[at]
    assert drift["signals"]["in_server_mean"]["direction"] == "up", drift
    assert "users grew at its capacity" in drift["detail"], drift["detail"]
    assert drift["observed"]["in_server_mean"] > 3, drift["observed"]  # 4 users in the server
    before = [(e["kind"], e["cause"]) for e in new[:at]]
    assert set(before) <= {("anomaly", "latency")}, new  # only the latencies' anomaly, the neighbour's or the queue's
    every = lv.events()[len(events_before):]
    prior = [e["kind"] for e in every[:every.index(drift)] if e["cause"] in ("latency", "anomaly")]
    if prior and prior[-1] == "anomaly":  # open when the queue was named
        assert "the latency anomaly open since was this load" in drift["detail"], drift["detail"]
    assert "workload drift" in out
