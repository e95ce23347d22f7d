"""The host's own speed (tuner.monitor.hostspeed) and the monitor's latencies judged at it
(MonitorConfig.host_speed_elasticity): a neighbour on the shared cache is the environment, a slower server is
not."""

from __future__ import annotations

import math
import os
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tuner.monitor.classify import Monitor
from tuner.monitor.config import MonitorConfig
from tuner.monitor.hostspeed import HostSpeed, HostSpeedReader, ThreadCpu, follows, probe_index, reading, shared

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


def test_the_index_is_the_geometric_mean_of_the_three_tasks() -> None:
    got = probe_index({"mv4_us": 160.0, "mm64_us": 6.0, "py_us": 25.0, "runs": 30.0})
    assert got is not None and math.isclose(got, (160.0 * 6.0 * 25.0) ** (1 / 3))
    # each task twice as slow: the index twice; one task alone x8: the index x2 as well
    assert math.isclose(probe_index({"mv4_us": 320.0, "mm64_us": 12.0, "py_us": 50.0}) or 0, 2 * got)
    assert math.isclose(probe_index({"mv4_us": 8 * 160.0, "mm64_us": 6.0, "py_us": 25.0}) or 0, 2 * got)
    assert probe_index({"mv4_us": 160.0, "mm64_us": 6.0}) is None  # a task missing: no reading
    assert probe_index({"mv4_us": 160.0, "mm64_us": 0.0, "py_us": 25.0}) is None


def test_a_takes_readings_own_unpinned_and_their_geometric_mean() -> None:
    unpinned = {"mv4_us": 160.0, "mm64_us": 6.0, "py_us": 25.0}
    own = {"mv4_us": 4 * 160.0, "mm64_us": 6.0, "py_us": 25.0}
    taken = {"runs": 30.0, **unpinned, "own": {"runs": 30.0, **own}}
    u, o = probe_index(unpinned) or 0, probe_index(own) or 0
    assert reading(taken) == pytest.approx(u) and reading(taken, "own") == pytest.approx(o)
    assert reading(taken, "own+index") == pytest.approx(math.sqrt(u * o))
    assert reading(taken, "mv4_us") == 160.0
    assert reading({"runs": 30.0, **unpinned}, "own+index") is None  # not followed: no own runs
    assert reading({"runs": 0.0}, "own+index") is None


def _task(root: Path, pid: int, tid: int, comm: str, ticks: int, cpu: int) -> None:
    """A /proc/<pid>/task/<tid>/stat line (proc(5)): utime, stime fields 14-15, processor field 39."""
    fields = ["S"] + ["0"] * 10 + [str(ticks), "0"] + ["0"] * 23 + [str(cpu)] + ["0"] * 13
    d = root / str(pid) / "task" / str(tid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "stat").write_text(f"{tid} ({comm}) " + " ".join(fields) + "\n")


def test_the_followed_cpu_is_the_busiest_threads_last_one(tmp_path: Path) -> None:
    _task(tmp_path, 10, 10, "vllm serve", 100, 0)
    _task(tmp_path, 10, 11, "VLLM::Engine) x", 500, 1)  # a name with a space and a parenthesis
    follow = ThreadCpu(10, every=2, proc_root=tmp_path)
    assert follow() == 1  # the busiest so far: 11
    _task(tmp_path, 10, 11, "VLLM::Engine) x", 500, 0)  # moved to CPU 0
    assert follow() == 0  # the same thread read again between choices
    _task(tmp_path, 10, 10, "vllm serve", 900, 1)  # 10 now the busiest since the last choice (+800 vs +0)
    assert follow() == 1
    assert ThreadCpu(99, proc_root=tmp_path)() is None  # no such process
    both = ThreadCpu(lambda: [10, 20], proc_root=tmp_path)
    _task(tmp_path, 20, 20, "EngineCore", 5000, 0)
    assert both() == 0  # the busiest of all the processes'


def test_the_followed_cpu_of_a_real_busy_thread_is_one_this_process_may_run_on() -> None:
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))
    t = threading.Thread(target=spin, daemon=True)
    t.start()
    try:
        time.sleep(0.2)
        cpu = ThreadCpu(os.getpid())()
        assert cpu is not None and cpu in os.sched_getaffinity(0)
    finally:
        stop.set()
        t.join()


def test_a_following_probe_runs_its_tasks_on_the_followed_cpu_and_its_readers_read_those() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    probe = HostSpeed(period_s=0.05, follow=lambda: cpus[-1], cpus=cpus).start()
    try:
        reader = HostSpeedReader(probe)
        time.sleep(0.6)
        got = probe.take()
        assert got["runs"] >= 2 and got["own"]["runs"] >= 2, got
        assert got["own_cpus"] == {str(cpus[-1]): got["own"]["runs"]}, got
        assert all(got[f"cpu{c}"]["runs"] >= 2 and got[f"cpu{c}"]["py_us"] > 0 for c in cpus), got
        assert reader.read()["host_probe_us"] > 0
    finally:
        probe.stop()
    assert os.sched_getaffinity(0) == set(cpus)  # the caller's own mask untouched (the probe pins its thread)


def test_a_following_probes_readers_read_the_mean_of_its_runs_on_the_followed_cpu_and_its_unpinned_ones() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    probe = HostSpeed(period_s=0.05, follow=lambda: cpus[0]).start()
    time.sleep(0.6)
    probe.stop()
    got = probe.take()  # every run since the start, as the readers keep them
    own, unpinned = reading(got, "own"), reading(got, "index")
    assert own and unpinned and got["runs"] >= 2
    assert probe.median_since(float("-inf")) == pytest.approx(math.sqrt(own * unpinned), rel=1e-9)
    alone = HostSpeed(period_s=0.05).start()  # a probe following nothing: its unpinned runs alone
    time.sleep(0.3)
    alone.stop()
    assert alone.median_since(float("-inf")) == pytest.approx(reading(alone.take(), "index"), rel=1e-9)


def test_a_probe_follows_a_named_servers_processes_and_is_one_per_server() -> None:
    assert follows(f"pid:{os.getpid()}")() in os.sched_getaffinity(0)
    assert follows("title:no-such-process-title-here")() is None
    for bad in ("pid:x", "title: ", "/sys/fs/cgroup/cpu.pressure"):
        with pytest.raises(ValueError, match="pid:<N> or title:<text>"):
            follows(bad)
    one = shared(f"pid:{os.getpid()}")
    assert shared(f"pid:{os.getpid()}") is one and shared() is not one


def test_a_probe_whose_period_fails_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    calls = []

    def follow() -> int | None:
        calls.append(1)
        if len(calls) <= 2:
            raise OSError("proc unreadable")  # the first two periods fail
        return min(os.sched_getaffinity(0))
    probe = HostSpeed(period_s=0.05, follow=follow).start()
    try:
        reader = HostSpeedReader(probe)
        time.sleep(0.6)
        assert reader.read()["host_probe_us"] > 0  # the later periods ran
    finally:
        probe.stop()
    assert [r.message for r in caplog.records].count(
        "host speed probe: a period failed; it goes on (named once)") == 1


def _bucket_held(signals: tuple[str, ...], seed: int) -> Events:
    """A server whose ITL mean follows its host's speed (fast for 15-window stretches, x0.7) while its end-to-end
    p50 and p90 stay inside one histogram bucket (100-300 ms: interpolated at 150 and 270 whatever the speed),
    judged at the host's speed with elasticity 1 on `signals`."""
    rng = random.Random(seed)
    m = Monitor(MonitorConfig(interval_s=15.0, host_speed_elasticity=1.0,
                              host_speed_signals=tuple((name, 1.0) for name in signals)))
    out: Events = []
    for i in range(160):
        level = 0.7 if 30 <= i % 60 < 45 else 1.0
        sig = {"rate_per_s": rng.gauss(8.0, 0.3), "prompt_tokens_mean": rng.gauss(100, 5),
               "output_tokens_mean": rng.gauss(16, 1), "itl_ms_mean": 5.0 * level * rng.lognormvariate(0, 0.04),
               "e2el_ms_p50": 150.0, "e2el_ms_p90": 270.0, "e2el_ms_p50_bucket_lo": 100.0,
               "e2el_ms_p50_bucket_hi": 300.0, "e2el_ms_p90_bucket_lo": 100.0, "e2el_ms_p90_bucket_hi": 300.0,
               "host_probe_us": 30.0 * level * rng.lognormvariate(0, 0.03)}
        out += [(i, e.kind, e.cause) for e in m.observe(15.0 * i, sig)]
    return out


def test_quantiles_a_bucket_holds_still_are_not_judged_at_the_hosts_speed() -> None:
    """The host's speed corrects the latency read exactly (the ITL mean, MonitorConfig.host_speed_signals); the
    quantiles held in their bucket, corrected too, read the fast host's stretches as a slower server."""
    for seed in range(3):
        assert _bucket_held(("itl_ms_mean",), seed) == []
        wrong = _bucket_held(("itl_ms_mean", "e2el_ms_p50", "e2el_ms_p90"), seed)
        assert ("anomaly", "latency") in [(k, c) for _, k, c in wrong], wrong


def test_the_itl_means_autocorrelation_apart_from_the_quantiles_left_with_the_hosts_wander() -> None:
    """The quantiles not judged at the host's speed keep its wander (slow, autocorrelated); pooled with them the
    ITL mean's scale is widened for their autocorrelation, apart from them (MonitorConfig.autocorrelation_apart)
    for its own."""
    def itl_scale(apart: bool, seed: int) -> float:
        rng = random.Random(seed)
        m = Monitor(MonitorConfig(interval_s=15.0, host_speed_elasticity=1.0, autocorrelation_apart=apart))
        for i in range(20):
            level = 1.0 + 0.25 * math.sin(2 * math.pi * i / 20)  # the host's wander over the learning windows
            m.observe(15.0 * i, {"rate_per_s": rng.gauss(8.0, 0.3), "prompt_tokens_mean": rng.gauss(100, 5),
                                 "output_tokens_mean": rng.gauss(16, 1),
                                 "itl_ms_mean": 5.0 * level * rng.lognormvariate(0, 0.05),
                                 "ttft_ms_p50": 16.0 * level * rng.lognormvariate(0, 0.05),
                                 "e2el_ms_p50": 120.0 * level * rng.lognormvariate(0, 0.05),
                                 "host_probe_us": 30.0 * level * rng.lognormvariate(0, 0.02)})
        b = m.tracks["itl_ms_mean"].baseline
        assert b is not None
        return b.scale

    for seed in range(3):
        assert itl_scale(True, seed) < 0.85 * itl_scale(False, seed)


def _half_as_elastic(signals: tuple[tuple[str, float], ...], seed: int, slower_at: int | None = None) -> Events:
    """A host slow (x1.6) and fast (x0.6) by stretches; the server's ITL mean follows it at elasticity 1 and its
    TTFT median at 0.5; from `slower_at` on the server is 1.3 times as slow on its own (the probe unmoved). Judged
    at the host's speed with elasticity 1 on `signals` (latency, share)."""
    rng = random.Random(seed)
    m = Monitor(MonitorConfig(interval_s=15.0, host_speed_elasticity=1.0, host_speed_signals=signals))
    out: Events = []
    for i in range(180):
        level = {0: 1.0, 1: 1.0, 2: 1.6, 3: 1.0, 4: 0.6, 5: 1.0}[(i // 10) % 6] if i >= 30 else 1.0
        own = 1.3 if slower_at is not None and i >= slower_at else 1.0
        sig = {"rate_per_s": rng.gauss(8.0, 0.3), "prompt_tokens_mean": rng.gauss(100, 5),
               "output_tokens_mean": rng.gauss(16, 1), "itl_ms_mean": 5.0 * level * own * rng.lognormvariate(0, 0.04),
               "ttft_ms_p50": 16.0 * level ** 0.5 * own * rng.lognormvariate(0, 0.04),
               "host_probe_us": 30.0 * level * rng.lognormvariate(0, 0.02)}
        out += [(i, e.kind, e.cause) for e in m.observe(15.0 * i, sig)]
    return out


def test_a_latency_half_as_elastic_to_the_host_is_judged_at_its_share() -> None:
    """A latency that follows the host at half the ITL mean's elasticity, judged at its share (0.5), reads the
    host's episodes as the environment; judged without the host's speed it calls the slow host an anomaly, and at
    the full elasticity the fast one; at its share a server slower on its own is still found."""
    def anomalies(events: Events) -> list[int]:
        return [i for i, k, c in events if (k, c) == ("anomaly", "latency")]

    for seed in range(3):
        itl = ("itl_ms_mean", 1.0)
        assert anomalies(_half_as_elastic((itl, ("ttft_ms_p50", 0.5)), seed)) == []
        assert anomalies(_half_as_elastic((itl,), seed)), seed  # the slow host's stretches
        assert anomalies(_half_as_elastic((itl, ("ttft_ms_p50", 1.0)), seed)), seed  # the fast host's
        found = anomalies(_half_as_elastic((itl, ("ttft_ms_p50", 0.5)), seed, slower_at=150))
        assert found and 150 <= found[0] <= 153, found


def test_a_latency_judged_at_the_hosts_speed_is_named_with_a_share_it_can_take() -> None:
    for bad in ((("itl_ms_men", 1.0),), (("ttft_ms_p50", 0.0),), (("ttft_ms_p50", 2.5),)):
        with pytest.raises(ValueError, match="host_speed_signals: .*above 0 and at most 2"):
            MonitorConfig(host_speed_signals=bad)
    default = MonitorConfig()
    assert default.host_speed_share("ttft_ms_p50") == 0.5 and default.host_speed_share("e2el_ms_p50") == 0.0
