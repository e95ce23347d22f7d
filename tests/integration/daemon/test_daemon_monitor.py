"""The monitor in the daemon (tuner.daemon.monitoring.MonitorFeed): scrapes in, events recorded (file, /metrics),
a drift triggers the agent's cycle, an anomaly is re-verified in the background (with no champion: an alert,
recorded as the event's answer), GPU telemetry read through NVML (a double) on every scrape."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import agents
from tests.support.nvml_double import ControlledNvml
from tests.support.vllm_series import VllmSeries
from tuner.agent import load_agent
from tuner.daemon.metrics import DaemonMetrics
from tuner.daemon.monitoring import MonitorFeed
from tuner.daemon.runtime import AgentState, Runtime, job_id
from tuner.errors import ConfigError
from tuner.measure.scrape import parse
from tuner.monitor.contention import titled
from tuner.monitor.hostspeed import shared
from tuner.monitor.records import read_events
from tuner.monitor.telemetry import NvmlTelemetry


class Scheduler:
    """Records the jobs asked to run now (the daemon's APScheduler is not needed for the feed's logic)."""

    def __init__(self) -> None:
        self.triggered: list[str] = []

    def modify_job(self, job: str, **kw: Any) -> None:
        self.triggered.append(job)


def test_the_feed_records_events_triggers_a_cycle_on_drift_and_answers_an_anomaly(tmp_path: Path) -> None:
    path = agents.write_agent(tmp_path / "mon.yaml", name="mon", tracking={"enabled": False},
                              watch={"url": "http://127.0.0.1:9/metrics", "interval_s": 15,
                                     "monitor": {"learn_windows": 10, "gpus": [0],
                                                 "cpu_wait_source": str(tmp_path / "cpu.pressure"),
                                                 "cpu_steal_source": str(tmp_path / "stat")}})
    spec = load_agent(path).spec
    (tmp_path / "cpu.pressure").write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=1000\n")  # no neighbour
    (tmp_path / "stat").write_text("cpu  500 0 100 9000 10 0 5 0 0 0\n")  # no hypervisor's neighbour either
    sd = tmp_path / "state"
    st = AgentState(name="mon", path=path)
    sched = Scheduler()
    rt = Runtime(state_dir=sd, stop=threading.Event(), agents={"mon": st}, locks={"mon": threading.Lock()},
                 metrics=DaemonMetrics(), grace_s=1.0, scheduler=sched)  # type: ignore[arg-type]
    feed = MonitorFeed(rt, st, spec)
    nv = ControlledNvml(noise_frac=0.005, seed=1)
    feed.nvml = NvmlTelemetry([0], nvml=nv)  # the host's NVML, a double here
    server = VllmSeries()
    rng = random.Random(5)
    kinds: list[str] = []
    for i in range(60):
        itl = 0.008 * (1.4 if 25 <= i < 40 else 1.0)  # a slowdown at the same load
        prompt = 100 if i < 45 else 300  # then the prompts triple: drift
        server.finish(rng.randint(55, 65), prompt, 16, itl_s=itl * rng.uniform(0.97, 1.03))
        kinds += [e.kind for e in feed.consume(1000.0 + 15 * i, parse(server.text()))]
        if feed.responding is not None:
            feed.responding.join(60)
    assert kinds[:2] == ["anomaly", "recovery"] and "drift" in kinds
    assert sched.triggered == [job_id("mon")]  # the drift, once
    stored = read_events(sd, "mon")
    assert [e["kind"] for e in stored] == kinds
    anomaly = stored[0]
    assert anomaly["response"]["action"] == "alert" and "no champion" in anomaly["response"]["reason"]
    assert feed.monitor.tracks["gpu_power_w"].baseline is not None  # NVML read on every scrape
    assert feed.monitor.tracks["cpu_wait_frac"].values == [0.0] * 59  # the CPU wait read on every scrape
    assert feed.monitor.tracks["cpu_steal_frac"].values == [0.0] * 59  # and the steal
    text = rt.metrics.render().decode()
    assert 'tuner_monitor_events_total{agent="mon",cause="inputs",kind="drift"} 1.0' in text
    assert 'tuner_monitor_unjudged_windows{agent="mon"} 0.0' in text  # no neighbour: every window judged
    # how soon the ITL mean's baseline lets the monitor find a slowdown of watch.monitor.slowdown_to_find_frac
    found_in = next(float(line.split()[-1]) for line in text.splitlines()
                    if line.startswith('tuner_monitor_slowdown_windows{agent="mon"}'))
    assert found_in == pytest.approx(feed.monitor.slowdown_windows()) and 0 < found_in < 12
    # and the smallest slowdown it finds within 12 windows: less than the one it finds that soon
    smallest = next(float(line.split()[-1]) for line in text.splitlines()
                    if line.startswith('tuner_monitor_detectable_slowdown_frac{agent="mon"}'))
    assert smallest == pytest.approx(feed.monitor.detectable_slowdown()) and 0 < smallest < 0.3


def test_the_watch_hands_its_scrapes_to_the_monitor(tmp_path: Path) -> None:
    from tuner.daemon.watch import consumers_for

    on = agents.write_agent(tmp_path / "on.yaml", name="on", watch={"url": "http://127.0.0.1:9/metrics",
                                                                    "monitor": {}})
    off = agents.write_agent(tmp_path / "off.yaml", name="off", watch={"url": "http://127.0.0.1:9/metrics"})
    rt = Runtime(state_dir=tmp_path / "state", stop=threading.Event(), agents={}, locks={}, metrics=DaemonMetrics(),
                 grace_s=1.0)
    feeds = consumers_for(rt, AgentState(name="on", path=on), load_agent(on).spec)
    assert any(isinstance(c, MonitorFeed) for c in feeds)
    assert not any(isinstance(c, MonitorFeed)
                   for c in consumers_for(rt, AgentState(name="off", path=off), load_agent(off).spec))


def test_an_anomaly_that_reopens_is_recorded_and_not_answered_again(tmp_path: Path) -> None:
    path = agents.write_agent(tmp_path / "mon.yaml", name="mon", tracking={"enabled": False},
                              watch={"url": "http://127.0.0.1:9/metrics", "interval_s": 15,
                                     "monitor": {"learn_windows": 10, "reopen_gap_s": 600}})
    spec = load_agent(path).spec
    sd = tmp_path / "state"
    st = AgentState(name="mon", path=path)
    rt = Runtime(state_dir=sd, stop=threading.Event(), agents={"mon": st}, locks={"mon": threading.Lock()},
                 metrics=DaemonMetrics(), grace_s=1.0, scheduler=Scheduler())  # type: ignore[arg-type]
    feed = MonitorFeed(rt, st, spec)
    server = VllmSeries()
    rng = random.Random(7)
    kinds: list[str] = []
    for i in range(70):
        itl = 0.008 * (1.4 if 25 <= i < 35 or 45 <= i < 55 else 1.0)  # slower, back for 2.5 minutes, slower
        server.finish(rng.randint(55, 65), 100, 16, itl_s=itl * rng.uniform(0.97, 1.03))
        kinds += [e.kind for e in feed.consume(1000.0 + 15 * i, parse(server.text()))]
        if feed.responding is not None:
            feed.responding.join(60)
    assert kinds == ["anomaly", "recovery", "anomaly", "recovery"]
    stored = read_events(sd, "mon")
    first, _, again, _ = stored
    assert not first["reopened"] and again["reopened"] and again["episode"] == first["episode"]
    assert "no champion" in first["response"]["reason"]  # the episode's answer, once
    assert again["response"]["action"] == "alert" and "answered once" in again["response"]["reason"]
    text = rt.metrics.render().decode()
    assert 'tuner_monitor_events_total{agent="mon",cause="latency",kind="anomaly"} 2.0' in text
    assert 'tuner_monitor_episodes_total{agent="mon",cause="latency",kind="anomaly"} 1.0' in text


def _feed(tmp_path: Path, **monitor: Any) -> MonitorFeed:
    """The feed of an agent `mon` that watches every 15 s with `watch.monitor` = {learn_windows: 10, **monitor}."""
    path = agents.write_agent(tmp_path / "mon.yaml", name="mon", tracking={"enabled": False},
                              watch={"url": "http://127.0.0.1:9/metrics", "interval_s": 15,
                                     "monitor": {"learn_windows": 10, **monitor}})
    st = AgentState(name="mon", path=path)
    rt = Runtime(state_dir=tmp_path / "state", stop=threading.Event(), agents={"mon": st}, locks={},
                 metrics=DaemonMetrics(), grace_s=1.0, scheduler=Scheduler())  # type: ignore[arg-type]
    return MonitorFeed(rt, st, load_agent(path).spec)


def test_after_a_rollback_the_next_scrape_starts_a_new_baseline(tmp_path: Path) -> None:
    feed = _feed(tmp_path)
    server = VllmSeries()
    for i in range(15):
        server.finish(60, 100, 16)
        feed.consume(1000.0 + 15 * i, parse(server.text()))
    assert not feed.monitor.learning and feed.monitor.tracks["itl_ms_mean"].baseline is not None
    # the re-verification's thread rolled the champion back: the Monitor is left to the thread that feeds it
    done = threading.Thread(target=feed.rolled_back)
    done.start()
    done.join()
    assert not feed.monitor.learning
    server.finish(60, 100, 16)
    feed.consume(1000.0 + 15 * 15, parse(server.text()))
    assert feed.monitor.learning and feed.monitor.tracks["itl_ms_mean"].baseline is None


@pytest.mark.skipif(not Path("/proc/self/schedstat").exists(), reason="no schedstat in this kernel")
def test_a_watched_process_gives_the_monitor_its_ready_share(tmp_path: Path) -> None:
    """`cpu_wait_source: pid:<N>`: a real process's threads' schedstat read at every scrape, both shares of its
    wait (of the window, and of the time it was ready to run) in the monitor's tracks."""
    busy = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: sum(range(10_000)); time.sleep(0.001)"])
    try:
        feed = _feed(tmp_path, cpu_wait_source=f"pid:{busy.pid}")
        server = VllmSeries()
        for i in range(4):
            server.finish(60, 100, 16)
            feed.consume(1000.0 + 15 * i, parse(server.text()))
            time.sleep(0.3)  # the process runs between the scrapes
        window, ready = feed.monitor.tracks["cpu_wait_frac"].values, feed.monitor.tracks["cpu_ready_wait_frac"].values
        assert len(window) == len(ready) == 3  # from the second scrape on, every scrape
        assert all(0.0 <= w <= r <= 1.0 for w, r in zip(window, ready, strict=True))  # the ready time <= the window
    finally:
        busy.kill()
        busy.wait(10)


@pytest.mark.skipif(not Path("/proc/self/schedstat").exists(), reason="no schedstat in this kernel")
def test_a_watched_title_follows_the_process_that_holds_it(tmp_path: Path) -> None:
    """`cpu_wait_source: title:<text>` (vLLM's model worker: title:VLLM::Worker): the process found by its title at
    each scrape, so a server restarted under a new process id is read again; a title nothing holds is refused."""
    token = f"tuner-title-{time.time_ns()}"
    code = f"import time  # {token}\nwhile True: sum(range(10_000)); time.sleep(0.001)"
    feed = _feed(tmp_path, cpu_wait_source=f"title:{token}")
    server = VllmSeries()
    seen = []
    for life in range(2):  # the same title, two processes one after the other
        busy = subprocess.Popen([sys.executable, "-c", code])
        try:
            # Popen returns once the child's exec has begun, before the kernel has laid out its arguments: until
            # then /proc/<pid>/cmdline is empty and nothing holds the title (a loaded host's race, not the feed's)
            deadline = time.monotonic() + 10.0
            while busy.pid not in titled(token) and time.monotonic() < deadline:
                time.sleep(0.01)
            for i in range(3):
                server.finish(60, 100, 16)
                feed.consume(1000.0 + 15 * (3 * life + i), parse(server.text()))
                time.sleep(0.3)
        finally:
            busy.kill()
            busy.wait(10)
        seen.append(len(feed.monitor.tracks["cpu_wait_frac"].values))
    # each life's first scrape starts its counters (no window across the two processes), its next two read it
    assert seen == [2, 4], seen
    with pytest.raises(ConfigError, match=r"watch\.monitor\.cpu_wait_source: .*title:<text> needs"):
        _feed(tmp_path, cpu_wait_source="title: ")


def test_the_host_speed_probe_gives_the_monitor_the_hosts_speed_at_every_scrape(tmp_path: Path) -> None:
    """`host_speed_probe: true`: the daemon's one probe (tuner.monitor.hostspeed) timed every half second, each
    scrape's window of it in the monitor's track; off by default."""
    feed = _feed(tmp_path, host_speed_probe=True)
    assert _feed(tmp_path).host_speed is None
    server = VllmSeries()
    for i in range(3):
        time.sleep(0.8)  # the probe runs between the scrapes
        server.finish(60, 100, 16)
        feed.consume(1000.0 + 15 * i, parse(server.text()))
    got = feed.monitor.tracks["host_probe_us"].values
    assert len(got) == 2 and all(v > 0 for v in got), got  # a window from the second scrape on
    with pytest.raises(ConfigError, match=r"watch\.monitor.*host_speed_elasticity judges latencies .* set "
                                          r"host_speed_probe: true too"):
        _feed(tmp_path, host_speed_elasticity=0.6)
    assert _feed(tmp_path, host_speed_probe=True, host_speed_elasticity=0.6).monitor.config.host_speed_elasticity == 0.6
    assert feed.monitor.config.host_speed_elasticity is None  # the probe recorded, nothing judged at it unless told
    # where the wait's source names the server's process the probe runs on its busiest thread's CPU: one per server
    me = f"pid:{os.getpid()}"
    followed = _feed(tmp_path, host_speed_probe=True, cpu_wait_source=me).host_speed
    assert followed is not None and feed.host_speed is not None
    assert followed.probe is shared(me) and followed.probe is not feed.host_speed.probe
    # judged at the speed of the server's own CPU, its latencies' autocorrelation widens over a CUSUM's 3 windows
    # (tuner.monitor.config.autocorrelation_horizon_of); read on the unpinned probe, to the long-run scale
    judged = {"host_speed_probe": True, "host_speed_elasticity": 1.0}
    assert _feed(tmp_path, **judged, cpu_wait_source=me).monitor.config.autocorrelation_horizon == 3
    assert _feed(tmp_path, **judged).monitor.config.autocorrelation_horizon is None
    time.sleep(0.8)
    assert followed.probe.take()["own_cpus"], "the followed probe ran no pinned runs"
