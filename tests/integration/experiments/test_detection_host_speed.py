"""The detection experiment's host-speed probe (tuner.monitor.hostspeed) and its reading beside a recorded vLLM
(host_speed.py): the probe's medians are CPU time of fixed tasks, each take a new window; a recorded stream's
slower windows are found in the engine's CPU time per step, and the injected slowdown (the server stopped from
outside) raises it too."""

from __future__ import annotations

import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
DETECTION = ROOT / "experiments" / "detection"
sys.path.insert(0, str(DETECTION))

import host_speed  # noqa: E402

from tuner.monitor.hostspeed import TASKS, HostSpeed  # noqa: E402


def test_the_probe_times_its_tasks_in_cpu_time_and_each_take_starts_a_new_window() -> None:
    probe = HostSpeed(period_s=0.05).start()
    try:
        time.sleep(0.6)
        first = probe.take()
        assert first["runs"] >= 3, first
        assert all(first[k] > 0 for k in TASKS), first
        # the 4-MB product reads 4 MB: more CPU than a 64x64 product's 32 kB
        assert first["mv4_us"] > first["mm64_us"], first
        time.sleep(0.3)
        second = probe.take()
        assert 1 <= second["runs"] < first["runs"] + 10, (first, second)
    finally:
        probe.stop()
    assert probe.take()["runs"] <= 1  # stopped: nothing more is timed (at most the run under way)
    assert set(probe.take()) == {"runs"}  # no medians of no runs


def test_vllm16s_excursions_are_its_engines_cpu_per_step() -> None:
    rows = host_speed.rows_of(DETECTION / "recorded-vllm-capacity4-long.jsonl.gz")
    calm = [r for r in rows if r["phase"] == "stationary_b" and r["window"] >= 2]
    assert len(calm) > 100
    med = statistics.median(r["cpu_us_per_step"] for r in calm)
    slow = {r["window"] for r in calm if r["cpu_us_per_step"] >= 1.15 * med}
    assert {45, 82, 83} <= slow, sorted(slow)  # the windows its monitor flagged (README, thirty-first step)
    assert host_speed.corr([r["cpu_us_per_step"] for r in calm], [r["itl_ms"] for r in calm]) > 0.6
    slowed = [r["cpu_us_per_step"] / med for r in rows if r["phase"] == "slowdown30"]
    assert statistics.median(slowed) > 1.2, slowed
    assert all("mv4_us" not in r for r in rows)  # recorded without the probe
    assert math.isnan(host_speed.corr([1.0, 2.0], [1.0, 2.0]))  # too few windows for a correlation


def test_the_profiles_loop_thread_is_the_one_with_the_most_samples(tmp_path: Path) -> None:
    import profile_engine

    raw = tmp_path / "100.000-115.000.txt"
    # py-spy 0.4's raw format with --threads: the thread's frame first, a stack's count last
    raw.write_text("thread (7): MainThread;run_busy_loop (core.py:1);step (core.py:2);schedule (s.py:3) 5\n"
                   "thread (7): MainThread;run_busy_loop (core.py:1);step (core.py:2) 20\n"
                   "thread (9): Thread-2;process_output_sockets (core.py:9) 7\n")
    stacks = profile_engine.loop_stacks(raw)
    assert sum(stacks.values()) == 25
    assert stacks["run_busy_loop (core.py:1);step (core.py:2);schedule (s.py:3)"] == 5
    (tmp_path / "115.000.part").write_text("")  # a chunk still being written is not read
    assert [(a, b) for a, b, _ in profile_engine.chunks(tmp_path)] == [(100.0, 115.0)]
    proc = tmp_path / "proc"
    for pid, comm in ((11, "python3"), (12, "VLLM::EngineCore")):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "comm").write_text(comm + "\n")
    (proc / "self").mkdir()
    assert profile_engine.engine_core_pid(proc) == 12
    (proc / "12" / "comm").write_text("python3\n")
    assert profile_engine.engine_core_pid(proc) is None


def test_worker_wait_gives_each_row_the_model_workers_schedstat() -> None:
    import worker_wait

    engine, worker = {"1": "100 900 5"}, {"2": "800 200 9"}
    first = {"schedstat": engine, "worker_schedstat": worker, "stat": "cpu 1"}
    rows: list[dict[str, Any]] = [
            {"t": 10.0, "phase": "a", "text": "x", "cpu": first},
            {"t": 25.0, "phase": "a", "text": "x", "cpu": {"schedstat": engine}},
            {"t": 40.0, "phase": "a", "text": "x", "cpu": {"schedstat": engine}},
            {"t": 55.0, "phase": "", "text": ""}]
    side = ([24.8, 41.0], [{"2": "1600 300 12"}, {"2": "2400 400 15"}])
    out, missing = worker_wait.convert(rows, side, within_s=0.5)
    assert out[0]["cpu"]["schedstat"] == worker and out[0]["cpu"]["stat"] == "cpu 1"  # its own row's read
    assert out[1]["cpu"]["schedstat"] == {"2": "1600 300 12"}  # the side read 0.2 s away
    assert "cpu" not in out[2] and missing == 1  # the nearest read 1 s away: no wait for it
    assert out[3] == rows[3] and rows[1]["cpu"]["schedstat"] == engine  # the input rows untouched
    assert worker_wait.convert(rows[1:2], None, 0.5)[1] == 1  # no worker's read anywhere


def test_vllm21s_wander_follows_the_hosts_speed_and_vllm22s_does_not() -> None:
    """The model in vLLM's engine core on one thread (record_vllm.py --uni-executor --omp-threads 1): vllm21's slow
    windows all had the probe slower, its slope 0.64 narrowing the log ITL mean by a third; vllm22's slower
    stretch (after its injected slowdown) had the probe flat (README, thirty-third step)."""
    def calm_of(name: str) -> list[dict[str, Any]]:
        rows = host_speed.rows_of(DETECTION / name)
        return [r for r in rows if r["phase"] == "stationary_b" and r["window"] >= 2]

    c21, c22 = calm_of("recorded-vllm-capacity4-uni1.jsonl.gz"), calm_of("recorded-vllm-capacity4-uni1b.jsonl.gz")
    med = statistics.median(r["cpu_us_per_step"] for r in c21)
    probe = statistics.median(r["mv4_us"] for r in c21)
    slow = [r for r in c21 if r["cpu_us_per_step"] >= 1.15 * med]
    assert len(slow) >= 10 and all(r["mv4_us"] >= 1.1 * probe for r in slow)
    slope, sd, _ = host_speed.elasticity(c21).split(", ")
    raw = statistics.stdev(math.log(r["itl_ms"]) for r in c21)
    assert 0.5 < float(slope) < 0.8 and float(sd) < 0.75 * raw
    _, sd22, _ = host_speed.elasticity(c22).split(", ")
    assert float(sd22) > 0.85 * statistics.stdev(math.log(r["itl_ms"]) for r in c22)


def test_run_gives_the_monitor_a_probed_streams_host_speed() -> None:
    import run

    sig = [s for phase, _, s, _, _ in run.windows(DETECTION / "recorded-vllm-capacity4-uni1.jsonl.gz")
           if phase == "stationary_b"]
    assert len(sig) > 100 and all(s["host_probe_us"] > 0 for s in sig)
    unprobed = [s for _, _, s, _, _ in run.windows(DETECTION / "recorded-vllm-capacity4-long.jsonl.gz")]
    assert unprobed and all("host_probe_us" not in s for s in unprobed)


def test_vllm23s_wander_is_its_own_cpus_speed() -> None:
    """The probe pinned on the CPU the engine core's busiest thread was on (record_vllm.py --speed-probe, the
    thirty-fourth step): the log ITL mean on that index at a slope near 1, the spread it leaves half the raw and
    below the unpinned index's; the index of the three tasks explains the earlier uni streams at a slope near 1
    too, and the multiprocess executor's stream not at all."""
    def calm_of(name: str) -> list[dict[str, Any]]:
        rows = host_speed.rows_of(DETECTION / name)
        return [r for r in rows if r["phase"] == "stationary_b" and r["window"] >= 2]

    c23 = calm_of("recorded-vllm-capacity4-uni1c.jsonl.gz")
    y = [math.log(r["itl_ms"]) for r in c23]

    def left_at_1(key: str, calm: list[dict[str, Any]]) -> float:
        return statistics.stdev(math.log(r["itl_ms"] / r[key]) for r in calm)
    own = [math.log(r["own_index"]) for r in c23]
    assert 0.7 < statistics.linear_regression(own, y).slope < 1.3
    assert left_at_1("own_index", c23) < 0.5 * statistics.stdev(y)
    assert left_at_1("own_index", c23) < left_at_1("unpinned_index", c23)
    assert {"cpu0_index", "cpu1_index", "own_index", "unpinned_index"} <= set(c23[0])
    for name in ("recorded-vllm-capacity4-uni.jsonl.gz", "recorded-vllm-capacity4-uni1.jsonl.gz",
                 "recorded-vllm-capacity4-uni1b.jsonl.gz"):
        calm = calm_of(name)
        x, yy = [math.log(r["unpinned_index"]) for r in calm], [math.log(r["itl_ms"]) for r in calm]
        assert 0.9 < statistics.linear_regression(x, yy).slope < 1.2, name
        assert "own_index" not in calm[0]  # recorded before the probe followed the engine
    mp = calm_of("recorded-vllm-capacity4-probe.jsonl.gz")
    assert host_speed.corr([r["unpinned_index"] for r in mp], [r["itl_ms"] for r in mp]) < 0.4


def test_run_reads_the_probe_as_asked() -> None:
    import run

    from tuner.monitor.hostspeed import probe_index

    path = DETECTION / "recorded-vllm-capacity4-uni1c.jsonl.gz"
    rows = {b["t"]: b for _, _, _, _, b in run.windows(path)}
    for how in ("index", "own", "mv4_us"):
        for _, t, sig, _, _ in run.windows(path, host_probe=how):
            speed = rows[t]["speed"]
            want = (probe_index(speed) if how == "index" else probe_index(speed["own"]) if how == "own"
                    else speed["mv4_us"])
            assert sig["host_probe_us"] == want
    assert host_speed.readings({"runs": 0.0}) == {}  # a window the probe did not run in
    # the own and unpinned readings' geometric mean, where a row holds both
    got = host_speed.readings(rows[max(rows)]["speed"])
    assert got["own+unpinned"] == pytest.approx(math.sqrt(got["own"] * got["unpinned"]))
    older = DETECTION / "recorded-vllm-capacity4-uni1b.jsonl.gz"  # recorded before the probe followed the engine
    args = run.parser().parse_args(["--streams", f"v={older}", "--tuned", "none", "--held-out", "v/stationary_b",
                                    "--host-probe", "own", "--host-speed-elasticity", "1"])
    with pytest.raises(SystemExit, match="holds no such reading"):
        run.setup(args)
