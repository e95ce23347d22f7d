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
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.engine.test_engine_server import _free_port, start_server, wait_ready
from tests.support.agents import write_agent
from tests.support.logged_proc import finish, output, start_logged
from tuner.monitor.records import read_events
from tuner.tracking.tracker import Tracker, default_tracking_uri

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "experiments" / "detection"))

from freeze import Freezer  # noqa: E402

pytestmark = [pytest.mark.process, pytest.mark.slow, pytest.mark.timeout(900)]

SCHEDSTAT = Path("/proc/self/schedstat").exists()


def wait_for(what: Callable[[], bool], procs: list[subprocess.Popen[str]], log: Path, timeout_s: float,
             doing: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for p in procs:
            assert p.poll() is None, f"{p.args[:4]} exited while {doing}: {output(log)}"
        if what():
            return
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout_s:.0f} s {doing}: {output(log)}")


def daemon_metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def gauge(text: str, prefix: str) -> float | None:
    """The value of the first /metrics line that starts with `prefix` (None: no such line)."""
    return next((float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix)), None)


# the traffic's loop: bench's arguments, and what the anomaly's line says of the request rate
LOOPS = {"open": (["--rate", "8"], None),
         "closed": (["--concurrency", "2"], "a closed loop answered more slowly")}


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_the_daemon_finds_a_live_servers_slowdown_an_anomaly_and_its_recovery(tmp_path: Path, loop: str) -> None:
    load, paced = LOOPS[loop]
    server, base, _ = start_server(tmp_path, "--batching", "continuous", "--max-batch-size", "16",
                                   "--max-model-len", "128", "--kv-pool-mb", "16")
    sd = tmp_path / "state"
    port = _free_port()
    monitor: dict[str, object] = {"learn_windows": 10}  # on_anomaly: reverify (no champion: an alert)
    if SCHEDSTAT:
        monitor["cpu_wait_source"] = f"pid:{server.pid}"
    agent = write_agent(tmp_path / "live.yaml", name="live", tracking={"enabled": True},
                        schedule={"every": "24h", "trials_per_cycle": 1},
                        watch={"url": base + "/metrics", "interval_s": 1.0, "window_s": 10, "monitor": monitor},
                        at={"workload.num_requests": 20})
    log = tmp_path / "daemon.log"
    traffic_log = tmp_path / "bench.log"
    procs: list[subprocess.Popen[str]] = []
    events_before: list[dict] = []
    try:
        wait_ready(server, base)
        procs.append(start_logged([sys.executable, "-m", "tuner.cli", "bench", "--url", base, *load,
                                   "--prompt-tokens", "16", "--output-tokens", "24", "--duration-s", "800",
                                   "--timeout-s", "60"], traffic_log, REPO))
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

        wait_for(calm_baseline, procs, log, 300, "waiting for the monitor's baseline")
        events_before = read_events(sd, "live")
        with Freezer([server.pid], slowdown_frac=1.0):  # every piece of the server's work twice as long
            wait_for(lambda: any(e["kind"] == "anomaly" for e in read_events(sd, "live")[len(events_before):]),
                     procs, log, 60, "waiting for the slowdown's anomaly")
        wait_for(lambda: any(e["kind"] == "recovery" for e in read_events(sd, "live")[len(events_before):]),
                 procs, log, 120, "waiting for the recovery")
        text = daemon_metrics(port)
        daemon.send_signal(signal.SIGTERM)
        out = finish(daemon, log, 120)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        server.terminate()
        server.wait(10)
    new = read_events(sd, "live")[len(events_before):]
    kinds = [e["kind"] for e in new]
    anomaly = next(e for e in new if e["kind"] == "anomaly")
    # a slower server at the same load: no drift of its inputs came first, and the latencies say so
    assert "drift" not in kinds[:kinds.index("anomaly")], new
    assert anomaly["cause"] == "latency" and "itl_ms_mean" in anomaly["signals"], anomaly
    assert anomaly["signals"]["itl_ms_mean"]["value"] > 1.3 * anomaly["signals"]["itl_ms_mean"]["baseline"]
    if paced is None:
        assert "closed loop" not in anomaly["detail"], anomaly["detail"]
    else:  # its rate fell with the server's speed: no drift, and the line says why
        assert paced in anomaly["detail"], anomaly["detail"]
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
