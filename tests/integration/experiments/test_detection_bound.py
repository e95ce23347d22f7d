"""The detection experiment's bound (experiments/detection/bound.py): the fewest windows in which a test at the
false-alarm budget finds a shift, checked against its own arithmetic, against the shipped monitor on series whose
noise is known, and on committed streams."""

from __future__ import annotations

import math
import random
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from scipy.stats import norm

from tuner.monitor.classify import Monitor
from tuner.monitor.config import TESTS, MonitorConfig

ROOT = Path(__file__).resolve().parents[3]
DETECTION = ROOT / "experiments" / "detection"
sys.path.insert(0, str(DETECTION))

import bound  # noqa: E402


def test_the_sum_of_windows_spread_is_the_ar1_one() -> None:
    assert bound.sum_sd(1, 0.6) == pytest.approx(1.0)
    assert bound.sum_sd(2, 0.0) == pytest.approx(math.sqrt(2))
    assert bound.sum_sd(3, 0.5) == pytest.approx(math.sqrt(3 + 2 * (2 * 0.5 + 0.25)))


def test_one_window_is_enough_only_past_the_budgets_quantile() -> None:
    arl0 = 5760 * TESTS
    z = norm.isf(1 / arl0)
    assert bound.fewest_windows(z + 0.01, 0.0, arl0) == 1
    assert bound.fewest_windows(z - 0.01, 0.0, arl0) == 2
    assert bound.fewest_windows(0.01, 0.0, arl0) == math.inf
    # correlated windows say less: a slow wander looks like a shift
    assert bound.fewest_windows(2.0, 0.6, arl0) > bound.fewest_windows(2.0, 0.0, arl0)


def test_a_test_of_the_innovations_sees_a_correlated_streams_first_changed_window_as_the_surprise() -> None:
    arl0 = 5760 * TESTS
    for shift in (0.5, 2.0, 3.5, 6.0):  # independent windows: the two tests are one
        assert bound.fewest_windows_innovations(shift, 0.0, arl0) == bound.fewest_windows(shift, 0.0, arl0)
    # a wandering stream (rho 0.65): its level test needs windows, its innovations see the step at once
    assert bound.fewest_windows(3.6, 0.65, arl0) == 3 and bound.fewest_windows_innovations(3.6, 0.65, arl0) == 1


def overall_median_delay(shift_sd: float, rho: float, trials: int, seed: int) -> float:
    """The shipped monitor's median delay (a miss counts as never) on log ITL means of a stationary Gaussian AR(1)
    series (sd 0.1) that moves up by shift_sd of its sds after 40 windows."""
    cfg = MonitorConfig(interval_s=15.0)
    rng = random.Random(seed)
    delays = []
    for _ in range(trials):
        m = Monitor(cfg)
        x = rng.gauss(0, 1)
        found = math.inf
        for i in range(40 + 24):
            x = rho * x + math.sqrt(1 - rho * rho) * rng.gauss(0, 1)
            level = 0.1 * x + (0.1 * shift_sd if i >= 40 else 0.0)
            events = m.observe(15.0 * i, {"itl_ms_mean": 10.0 * math.exp(level)})
            if i >= 40 and any(e.kind == "anomaly" for e in events):
                found = i - 40 + 1
                break
        delays.append(found)
    return statistics.median(delays)


@pytest.mark.parametrize(("shift_sd", "rho"), [(2.5, 0.0), (3.5, 0.3), (6.0, 0.0)])
def test_the_shipped_monitor_never_beats_the_bound(shift_sd: float, rho: float) -> None:
    """No detector at the budget finds a shift sooner in the median than the bound: the monitor, which learns what
    the bound is told, is at or behind it."""
    arl0 = 5760 * TESTS
    floor = bound.fewest_windows(shift_sd, rho, arl0)
    assert overall_median_delay(shift_sd, rho, trials=60, seed=int(shift_sd * 10)) >= floor


def test_bound_prints_each_streams_bound_and_what_the_monitor_learns() -> None:
    proc = subprocess.run([sys.executable, str(DETECTION / "bound.py"), "--streams",
                           f"quiet10={DETECTION / 'recorded-quiet10.jsonl.gz'}",
                           f"h200r16={DETECTION / 'recorded-h200-slowdown-rate16.jsonl.gz'}", "--cut", "h200r16=5",
                           "--sim-model", str(ROOT / "experiments" / "sim-calibration" / "model-cpu.json")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {(c[1].strip(), c[6].strip()): [x.strip() for x in c] for c in
            (r.split("|") for r in proc.stdout.splitlines() if r.startswith("| quiet10") or r.startswith("| h200r16"))}
    assert set(rows) == {(s, c) for s in ("quiet10", "h200r16") for c in
                         ("slowdown30 (recorded)", "latencies x1.3 (model)", "latencies x2 (model)")}
    # the recorded +30 % slowdown: 3 windows at the least on the quiet host at 4 req/s, 2 on the H200 (the table's)
    assert rows[("quiet10", "slowdown30 (recorded)")][12] == "3"
    assert rows[("h200r16", "slowdown30 (recorded)")][12] == "2"
    # a server twice as slow is more of the noise than one 1.3 times as slow, on each stream
    for s in ("quiet10", "h200r16"):
        assert float(rows[(s, "latencies x2 (model)")][8]) > float(rows[(s, "latencies x1.3 (model)")][8])


def test_bound_names_the_file_and_the_rule_when_a_stream_cannot_be_used() -> None:
    proc = subprocess.run([sys.executable, str(DETECTION / "bound.py"), "--streams",
                           str(DETECTION / "recorded.jsonl.gz")], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode != 0 and not proc.stdout
    assert "recorded.jsonl.gz: the phase stationary_b needs at least" in proc.stderr and "rate_x2" in proc.stderr
