"""The closed loop's sign (experiments/detection/closed_loop_sign.py) on the committed probes of the reference engine's
1-s windows: closed loops at capacity taken for closed ones and their users' doubling a drift from every start of
the monitor, an open loop of Poisson arrivals never taken for a closed one; and `record` writing a probe the table
reads (a short one, against the engine)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DETECTION = ROOT / "experiments" / "detection"
sys.path.insert(0, str(DETECTION))

import closed_loop_sign  # noqa: E402
from run import read_rows  # noqa: E402

from tuner.monitor.config import MonitorConfig  # noqa: E402


def _closed_share(path: Path) -> float:
    """The share of the stream's stretches taken for a closed loop (MonitorConfig.queued_steady)."""
    _, got = closed_loop_sign.stream_ratios(path)
    assert got
    return sum(r <= MonitorConfig.queued_steady for r, _ in got) / len(got)


@pytest.mark.parametrize("name", ["probe-capacity-busy2.jsonl.gz", "probe-capacity3.jsonl.gz"])
def test_a_closed_loop_at_capacity_is_one_and_its_users_doubling_a_drift_from_every_start(name: str) -> None:
    path = DETECTION / name
    assert _closed_share(path) >= 0.9
    (row,) = closed_loop_sign.probe_rows(path)
    assert "| 12/12 |" in row, row


def test_an_open_loop_at_one_second_windows_is_never_taken_for_a_closed_one() -> None:
    assert _closed_share(DETECTION / "probe-open-rate8.jsonl.gz") == 0.0


@pytest.mark.process
@pytest.mark.slow
def test_record_writes_a_probe_the_table_reads(tmp_path: Path) -> None:
    out = tmp_path / "probe.jsonl.gz"
    p = subprocess.run([sys.executable, str(DETECTION / "closed_loop_sign.py"), "record", "--out", str(out),
                        "--lead-s", "20", "--after-s", "12"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = read_rows(out)
    assert {r["phase"] for r in rows} == {"users2", "users4"}
    assert sum(r.get("starts_phase", False) for r in rows) == 1
    assert all(r["closed_concurrency"] == (4 if r["phase"] == "users4" else 2) for r in rows)
    assert _closed_share(out) >= 0.5  # stretches of 15 windows in 20 s of 2 users, and the join's in the rest
