"""The detection experiment's GPU stream: record_gpu.py's smoke run on the CPU (its one device call must not fail on a
script error), and run.py replaying the stream recorded on the H200 with the GPU's own readings."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DETECTION = ROOT / "experiments" / "detection"


@pytest.mark.slow
def test_record_gpu_smoke_writes_every_phase_with_the_engine_and_gpu_readings(tmp_path: Path) -> None:
    out = tmp_path / "s.jsonl.gz"
    proc = subprocess.run([sys.executable, str(DETECTION / "record_gpu.py"), "--smoke", "--out", str(out)],
                          capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in gzip.open(out, "rt", encoding="utf-8")]
    phases = [r["phase"] for r in rows if r["phase"]]
    assert list(dict.fromkeys(phases)) == ["stationary_b", "gpu_neighbour_light", "rate_x2", "slowdown30"]
    assert all("vllm:" in r["text"] or "tuner" in r["text"] for r in rows if r["phase"] and r["text"])
    assert {r["neighbour"] for r in rows if r["phase"] == "gpu_neighbour_light"} == {"light"}
    # the slowed engine: a second one, its first seconds (phase '') not the change
    assert {r["step_slowdown_frac"] for r in rows if r["phase"] == "slowdown30"} == {0.3}
    assert {r["step_slowdown_frac"] for r in rows if r["phase"] == "stationary_b"} == {0.0}
    assert all(r["gpu"] == {} and r["gpu_instant"] == {} for r in rows)  # no NVML on this host: read, left out
    assert "| stationary_b |" in proc.stdout


def replay_injected(tag: str, stream: str, *changes: str) -> tuple[str, dict[str, list[str]]]:
    """run.py's injected changes (10 trials each, 5 windows cut, 5 before and up to 8 after) on one H200 stream's
    stationary_b, held out: its output, and the cells of each change's row."""
    proc = subprocess.run([sys.executable, str(DETECTION / "run.py"), "--streams", f"{tag}={DETECTION / stream}",
                           "--tuned", "none", "--held-out", f"{tag}/stationary_b", "--only-injected",
                           "--cut", f"{tag}/stationary_b=5", "--pre", "5", "--post", "8", "--trials", "10",
                           "--changes", *changes], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r.split("|")[2].strip(): r.split("|") for r in proc.stdout.splitlines() if r.startswith("| held out")}
    return proc.stdout, rows


def test_run_replays_the_h200_stream_with_its_own_gpu_readings() -> None:
    out, cells = replay_injected("h200r10", "recorded-h200-rate10.jsonl.gz", "gpu_neighbour", "gpu_throttle",
                                 "rate_x2")
    rows = {change: "|".join(c) for change, c in cells.items()}
    # the real neighbour found from the GPU's readings; the double's throttle not injected into a real GPU's
    assert set(rows) == {"gpu_neighbour", "rate_x2"}
    assert "anomaly/gpu_throttle 10" in rows["gpu_neighbour"] and "drift/inputs 10" in rows["rate_x2"]
    assert "| h200r10/gpu_neighbour | 100 | 689 |" in out  # the readings' medians: busy, at 690 W


def test_run_finds_a_real_gpu_server_slowdown_as_an_anomaly_from_the_monitors_window_means() -> None:
    """The 16-req/s H200 stream (recorded with the GPU's window means): the second engine, every step 1.3 times as
    long, found as a performance anomaly, never as drift; the GPU table from the monitor's readings."""
    out, rows = replay_injected("r16", "recorded-h200-slowdown-rate16.jsonl.gz", "slowdown30", "rate_x2")
    assert set(rows) == {"slowdown30", "rate_x2"}
    slow = rows["slowdown30"]
    assert slow[5].strip() == "10" and slow[11].strip() == "10/10" and "drift" not in slow[12]
    assert "drift/inputs 10" in rows["rate_x2"][12]
    assert "| r16/slowdown30 | 15.7 | 141 |" in out  # the window means: the slowed engine's GPU less busy


@pytest.mark.parametrize(("stream", "which", "rate", "seed"), [
    ("recorded-h200.jsonl.gz", "neighbours", 24.0, 500), ("recorded-h200-rate10.jsonl.gz", "neighbours", 10.0, 600),
    ("recorded-h200-slowdown-rate16.jsonl.gz", "slowdown", 16.0, 700),
    ("recorded-h200-slowdown-short-rate24.jsonl.gz", "slowdown-short", 24.0, 800)])
def test_each_committed_gpu_stream_is_what_its_plan_records(stream: str, which: str, rate: float, seed: int) -> None:
    """The committed H200 streams hold, phase by phase, the load seed, step slowdown and neighbour that
    record_gpu.plan() gives for the plan and seed the README names: `run_gpu.sh` with them records them again."""
    sys.path.insert(0, str(DETECTION))
    import record_gpu

    groups = record_gpu.plan(rate, which)
    load_seeds = record_gpu.seeds(groups, seed)
    want = {name: (str(load_seeds[name]), slowdown, kind)
            for slowdown, phases in groups for name, _, _, kind in phases if name}
    got: dict[str, tuple[str, float, str]] = {}
    for line in gzip.open(DETECTION / stream, "rt", encoding="utf-8"):
        r = json.loads(line)
        if r["phase"]:
            assert r["base_rate"] == rate
            got.setdefault(r["phase"], (r["load_seed"], r["step_slowdown_frac"], r["neighbour"]))
    assert got == want
