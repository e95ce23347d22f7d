"""An input's learnt spread at its upper 0.99 bound (MonitorConfig.input_confidence): the request rate's test holds
its share of the false-alarm budget on Poisson arrivals, where the 0.9 bound let it alarm several times as often."""

from __future__ import annotations

import math

import numpy as np

from tuner.monitor.classify import Monitor
from tuner.monitor.config import MonitorConfig

RATE_PER_S, WINDOW_S = 10.0, 4.0  # an H200 stream's rate at its 4-s windows: 40 arrivals a window


def _learnt_rate_scales(confidence: float, baselines: int, seed: int) -> list[float]:
    cfg = MonitorConfig(interval_s=WINDOW_S, input_confidence=confidence)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(baselines):
        m = Monitor(cfg)
        for i, count in enumerate(rng.poisson(RATE_PER_S * WINDOW_S, cfg.learn_windows)):
            m.observe(WINDOW_S * i, {"rate_per_s": count / WINDOW_S})
        baseline = m.tracks["rate_per_s"].baseline
        assert baseline is not None
        out.append(baseline.scale)
    return out


def test_the_rate_spread_is_rarely_learnt_below_the_poisson_one() -> None:
    true_sd = math.sqrt(RATE_PER_S * WINDOW_S) / WINDOW_S
    below = {c: sum(s < true_sd for s in _learnt_rate_scales(c, 1000, seed=7)) for c in (0.9, 0.99)}
    # 1 in 100 by the bound's own share (the centre's error widening it a little, a Poisson count's heavier
    # tails than the normal the bound assumes more): 17 of 1000 here, 74 at 0.9
    assert below[0.99] <= 25
    assert below[0.9] >= 3 * below[0.99]


def _rate_drifts(confidence: float, hours: float, seed: int) -> int:
    """Drift events over `hours` of Poisson arrivals, in streams of 4 h each learning its own baseline."""
    cfg = MonitorConfig(interval_s=WINDOW_S, input_confidence=confidence)
    rng = np.random.default_rng(seed)
    n = int(4 * 3600 / WINDOW_S) + cfg.learn_windows
    events = 0
    for _ in range(round(hours / 4)):
        m = Monitor(cfg)
        for i, count in enumerate(rng.poisson(RATE_PER_S * WINDOW_S, n)):
            events += sum(e.kind == "drift" for e in m.observe(WINDOW_S * i, {"rate_per_s": count / WINDOW_S}))
    return events


def test_stationary_poisson_arrivals_raise_no_drift_beyond_the_budget() -> None:
    """1200 h: the rate test's share of one false alarm a day over 23 tests is 2.2 alarms (1 here); at 0.9 it
    raised 12."""
    assert _rate_drifts(MonitorConfig().input_confidence, 1200, seed=3) <= 3
    assert _rate_drifts(0.9, 1200, seed=3) >= 8
