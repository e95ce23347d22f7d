"""The detection experiment's latencies against the host's speed (experiments/detection/latency_speed.py): the fit
of a latency's log on the probe's, and the script on a committed stream."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[3]
DETECTION = ROOT / "experiments" / "detection"
sys.path.insert(0, str(DETECTION))

import latency_speed  # noqa: E402


def test_a_latency_moving_with_half_the_probes_log_has_an_elasticity_of_a_half() -> None:
    rng = np.random.default_rng(0)
    probe = rng.normal(3.3, 0.1, 200)
    corr, slope, raw, at_slope, at_one = latency_speed.fit(probe, 0.5 * probe + 1.0)
    assert corr == pytest.approx(1.0) and slope == pytest.approx(0.5)
    assert at_slope == pytest.approx(0.0, abs=1e-9) and at_one == pytest.approx(raw)  # at 1: the wander inverted
    still = latency_speed.fit(probe, np.full(200, 2.0))  # a quantile held inside its bucket
    assert np.isnan(still[0]) and still[1] == pytest.approx(0.0, abs=1e-9) and still[2] == 0.0


def test_the_script_fits_each_latency_on_a_recorded_probed_stream() -> None:
    proc = subprocess.run([sys.executable, str(DETECTION / "latency_speed.py"),
                           str(DETECTION / "recorded-vllm-capacity4-uni1c.jsonl.gz"), "--host-probe", "own+index"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    rows = {cells[2]: cells for line in proc.stdout.splitlines()
            if line.startswith("| recorded") and len(cells := [c.strip() for c in line.split("|")]) > 8}
    assert set(rows) == set(latency_speed.LATENCIES)
    itl = rows["itl_ms_mean"]
    assert int(itl[3]) >= 60 and float(itl[4]) > 0.8  # vLLM's CPU build at capacity follows the probe closely
    assert float(itl[7]) < float(itl[6])  # judged at its slope, its spread narrower than raw
    bad = subprocess.run([sys.executable, str(DETECTION / "latency_speed.py"), "no-such-stream.jsonl.gz"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bad.returncode != 0 and "no-such-stream.jsonl.gz: no such file" in bad.stderr
