"""Noise estimates: pooled CV, intervals, LCB ranking, 'within the noise'."""

import math

import pytest

from tuner.search.noise import estimate, lcb, pooled_cv, within_noise


def test_pooled_cv_uses_only_repeated_samples() -> None:
    assert pooled_cv([[100.0]]) is None
    cv = pooled_cv([[99.0, 101.0], [198.0, 202.0], [500.0]])
    assert cv == pytest.approx(math.sqrt((2 * 0.01**2 + 2 * 0.01**2) / 2))


def test_interval_narrows_with_repeats_and_is_a_point_without_an_estimate() -> None:
    one = estimate([100.0], 0.05)
    three = estimate([100.0, 100.0, 100.0], 0.05)
    assert one.low < three.low < 100.0 < three.high < one.high
    assert estimate([100.0], None).half_width == 0.0
    with pytest.raises(ValueError):
        estimate([], 0.05)


def test_lcb_prefers_a_repeated_trial_to_a_lucky_single_run() -> None:
    lucky, steady = [106.0], [103.0, 102.0, 104.0]
    assert lcb(steady, 0.05) > lcb(lucky, 0.05)
    assert lcb([10.0, 10.0], 0.05, maximize=False) > 10.0  # minimising: the pessimistic end is the high one


def test_within_noise() -> None:
    base = estimate([100.0, 101.0, 99.0], 0.05)
    assert within_noise(estimate([104.0], 0.05), base)
    assert not within_noise(estimate([150.0, 151.0], 0.05), base)
