"""Open-loop arrival processes: rate and dispersion (index of dispersion of counts)."""

from __future__ import annotations

import numpy as np
import pytest

from tuner.measure.workload import arrival_times


def dispersion(t: np.ndarray, window_s: float) -> tuple[float, float]:
    """(mean count per window, variance/mean of counts) over whole windows."""
    n_win = int(t[-1] // window_s)
    counts = np.bincount((t // window_s).astype(int), minlength=n_win + 1)[:n_win]
    return float(counts.mean()), float(counts.var() / counts.mean())


def test_poisson_has_the_rate_and_dispersion_one() -> None:
    rng = np.random.default_rng(1)
    t = arrival_times("poisson", 100.0, 40_000, rng)
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
    rate = (len(t) - 1) / t[-1]
    assert rate == pytest.approx(100.0, rel=0.03)
    mean, idc = dispersion(t, 0.5)
    assert mean == pytest.approx(50.0, rel=0.03)
    assert 0.85 < idc < 1.15


def test_gamma_is_burstier_than_poisson_at_the_same_rate() -> None:
    rng = np.random.default_rng(2)
    t = arrival_times("gamma", 100.0, 40_000, rng, burstiness=0.25)
    assert (len(t) - 1) / t[-1] == pytest.approx(100.0, rel=0.05)
    _, idc = dispersion(t, 1.0)
    assert idc > 2.5  # a gamma renewal process with shape k has dispersion -> 1/k = 4
    smooth = arrival_times("gamma", 100.0, 40_000, np.random.default_rng(3), burstiness=4.0)
    assert dispersion(smooth, 1.0)[1] < 0.5


def test_constant_arrivals_are_evenly_spaced() -> None:
    t = arrival_times("constant", 50.0, 101, np.random.default_rng(0))
    assert np.allclose(np.diff(t), 0.02)
    assert t[-1] == pytest.approx(2.0)


def test_unknown_kind_is_rejected() -> None:
    with pytest.raises(ValueError, match="not an open-loop"):
        arrival_times("closed", 1.0, 3, np.random.default_rng(0))
