"""The detection experiment's repeats.py: which of a stationary set's windows its window-by-window bootstrap's
false alarms are made of. A set's farthest windows are found on the log scale; on a recorded stream (vllm13) its row
counts the same events as run.py's table at the same hours (the same draws), each made of the set's one slow
window drawn twice."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DETECTION = ROOT / "experiments" / "detection"
sys.path.insert(0, str(DETECTION))

import repeats  # noqa: E402


def test_the_farthest_windows_on_the_log_scale() -> None:
    stat = [{"itl_ms_mean": v} for v in (10.0, 10.2, 9.9, 20.0, 10.1, 4.8, 10.0)]
    # x2.0 (index 3) and x0.48 (index 5) from the median 10.0: the latter is the farther on the log scale
    assert repeats.extremes(stat, "itl_ms_mean") == [5, 3]
    assert repeats.extremes([{"rate_per_s": 0.0}], "rate_per_s") == []
    assert repeats.extremes(stat, "rate_per_s") == []


def test_vllm13s_row_counts_run_pys_events_and_names_the_window_they_are_made_of() -> None:
    proc = subprocess.run([sys.executable, str(DETECTION / "repeats.py"), "--streams",
                           f"vllm13={DETECTION / 'recorded-vllm-capacity4.jsonl.gz'}", "--tuned", "none",
                           "--held-out", "vllm13/stationary_b", "--sim-model",
                           str(ROOT / "experiments" / "sim-calibration" / "model-cpu.json"), "--hours", "240"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = next(r for r in proc.stdout.splitlines() if r.startswith("| held out (`vllm13"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    table = (DETECTION / "table-vllm13-blind.md").read_text()
    run_row = next(r for r in table.splitlines() if "vllm13/stationary_b`) | bootstrap, window by window | 240 |" in r)
    assert cells[3] == run_row.split("|")[4].strip()  # the same events as run.py's row at 240 h
    assert int(cells[3]) > 0 and cells[4].startswith(f"{cells[3]} ("), cells  # every one a repeat
    assert cells[7].startswith("9: itl_ms_mean x1.1"), cells  # the set's slow window (ITL 5.05 ms, median 4.26)

