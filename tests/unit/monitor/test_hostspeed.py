"""The host's own speed (tuner.monitor.hostspeed) and the monitor's latencies judged at it
(MonitorConfig.host_speed_elasticity): a neighbour on the shared cache is the environment, a slower server is
not."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

from tuner.monitor.classify import Monitor
from tuner.monitor.config import MonitorConfig
from tuner.monitor.hostspeed import HostSpeed, HostSpeedReader

Events = list[tuple[int, str, str]]


def _stream(latency_x: float, *, seed: int, elasticity: float = 0.7, judged_at: float | None = 0.7,
            n: int = 120, at: int = 60, probe: bool = True) -> tuple[Monitor, Events]:
    """Stationary inputs; a neighbour on the host's cache on and off in stretches of 5 windows (one in three),
    the probe's task 1.35 times as slow while it is on, the server's latencies that to the power `elasticity`;
    from `at` on the server `latency_x` times as slow on its own (the probe unmoved). The monitor judges them at
    the host's speed with elasticity `judged_at` (None: not)."""
    rng = random.Random(seed)

    def windows() -> Iterator[dict[str, float]]:
        for i in range(n):
            level = 1.35 if (i // 5) % 3 == 2 else 1.0
            f = level ** elasticity * (latency_x if i >= at else 1.0)
            sig = {"rate_per_s": rng.gauss(4.0, 0.2), "prompt_tokens_mean": rng.gauss(100, 5),
                   "output_tokens_mean": rng.gauss(16, 1), "itl_ms_mean": 5.0 * f * rng.lognormvariate(0, 0.04),
                   "ttft_ms_p50": 16.0 * f * rng.lognormvariate(0, 0.06)}
            if probe:
                sig["host_probe_us"] = 150.0 * level * rng.lognormvariate(0, 0.02)
            yield sig
    m = Monitor(MonitorConfig(interval_s=15.0, host_speed_elasticity=judged_at))
    return m, [(i, e.kind, e.cause) for i, sig in enumerate(windows()) for e in m.observe(15.0 * i, sig)]


def test_a_neighbour_on_the_cache_is_no_anomaly_and_a_slower_server_at_the_same_speed_is() -> None:
    for seed in range(3):
        m, ev = _stream(1.0, seed=seed)
        assert ev == [], ev  # the host's speed moving: explained
        assert m.host_speed_elasticity == 0.7
        _, ev = _stream(2.0, seed=seed)  # twice as slow at the host's usual speed
        assert ev and ev[0][1:] == ("anomaly", "latency") and 0 <= ev[0][0] - 60 <= 4, ev
        _, ev = _stream(1.3, seed=seed)
        assert ev and ev[0][1:] == ("anomaly", "latency") and 0 <= ev[0][0] - 60 <= 6, ev


def test_without_the_correction_the_neighbours_stretches_hide_a_slower_server() -> None:
    """The baseline learns the host's wander as the server's noise: a server 30 % slower is not found within
    the 6 windows it is with the correction."""
    def soon(ev: Events) -> bool:
        return any(k == "anomaly" and 0 <= i - 60 <= 6 for i, k, _ in ev)

    for seed in range(3):
        m, ev = _stream(1.3, seed=seed, judged_at=None)
        assert m.host_speed_elasticity == 0.0 and not soon(ev), ev
        m, ev = _stream(1.3, seed=seed, probe=False)  # no probe read: nothing to correct with
        assert m.host_speed_elasticity == 0.0 and not soon(ev), ev
        assert soon(_stream(1.3, seed=seed)[1])


def test_an_elasticity_too_large_for_the_server_leaves_its_slowdown_found() -> None:
    """A server whose latencies do not follow the probe, judged as if they did: the correction moves its
    residuals by the host's wander, yet a server twice as slow at the host's usual speed is found."""
    for seed in range(3):
        _, ev = _stream(2.0, seed=seed, elasticity=0.0)
        assert ev and ev[0][1:] == ("anomaly", "latency") and 0 <= ev[0][0] - 60 <= 4, ev


def test_the_probe_times_the_4mb_task_for_every_reader_of_its_windows() -> None:
    probe = HostSpeed(period_s=0.05).start()
    try:
        one, two = HostSpeedReader(probe), HostSpeedReader(probe)
        time.sleep(0.5)
        a, b = one.read(), two.read()  # each reader its own window, neither taking the other's runs
        assert set(a) == set(b) == {"host_probe_us"} and a["host_probe_us"] > 0 and b["host_probe_us"] > 0
        time.sleep(0.3)
        assert one.read()["host_probe_us"] > 0
    finally:
        probe.stop()
    time.sleep(0.1)
    reader = HostSpeedReader(probe)
    time.sleep(0.1)
    assert reader.read() == {}  # stopped: no run since this reader's start


def test_a_probe_nobody_takes_from_keeps_only_its_latest_runs() -> None:
    probe = HostSpeed(period_s=0.01, keep_s=0.05).start()  # six runs kept
    try:
        time.sleep(0.5)
    finally:
        probe.stop()
    assert 1 <= probe.take()["runs"] <= 6
