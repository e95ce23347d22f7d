"""The server's wait for a CPU (tuner.monitor.contention): PSI files, per-thread schedstat and the host's steal
in /proc/stat, read from files laid out as Linux lays them out, and this process's own /proc; the monitor
judging latencies at that wait (a noisy neighbour, in the guest or on the hypervisor, is no anomaly, a slower
server at the same wait is)."""

from __future__ import annotations

import math
import os
import random
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from tuner.monitor.classify import Monitor
from tuner.monitor.config import MonitorConfig
from tuner.monitor.contention import (
    MAX_WAIT_FRAC,
    CpuSteal,
    CpuWait,
    proc_stat_steal,
    psi_some_total_us,
    schedstat_ns,
)

PSI = "some avg10=43.66 avg60=44.76 avg300=21.39 total={}\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_psi_file_gives_the_share_of_the_window_spent_waiting(tmp_path: Path) -> None:
    f = tmp_path / "cpu.pressure"
    clock = Clock()
    w = CpuWait(str(f), clock=clock)
    f.write_text(PSI.format(5_000_000))
    assert w.read() == {}  # the first read opens the window
    clock.t += 10.0
    f.write_text(PSI.format(5_000_000 + 2_500_000))  # 2.5 s of 10 s
    assert w.read() == {"cpu_wait_frac": pytest.approx(0.25)}
    assert psi_some_total_us("full avg10=0 total=3\n") is None


def test_schedstat_share_is_the_busiest_thread(tmp_path: Path) -> None:
    def write(threads: dict[str, tuple[int, int]]) -> None:
        for tid, (ran, waited) in threads.items():
            (tmp_path / "42" / "task" / tid).mkdir(parents=True, exist_ok=True)
            (tmp_path / "42" / "task" / tid / "schedstat").write_text(f"{ran} {waited} 17\n")

    clock = Clock()
    w = CpuWait("pid:42", proc_root=tmp_path, clock=clock)
    write({"42": (10**9, 10**9), "43": (10**9, 0)})
    assert w.read() == {}
    clock.t += 10.0
    # the engine loop (43) ran 6 s and waited 2 s; a helper thread (42) that barely ran waited longer, 3 s: the
    # server's work is the loop's (it wanted a CPU longest), stretched by its own wait (waits are not added)
    write({"42": (10**9 + 500_000_000, 10**9 + 3 * 10**9), "43": (10**9 + 6 * 10**9, 2 * 10**9)})
    assert w.read() == {"cpu_wait_frac": pytest.approx(0.2), "cpu_ready_wait_frac": pytest.approx(0.25)}
    clock.t += 10.0
    # the loop ran 0 s and waited 4 s (starved), the helper ran 0.5 s and waited 1 s: still the loop's share
    write({"42": (2 * 10**9, 5 * 10**9), "43": (7 * 10**9, 6 * 10**9)})
    assert w.read() == {"cpu_wait_frac": pytest.approx(0.4), "cpu_ready_wait_frac": MAX_WAIT_FRAC}
    clock.t += 1.0
    write({"42": (2 * 10**9, 10**12), "43": (8 * 10**9, 10**12)})  # more than the window: capped
    assert w.read()["cpu_wait_frac"] == MAX_WAIT_FRAC
    clock.t += 1.0
    write({"42": (5, 5), "43": (5, 5)})  # a new process under the same pid: no window
    assert w.read() == {}
    assert schedstat_ns({"1": "garbage", "2": "1 2 3"}) == {"2": (1.0, 2.0)}


def test_the_ready_share_is_the_wait_over_the_time_the_thread_wanted_a_cpu(tmp_path: Path) -> None:
    """A thread that slept most of the window (a GPU's work, no request) and waited 1 s for each 1 s it ran took
    twice as long over its work: a ready share of 1/2 however small its share of the window."""
    def write(run_ns: int, wait_ns: int) -> None:
        (tmp_path / "7" / "task" / "7").mkdir(parents=True, exist_ok=True)
        (tmp_path / "7" / "task" / "7" / "schedstat").write_text(f"{run_ns} {wait_ns} 9\n")

    clock = Clock()
    w = CpuWait("pid:7", proc_root=tmp_path, clock=clock)
    write(10**9, 10**9)
    assert w.read() == {}
    clock.t += 20.0
    write(2 * 10**9, 2 * 10**9)
    assert w.read() == {"cpu_wait_frac": pytest.approx(0.05), "cpu_ready_wait_frac": pytest.approx(0.5)}
    clock.t += 20.0
    write(2 * 10**9, 2 * 10**9)  # it never wanted a CPU: no wait
    assert w.read() == {"cpu_wait_frac": 0.0, "cpu_ready_wait_frac": 0.0}


def test_this_process_and_a_gone_one(tmp_path: Path) -> None:
    w = CpuWait(f"pid:{os.getpid()}")
    assert w.read() == {}
    sum(i * i for i in range(200_000))
    got = w.read()
    assert set(got) == {"cpu_wait_frac", "cpu_ready_wait_frac"}
    assert all(0.0 <= v <= MAX_WAIT_FRAC for v in got.values())
    gone = CpuWait("pid:999999999", proc_root=tmp_path)
    assert gone.read() == {} and gone.read() == {} and gone.missing.named  # named once, never an error
    with pytest.raises(ValueError, match="pid:<N>"):
        CpuWait("pid:x")


def test_a_title_reads_the_processes_that_hold_it_found_again_at_each_read(tmp_path: Path) -> None:
    """A title (vLLM's model worker, title:VLLM::Worker) reads only the processes that hold it, not the server's
    others: a restarted server's new worker is found at the next read, and its counters start again (no window
    across the two)."""
    def proc(pid: int, title: str, threads: dict[str, tuple[int, int]]) -> None:
        d = tmp_path / str(pid)
        (d / "task").mkdir(parents=True, exist_ok=True)
        (d / "cmdline").write_bytes(title.encode() + b"\0--flag\0")
        (d / "comm").write_text(title[:15] + "\n")
        for tid, (ran, waited) in threads.items():
            (d / "task" / tid).mkdir(exist_ok=True)
            (d / "task" / tid / "schedstat").write_text(f"{ran} {waited} 5\n")

    clock = Clock()
    w = CpuWait("title:VLLM::Worker", proc_root=tmp_path, clock=clock)
    assert w.read() == {} and w.missing.named  # no such process yet: named, no error
    proc(10, "VLLM::EngineCore", {"10": (0, 0)})
    proc(11, "VLLM::Worker", {"11": (0, 0), "12": (0, 0)})
    assert w.read() == {}  # the first read of it
    clock.t += 10.0
    proc(10, "VLLM::EngineCore", {"10": (4_000_000_000, 6_000_000_000)})  # spinning: ready all the time
    proc(11, "VLLM::Worker", {"11": (9_000_000_000, 1_000_000_000), "12": (10_000_000, 0)})
    got = w.read()
    assert got["cpu_wait_frac"] == pytest.approx(0.1) and got["cpu_ready_wait_frac"] == pytest.approx(0.1)
    engine = CpuWait("title:EngineCore", proc_root=tmp_path, clock=clock)
    assert engine.read() == {}
    shutil.rmtree(tmp_path / "11")  # the server restarted: a new worker, its counters from 0
    proc(21, "VLLM::Worker", {"21": (1_000_000_000, 0)})
    clock.t += 10.0
    assert w.read() == {}  # no thread in common with the last read: no window
    clock.t += 10.0
    proc(21, "VLLM::Worker", {"21": (6_000_000_000, 5_000_000_000)})
    assert w.read()["cpu_wait_frac"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="title:<text>"):
        CpuWait("title:")


STAT = "cpu  {user} 0 {system} {idle} 40 0 7 {steal} 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\nintr 12345\n"


def test_steal_is_the_stolen_share_of_the_hosts_runnable_cpu_time(tmp_path: Path) -> None:
    f = tmp_path / "stat"
    s = CpuSteal(str(f))
    f.write_text(STAT.format(user=1000, system=200, idle=9000, steal=50))
    assert s.read() == {}  # the first read opens the window
    f.write_text(STAT.format(user=1100, system=250, idle=9500, steal=100))  # 50 stolen of 200 runnable
    assert s.read() == {"cpu_steal_frac": pytest.approx(0.25)}
    f.write_text(STAT.format(user=1100, system=250, idle=9900, steal=100))  # idle only: nothing wanted to run
    assert s.read() == {"cpu_steal_frac": 0.0}
    f.write_text(STAT.format(user=10, system=2, idle=90, steal=0))  # counters down (a reboot): no window
    assert s.read() == {}
    f.unlink()
    assert s.read() == {} and s.missing.named  # unreadable: named once, never an error
    assert proc_stat_steal("cpu  1 2 3 4 5 6 7\n") is None  # a kernel without the steal column
    assert proc_stat_steal("cpu0 1 2 3 4 5 6 7 8\n") is None  # no aggregate line
    here = CpuSteal()  # this host's own /proc/stat
    here.read()
    sum(i * i for i in range(200_000))
    got = here.read()
    assert set(got) <= {"cpu_steal_frac"} and 0.0 <= got.get("cpu_steal_frac", 0.0) <= MAX_WAIT_FRAC


Events = list[tuple[int, str, str]]


def _window(rng: random.Random, f: float, *, rate: float = 4.0, rate_sd: float = 0.4, itl_ms: float = 8.0,
            itl_sd: float = 0.05, ttft_ms: float = 50.0) -> dict[str, float]:
    """One window's load (rate, prompt and output lengths) and latencies of a server `f` times as slow as its
    own (the ITL mean with spread `itl_sd`, the TTFT median with 8 %), drawn in that order."""
    return {"rate_per_s": rng.gauss(rate, rate_sd), "prompt_tokens_mean": rng.gauss(100, 5),
            "output_tokens_mean": rng.gauss(16, 1), "itl_ms_mean": itl_ms * f * rng.lognormvariate(0, itl_sd),
            "ttft_ms_p50": ttft_ms * f * rng.lognormvariate(0, 0.08)}


def _watch(m: Monitor, windows: Iterable[dict[str, float]]) -> Events:
    """(window, kind, cause) of every event `m` raises over 15-s `windows`."""
    return [(i, e.kind, e.cause) for i, sig in enumerate(windows) for e in m.observe(15.0 * i, sig)]


def _stream(latency_x: float, wait: float, *, seed: int, n: int = 80, at: int = 40, contention: bool = True,
            starve: tuple[int, ...] = (), signal: str = "cpu_wait_frac",
            limit: float = MonitorConfig.max_wait_judged) -> tuple[Monitor, Events]:
    """Windows whose latencies the server's own work sets (x `latency_x` from `at` on), stretched by a
    neighbour who makes it wait a share of each window that wanders between 0.05 and 0.45 (from `at` on:
    `wait`; in the windows `starve`, 0.97 and latencies far off), read as `signal` (cpu_steal_frac: a
    hypervisor's other guests; "both": half of the share each way, 1 - (1 - w)(1 - s) = the share); `limit`:
    MonitorConfig.max_wait_judged."""
    rng = random.Random(seed)

    def windows() -> Iterator[dict[str, float]]:
        for i in range(n):
            w = rng.uniform(0.05, 0.45) if i < at else wait
            f = (latency_x if i >= at else 1.0) / (1 - w)
            if i in starve:
                w, f = 0.97, 80.0
            sig = _window(rng, f)
            if signal == "both":
                half = 1 - (1 - w) ** 0.5
                sig.update(cpu_wait_frac=half, cpu_steal_frac=half)
            else:
                sig[signal] = w
            yield sig
    m = Monitor(MonitorConfig(interval_s=15.0, contention=contention, max_wait_judged=limit))
    return m, _watch(m, windows())


def test_a_noisy_neighbour_is_no_anomaly_and_a_slower_server_at_the_same_wait_is() -> None:
    for seed in range(3):
        assert _stream(1.0, 0.45, seed=seed)[1] == []  # the neighbour's share moving: explained
        m, ev = _stream(1.0, 0.2, seed=seed, starve=(50, 51, 60, 61))  # starved twice: not judged
        assert ev == [] and m.unjudged >= 4
        m, ev = _stream(1.0, 0.2, seed=seed, starve=(50, 51, 60, 61), limit=1.0)  # judged, within their wait's error
        assert ev == [] and m.unjudged == 0
        _, ev = _stream(2.0, 0.2, seed=seed)  # twice as slow at a wait it has seen
        assert ev and ev[0][1:] == ("anomaly", "latency") and ev[0][0] - 40 <= 4  # within five windows
    # without the wait the neighbour's variation alone is taken for the server's
    assert any(k == "anomaly" for _, k, _ in _stream(1.0, 0.45, seed=0, contention=False, starve=(50, 51))[1])


@pytest.mark.parametrize("signal", ["cpu_steal_frac", "both"])
def test_a_hypervisors_steal_is_a_wait_too(signal: str) -> None:
    for seed in range(3):
        assert _stream(1.0, 0.45, seed=seed, signal=signal)[1] == []
        m, ev = _stream(1.0, 0.2, seed=seed, starve=(50, 51), signal=signal)
        assert ev == [] and m.unjudged >= 2
        m, ev = _stream(1.0, 0.2, seed=seed, starve=(50, 51), signal=signal, limit=1.0)
        assert ev == [] and m.unjudged == 0
        _, ev = _stream(2.0, 0.2, seed=seed, signal=signal)
        assert ev and ev[0][1:] == ("anomaly", "latency") and ev[0][0] - 40 <= 4


def _sleeper(latency_x: float, *, law: str, seed: int, n: int = 80, at: int = 40) -> Events:
    """A server whose engine thread sleeps most of each window (a GPU's work; a fixed step delay) and needs a
    CPU for the rest: a neighbour makes it wait a share r of its ready time, wandering between 0.1 and 0.8, so
    its CPU work, and its latencies (all CPU work here), take 1 / (1 - r) as long; its share of the window,
    the ready time's share times the wait, stays below 0.2. From `at` on it is `latency_x` times as slow."""
    rng = random.Random(seed)

    def windows() -> Iterator[dict[str, float]]:
        for i in range(n):
            r = rng.uniform(0.1, 0.8)
            run = 0.04
            ready = run / (1 - r)
            f = (latency_x if i >= at else 1.0) / (1 - r)
            yield {**_window(rng, f), "cpu_wait_frac": ready - run, "cpu_ready_wait_frac": r}
    return _watch(Monitor(MonitorConfig(interval_s=15.0, wait_law=law,  # type: ignore[arg-type]
                                        wait_law_relative=True)), windows())


def test_the_ready_law_explains_a_sleeping_threads_wait_and_finds_it_twice_as_slow() -> None:
    for seed in range(3):
        assert _sleeper(1.0, law="ready", seed=seed) == []  # the neighbour's share of its ready time: explained
        ev = _sleeper(2.0, law="ready", seed=seed)
        assert ev and ev[0][1:] == ("anomaly", "latency") and ev[0][0] - 40 <= 4
    # the window's share (below 0.2) explains too little of a stretch up to x5: the neighbour's swings are
    # learnt as the server's own spread, which hides a server twice as slow
    late = [not (ev := _sleeper(2.0, law="window", seed=s)) or ev[0][0] - 40 > 4 for s in range(3)]
    assert late == [True, True, True]


def _quiet_host(latency_x: float, *, law: str, seed: int, n: int = 80, at: int = 40) -> Events:
    """A server on a quiet host: it waits for a CPU a share of the window below its error (0.002-0.01), but a
    large share of its short ready spells (0.05-0.5: the wake-up wait of a thread that sleeps most of the
    time), which does not move its latencies. From `at` on it is `latency_x` times as slow."""
    rng = random.Random(seed)
    windows = ({**_window(rng, latency_x if i >= at else 1.0), "cpu_wait_frac": rng.uniform(0.002, 0.01),
                "cpu_ready_wait_frac": rng.uniform(0.05, 0.5)} for i in range(n))
    return _watch(Monitor(MonitorConfig(interval_s=15.0, wait_law=law)), windows)  # type: ignore[arg-type]


def test_auto_takes_the_ready_share_only_where_the_server_measurably_waited() -> None:
    for seed in range(3):
        # a busy host: the sleeping server's stretch explained, a server twice as slow found
        assert _sleeper(1.0, law="auto", seed=seed) == []
        ev = _sleeper(2.0, law="auto", seed=seed)
        assert ev and ev[0][1:] == ("anomaly", "latency") and ev[0][0] - 40 <= 4
        # a quiet host: the wake-up wait is not taken for contention, so a +30 % slowdown is found at once
        assert _quiet_host(1.0, law="auto", seed=seed) == []
        ev = _quiet_host(1.3, law="auto", seed=seed)
        assert ev and ev[0][1:] == ("anomaly", "latency") and ev[0][0] - 40 <= 2
        # the ready share there only adds its noise to the latencies: the same slowdown is missed
        assert _quiet_host(1.3, law="ready", seed=seed) == []


_VLLM_AT_2 = {"rate": 2.0, "rate_sd": 0.3, "itl_ms": 3.0, "itl_sd": 0.04, "ttft_ms": 14.0}  # a tiny Llama's


def _at_the_line(latency_x: float, *, seed: int, n: int = 80, at: int = 40) -> Events:
    """A server at the line of the wait's error (vLLM's engine core at 2 req/s on a quiet 2-core host, its load's
    client beside it: experiments/detection, eighteenth step): it waits about 0.023 of each window for a CPU
    (0.013-0.06), around MonitorConfig.wait_error (0.03), and a steady 0.2-0.3 of its short ready spells (woken
    for each step), which do not move its latencies. From `at` on it is `latency_x` times as slow."""
    rng = random.Random(seed)
    windows = ({**_window(rng, latency_x if i >= at else 1.0, **_VLLM_AT_2),
                "cpu_wait_frac": min(0.06, max(0.013, 0.023 * rng.lognormvariate(0, 0.3))),
                "cpu_ready_wait_frac": rng.uniform(0.2, 0.3)} for i in range(n))
    return _watch(Monitor(MonitorConfig(interval_s=15.0, wait_law="auto")), windows)


def test_auto_moves_to_the_ready_share_by_degrees_around_the_waits_error() -> None:
    """A switch at the wait's error corrected the windows on either side of it by about x0.98 and x0.75 at random,
    a noise of its own that hid a +30 % slowdown; by degrees the windows near the line move the correction little."""
    delays = []
    for seed in range(6):
        assert _at_the_line(1.0, seed=seed) == []
        ev = _at_the_line(1.3, seed=seed)
        assert ev and ev[0][1:] == ("anomaly", "latency")
        delays.append(ev[0][0] - 40)
    # the switch found it after 3, 7, 8, 3, 32 and 12 windows on these seeds
    assert max(delays) <= 4 and sorted(delays)[2] <= 2, delays


def _starved_host(latency_x: float, *, seed: int, waits: tuple[float, float], later: tuple[float, float] | None = None,
                  own: bool = True, n: int = 80, at: int = 40) -> tuple[Monitor, Events]:
    """A server whose share of the window spent waiting for a CPU wanders over `waits` (from `at` on over
    `later` where given), its latencies stretched by 1 / (1 - w) ** 1.3 (the law's exponent a little off, as
    measured hosts' are: 0.89-1.03 on experiments/detection's busy streams, and more where the host starves it);
    from `at` on it is `latency_x` times as slow. `own`: MonitorConfig.starved_baseline."""
    rng = random.Random(seed)

    def windows() -> Iterator[dict[str, float]]:
        for i in range(n):
            w = rng.uniform(*(later if later and i >= at else waits))
            yield {**_window(rng, (latency_x if i >= at else 1.0) / (1 - w) ** 1.3), "cpu_wait_frac": w}
    m = Monitor(MonitorConfig(interval_s=15.0, wait_law="window", starved_baseline=own))
    return m, _watch(m, windows())


def test_a_host_starved_all_along_is_judged_against_its_starved_windows() -> None:
    for seed in range(3):
        # most windows beyond max_wait_judged: judged against the baseline of the learning stretch's starved
        # windows, calm, and a server twice as slow found within four windows
        m, ev = _starved_host(1.0, seed=seed, waits=(0.35, 0.8))
        assert ev == [] and m.unjudged < 10
        m, ev = _starved_host(2.0, seed=seed, waits=(0.35, 0.8))
        assert ev and ev[0][1:] == ("anomaly", "latency") and ev[0][0] - 40 <= 4
        # without it those windows are not judged, and the same server is found late or never
        m, ev = _starved_host(2.0, seed=seed, waits=(0.35, 0.8), own=False)
        assert m.unjudged > 10 and (not ev or ev[0][0] - 40 > 4)
        # a baseline learnt where the server never waited half a window has no starved normal: starved windows
        # after it, whose stretch the law gets wrong, are not judged (judging them was design 1's false alarms)
        m, ev = _starved_host(1.0, seed=seed, waits=(0.05, 0.3), later=(0.6, 0.9))
        assert ev == [] and m.unjudged > 30
        _, ev = _starved_host(1.0, seed=seed, waits=(0.05, 0.3), later=(0.6, 0.9), own=False)
        assert ev == []


def _steady_neighbour(latency_x: float, *, relative: bool, seed: int, n: int = 80,
                      at: int = 40) -> Events:
    """A server a neighbour keeps waiting about 0.7 of its ready time (0.65-0.75, each window read as it was:
    experiments/detection's busy streams sit at 0.66-0.83), its latencies 1 / (1 - r) times its own with its own
    spread of 5 %; from `at` on it is `latency_x` times as slow. `relative`: MonitorConfig.wait_error_relative."""
    rng = random.Random(seed)

    def windows() -> Iterator[dict[str, float]]:
        for i in range(n):
            r = rng.uniform(0.65, 0.75)
            f = (latency_x if i >= at else 1.0) / (1 - r)
            yield {**_window(rng, f, rate_sd=0.2, rate=2.0), "cpu_wait_frac": rng.uniform(0.2, 0.3),
                   "cpu_ready_wait_frac": r}
    return _watch(Monitor(MonitorConfig(interval_s=15.0, wait_error_relative=relative)), windows())


def test_the_shares_error_the_baseline_holds_is_not_counted_again() -> None:
    """At a steady wait of 0.7 the share's error, 0.03 / (1 - 0.7) = 0.1 on the log scale, is in every learning
    window and so in the learnt scale; counted again on top of it, it shrank a +30 % slowdown's z towards the
    CUSUM's allowance (designed for that slowdown), which then found it late or never."""
    delays: dict[bool, list[float]] = {True: [], False: []}
    for seed in range(6):
        for relative in (True, False):
            assert _steady_neighbour(1.0, relative=relative, seed=seed) == []
            ev = _steady_neighbour(1.3, relative=relative, seed=seed)
            assert not ev or ev[0][1:] == ("anomaly", "latency")
            delays[relative].append(ev[0][0] - 40 if ev else math.inf)
    # counted again: found after 5, 6, 6, 11 and 35 windows or never on these seeds
    assert max(delays[True]) <= 5 and sorted(delays[True])[2] <= 2, delays
    assert sorted(delays[False])[2] >= 5, delays


def _in_the_band(latency_x: float, *, blend: str, seed: int, n: int = 80, at: int = 40) -> Events:
    """A server in the auto law's band (vLLM's engine core at 2 req/s on a quiet 2-core host: experiments/detection,
    eighteenth step): it waits about 0.022 of each window for a CPU and a steady 0.2-0.3 of its ready spells. From
    `at` on it is `latency_x` times as slow at the same contention, so it is busy, and waits, `latency_x` times as
    long in a window: its window share rises with it, its ready share does not. `blend`: MonitorConfig.wait_blend."""
    rng = random.Random(seed)

    def windows() -> Iterator[dict[str, float]]:
        for i in range(n):
            f = latency_x if i >= at else 1.0
            yield {**_window(rng, f, **_VLLM_AT_2),
                   "cpu_wait_frac": f * min(0.04, max(0.013, 0.022 * rng.lognormvariate(0, 0.25))),
                   "cpu_ready_wait_frac": rng.uniform(0.2, 0.3)}
    return _watch(Monitor(MonitorConfig(interval_s=15.0, wait_blend=blend)), windows())  # type: ignore[arg-type]


def test_the_auto_laws_degree_is_the_usual_waits_not_the_windows() -> None:
    """Inside the band a slower server's longer wait raised the window's share, so the ready share's degree, and
    explained part of the slowdown away (a window's share wandering in the band made a noise of its own too)."""
    delays: dict[str, list[float]] = {"usual": [], "window": []}
    for seed in range(6):
        for blend in delays:
            assert _in_the_band(1.0, blend=blend, seed=seed) == []
            ev = _in_the_band(1.3, blend=blend, seed=seed)
            assert not ev or ev[0][1:] == ("anomaly", "latency")
            delays[blend].append(ev[0][0] - 40 if ev else math.inf)
    # the window's own share: found after 5, 2, 7, 1, 8 and 2 windows on these seeds
    assert max(delays["usual"]) <= 4 and sorted(delays["usual"])[3] <= 1, delays
    assert sorted(delays["window"])[3] >= 5, delays


def _own_load(latency_x: float, *, checked: float | None, seed: int, n: int = 80, at: int = 40,
              neighbour: bool = False, closed: bool = True) -> tuple[Monitor, Events]:
    """A closed loop on a small host whose CPU wait its own load makes (vLLM capped at 3 at once on 2 cores:
    experiments/detection, twenty-seventh step): its speed wanders by 8 %, and the faster it runs the more CPU its
    clients and front end take, so the engine waits longer (0.28-0.36 of the window); from `at` on its latencies
    are `latency_x` times as long at the same wait (run.py's slowdown model). `neighbour`: the usual case
    instead, a neighbour's wait (0.05-0.45) that stretches the work. `checked`: MonitorConfig.wait_checked. Its 3
    users' requests in the server steady as a closed loop's (a spread of 0.005 on the log); not `closed`: an open
    loop's, wandering with its arrivals (0.3), whose wait the check leaves corrected."""
    rng, inside_rng = random.Random(seed), random.Random(f"inside/{seed}")  # the loop's own draws apart

    def loop(sig: dict[str, float]) -> dict[str, float]:
        inside = 3 * math.exp(inside_rng.gauss(0, 0.005 if closed else 0.3))
        return {**sig, "in_server_mean": inside, "finished_per_s": sig["rate_per_s"]}

    def windows() -> Iterator[dict[str, float]]:
        for i in range(n):
            f = latency_x if i >= at else 1.0
            if neighbour:
                w = rng.uniform(0.05, 0.45)
                yield loop({**_window(rng, f / (1 - w)), "cpu_wait_frac": w})
                continue
            speed = rng.lognormvariate(0, 0.08)
            yield loop({**_window(rng, f * speed, itl_sd=0.02), "cpu_wait_frac": 0.32 - 0.5 * math.log(speed)})
    m = Monitor(MonitorConfig(interval_s=15.0, wait_checked=checked))
    return m, _watch(m, windows())


def test_a_wait_the_servers_own_load_makes_is_not_taken_for_a_neighbours() -> None:
    """Corrected for its own load's wait, a closed loop's latencies spread wider (the wait is highest where the
    server ran fastest) and a slower server's lower wait explains its slowdown away: with wait_checked the
    baseline that the correction widens is judged uncorrected, and the slowdown is found; a neighbour's wait
    still corrects, and an open loop's is not checked (its clients' CPU is set by its arrivals, not by the
    server's speed)."""
    found: dict[float | None, list[float]] = {None: [], 1.25: []}
    for seed in range(6):
        for checked, delays in found.items():
            m, ev = _own_load(1.0, checked=checked, seed=seed)
            assert ev == [], (checked, ev)
            m, ev = _own_load(1.3, checked=checked, seed=seed)
            assert not ev or ev[0][1:] == ("anomaly", "latency"), ev
            delays.append(ev[0][0] - 40 if ev else math.inf)
            assert m.wait_corrected is (checked is None), checked
        m, ev = _own_load(1.0, checked=1.25, seed=seed, neighbour=True)  # explained, the correction kept
        assert ev == [] and m.wait_corrected
        m, ev = _own_load(2.0, checked=1.25, seed=seed, neighbour=True)
        assert ev and ev[0][1:] == ("anomaly", "latency") and ev[0][0] - 40 <= 4
        m, ev = _own_load(1.0, checked=1.25, seed=seed, closed=False)  # an open loop: checked in a closed one only
        assert m.wait_corrected
    # corrected: 3 of 6 never found within 40 windows, the others after 10, 16 and 21
    assert max(found[1.25]) <= 12 and sorted(found[1.25])[2] <= 4, found
    assert sorted(found[None])[2] > 12, found
