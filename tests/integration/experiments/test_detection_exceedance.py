"""The detection experiment's histogram shares (experiments/detection/exceedance.py): the share of a window's
requests above a bucket edge, read from the bucket counts, and the script on a committed stream."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.measure.scrape import Hist, Snapshot

ROOT = Path(__file__).resolve().parents[3]
DETECTION = ROOT / "experiments" / "detection"
sys.path.insert(0, str(DETECTION))

import exceedance  # noqa: E402


def test_a_windows_counts_are_the_difference_of_its_scrapes() -> None:
    before = Snapshot(hists={"ttft_ms": Hist({0.01: 5.0, 0.02: 8.0, math.inf: 10.0}, sum=0.15, count=10.0)})
    after = Snapshot(hists={"ttft_ms": Hist({0.01: 9.0, 0.02: 16.0, math.inf: 30.0}, sum=0.75, count=30.0)})
    got = exceedance.deltas(before, after, "ttft_ms")
    assert got is not None
    cum, n, total = got
    assert cum == {0.01: 4.0, 0.02: 8.0, math.inf: 20.0} and n == 20.0 and total == pytest.approx(0.6)
    # 12 of the window's 20 above 20 ms: on the arcsine-square-root scale and back
    assert exceedance.share(math.asin(math.sqrt(1 - cum[0.02] / n))) == pytest.approx(0.6)
    assert exceedance.deltas(after, after, "ttft_ms") is None  # no request in the window: no evidence
    assert exceedance.deltas(before, after, "itl_ms") is None


def test_the_script_compares_each_histograms_share_with_the_itl_mean_on_a_recorded_stream() -> None:
    proc = subprocess.run([sys.executable, str(DETECTION / "exceedance.py"),
                           f"vllm27={DETECTION / 'recorded-vllm-open4-uni1.jsonl.gz'}"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    rows = {cells[2]: cells for line in proc.stdout.splitlines()
            if line.startswith("| vllm27 ") for cells in [[c.strip() for c in line.split("|")]]}
    assert set(rows) == {"ttft_ms", "itl_ms", "e2el_ms"}
    ttft = rows["ttft_ms"]
    # the slowdown moved the TTFT's share above vLLM's 20-ms edge up (its p90 crossed it); the ITL mean's shift is
    # the same in every row
    assert ttft[5] == "20 ms" and float(ttft[6].split()[0]) > 1.0
    assert len({r[7] for r in rows.values()}) == 1 and float(ttft[7].split()[0]) > 1.0


def test_the_script_names_a_stream_it_cannot_read() -> None:
    proc = subprocess.run([sys.executable, str(DETECTION / "exceedance.py"), "x=no-such.jsonl.gz"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode != 0 and "no-such.jsonl.gz: no such recorded stream" in proc.stderr
