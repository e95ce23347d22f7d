"""The detection experiment's request rate on Poisson arrivals (experiments/detection/poisson_rate.py): with the
rate's spread at least a Poisson count's (MonitorConfig.rate_poisson_floor) its test raises fewer drifts on
stationary arrivals than with the spread of 20 windows alone."""

from __future__ import annotations

import sys
from pathlib import Path

from tuner.monitor.detect import CONFIDENCE

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "experiments" / "detection"))

import poisson_rate  # noqa: E402

RATE_PER_S, WINDOW_S = 10.0, 4.0  # an H200 stream's rate at its 4-s windows: 40 arrivals a window


def test_stationary_poisson_arrivals_raise_fewer_drifts_with_the_floor() -> None:
    with_floor, without = (poisson_rate.poisson_false_alarms(RATE_PER_S, WINDOW_S, 1200, 4, 3, floor, CONFIDENCE)
                           for floor in (True, False))
    assert without >= 8
    assert with_floor <= without / 2
