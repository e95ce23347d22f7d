"""The prepared GPU experiment scripts run end to end on the CPU (their --smoke modes), so the one
device call a GPU session can afford does not fail on a script error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = ROOT / "experiments" / "h200-engine"


def test_bench_decode_smoke_writes_a_row_per_attention_and_batch_and_the_diagnoses(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPTS / "bench_decode.py"), "--smoke", "--diagnose",
                           "--device", "cpu", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (tmp_path / "decode.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith(("| sdpa |", "| matmul |"))]
    assert [r.split("|")[1:3] for r in rows] == [[" sdpa ", " 1 "], [" sdpa ", " 4 "], [" matmul ", " 1 "],
                                                 [" matmul ", " 4 "]]
    assert "One layer's attention alone" in text
    assert "| matmul (engine: attention=matmul) |" in text
    assert text.count("### Kernels of one decode step") == 2
    assert "- attention=matmul against sdpa (eager step, batch 4): greedy agreement 100%" in text
    assert "| flash |" not in text and "attention=flash" not in text  # its kernel does not run on a CPU


def test_bench_decode_rejects_an_unknown_attention_and_one_that_cannot_run(tmp_path: Path) -> None:
    for impl, error in (("paged", "--attention: 'paged' is not one of sdpa, matmul, flash"),
                        ("sdpa,flash", "--attention: flash cannot run on cpu in float32: the flash kernel runs in "
                                       "bfloat16 or float16 only")):
        proc = subprocess.run([sys.executable, str(SCRIPTS / "bench_decode.py"), "--smoke", "--device", "cpu",
                               "--attention", impl, "--out", str(tmp_path)],
                              capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert proc.returncode == 2
        assert error in proc.stderr


def test_tune_smoke_runs_trials_and_writes_the_baseline_against_the_best(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPTS / "tune.py"), "--smoke", "--trials", "2",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (tmp_path / "tune.md").read_text()
    assert "| baseline |" in text and "| best (trial" in text
    assert "tuned goodput / baseline goodput:" in text
    trial_rows = [line for line in text.splitlines() if line.startswith(("| 0 |", "| 1 |"))]
    assert len(trial_rows) == 2 and "attention=sdpa" in trial_rows[0]


def test_bench_measure_times_graph_replays_and_checks_them_against_the_eager_step() -> None:
    """The bench's graph branch (GPU only in a run) on the CPU, with the graph stand-in passed to its Runner."""
    import dataclasses
    import importlib.util

    from tests.support.gpu_doubles import RerunGraphs
    from tuner.engine.config import EngineConfig
    from tuner.engine.engine import Engine
    from tuner.engine.runner import Runner

    spec = importlib.util.spec_from_file_location("bench_decode", SCRIPTS / "bench_decode.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cfg = EngineConfig(device="cpu", max_model_len=300, kv_pool_mb=4, pre_allocate=True, batching="continuous",
                       max_batch_size=4, cuda_graphs=True, cuda_graph_max_batch=4)
    graphs = RerunGraphs()
    engine = Engine(cfg, emit=lambda items: None, graph_backend=graphs)
    engine.load()
    eager = Runner(dataclasses.replace(cfg, cuda_graphs=False), engine.model, engine.pool, "cpu")
    graph = Runner(cfg, engine.model, engine.pool, "cpu", graph_backend=graphs)
    row = bench.measure(eager, graph, 3, 250, 1, 2, True)
    assert row["graph_ms"] > 0 and row["agree"] == 1.0 and row["logit_diff"] == 0.0
    assert graphs.captures == 1 and graphs.replays >= 3  # warm-up + timed steps + agreement, all replays
