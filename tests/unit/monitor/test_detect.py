"""The CUSUM, its threshold from a false-alarm rate, the baseline and the change's location."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from tuner.monitor.detect import (
    Baseline,
    Cusum,
    Transform,
    ar1_mean_factor,
    arl0,
    change_index,
    lag1,
    smallest_rise,
    threshold,
    windows_to_find,
)


def run_length(h: float, k: float, rng: random.Random, cap: int = 100_000) -> int:
    c = Cusum(h, k, "up")
    for n in range(1, cap + 1):
        if c.update(rng.gauss(0, 1)):
            return n
    return cap


def test_threshold_gives_the_chosen_false_alarm_rate_by_simulation() -> None:
    # 24 windows a day, one test, 0.1 false alarms a day: ARL0 = 240 windows; simulate the real run length
    h = threshold(0.1, 3600.0, 1, k=1.0)
    assert arl0(h, 1.0) == pytest.approx(240, rel=1e-6)
    rng = random.Random(7)
    mean = sum(run_length(h, 1.0, rng) for _ in range(400)) / 400
    assert 0.75 * 240 < mean < 1.35 * 240  # Siegmund's approximation is within a few percent for k = 1


def test_threshold_rises_with_more_tests_and_fewer_alarms() -> None:
    base = threshold(1.0, 60.0, 10, k=1.0)
    assert threshold(1.0, 60.0, 40, k=1.0) > base
    assert threshold(0.1, 60.0, 10, k=1.0) > base
    assert threshold(1.0, 10.0, 10, k=1.0) > base  # more windows a day
    with pytest.raises(ValueError):
        threshold(0.0, 60.0, 10, k=1.0)


def test_cusum_finds_a_shift_of_two_sigma_in_a_few_windows_and_resets() -> None:
    h = threshold(1.0, 60.0, 30, k=1.0)
    c = Cusum(h, 1.0, "both")
    rng = random.Random(1)
    assert all(c.update(rng.gauss(0, 1)) is None for _ in range(50))
    n = next(i for i in range(1, 50) if c.update(rng.gauss(-4, 1)) == "down")
    assert n <= 3 and c.statistic == 0.0


def test_one_sided_cusum_ignores_the_other_direction() -> None:
    c = Cusum(3.0, 1.0, "up")
    assert all(c.update(-10.0) is None for _ in range(10))
    assert c.update(10.0) == "up"


def test_baseline_is_robust_and_floored() -> None:
    b = Baseline.learn([10, 10.5, 9.5, 10, 1000], floor=0.1)  # one outlier: the median holds
    assert b.centre == 10
    assert Baseline.learn([0.0] * 10, floor=0.5).scale == pytest.approx(0.5 * 1.1 ** 0.5)  # the resolution
    with pytest.raises(ValueError):
        Baseline.learn([], floor=1)


def test_a_baseline_on_its_watched_scale() -> None:
    rng = random.Random(2)
    rates = [rng.gauss(4.0, 0.4) for _ in range(200)]
    b = Baseline.learn(rates, floor=0.01, transform="sqrt")
    assert b.transform == "sqrt" and abs(b.level - 4.0) < 0.2  # the level in the signal's own unit
    assert 0.08 < b.scale < 0.14  # sd(sqrt x) ~ sd(x) / (2 sqrt(mean)) = 0.1
    assert b.z(b.level) == pytest.approx(0.0) and b.z(4 * b.level) == pytest.approx(b.centre / b.scale)
    lengths = Baseline.learn([rng.lognormvariate(math.log(100), 0.1) for _ in range(200)], floor=1, transform="log")
    assert abs(lengths.level - 100) < 3 and 0.08 < lengths.scale < 0.13
    assert lengths.z(lengths.level * 1.5) == pytest.approx(math.log(1.5) / lengths.scale)
    # the floors, in the signal's unit, taken to its scale at the median
    grow = 1.1 ** 0.5
    assert Baseline.learn([4.0] * 10, floor=0.01, transform="sqrt").scale == pytest.approx((4.01 ** 0.5 - 2) * grow)
    assert Baseline.learn([4.0] * 10, floor=0.01, transform="sqrt", rel_floor=0.1).scale == pytest.approx(
        (4.4 ** 0.5 - 2) * grow)
    assert Baseline.learn([0.0] * 10, floor=0.01, transform="sqrt").scale == pytest.approx(0.1 * grow)  # idle
    assert Baseline.learn([100.0] * 10, floor=1, transform="log").scale == pytest.approx(0.01 * grow)
    assert Baseline.learn([100.0] * 10, floor=1, transform="log", rel_floor=0.05).scale == pytest.approx(0.05 * grow)
    assert Baseline.learn([100.0] * 10, floor=1, rel_floor=0.05).scale == pytest.approx(5 * grow)


@pytest.mark.parametrize("transform", ["identity", "log", "sqrt"])
def test_the_shift_of_a_change_on_each_scale(transform: Transform) -> None:
    b = Baseline.learn([9.0, 10.0, 11.0, 10.0], floor=0.01, transform=transform)
    level = b.level
    assert level == pytest.approx(10.0)
    up, down = b.shift_of(0.5, "up"), b.shift_of(0.5, "down")
    assert b.z(level * 1.5) * b.scale == pytest.approx(up)  # the shift is what the change moves z by
    assert -b.z(level / 1.5) * b.scale == pytest.approx(down)
    assert b.shift_of(0.5, "both") == pytest.approx(min(up, down))
    if transform == "log":
        assert up == pytest.approx(down) == pytest.approx(math.log(1.5))  # symmetric: a ratio either way
    else:
        assert down < up  # falling to 1 / 1.5 moves less than growing by 1.5 on a concave or linear scale


def test_change_index_locates_the_step() -> None:
    vals = [1.0, 1.1, 0.9, 1.0, 1.05, 3.0, 3.1, 2.9]
    assert change_index(vals) == 5
    assert change_index([1.0, 2.0]) is None


def test_autocorrelated_windows_widen_the_scale() -> None:
    rng = random.Random(3)
    x, ar = 0.0, []
    for _ in range(400):
        x = 0.7 * x + rng.gauss(0, 1)
        ar.append(x)
    rho = lag1(ar)
    assert rho is not None and 0.55 < rho < 0.85
    assert lag1([1.0, 1.0, 1.0, 1.0]) is None and lag1([1.0, 2.0]) is None
    iid = Baseline.learn(ar, floor=0.01)
    wide = Baseline.learn(ar, floor=0.01, rho=rho)
    assert wide.scale == pytest.approx(iid.scale * ((1 + rho) / (1 - rho)) ** 0.5)
    assert Baseline.learn(ar, floor=0.01, rho=-0.5).scale == iid.scale  # never narrower


def test_the_autocorrelation_widens_to_the_spread_of_a_mean_of_so_many_windows() -> None:
    """With a horizon the scale is that of the mean of so many consecutive windows of the AR(1) series: measured
    on a simulated one, narrower than the long-run scale and wider than none."""
    rng = random.Random(5)
    rho, x, ar = 0.3, 0.0, []
    for _ in range(60000):
        x = rho * x + rng.gauss(0, 1)
        ar.append(x)
    sd1 = statistics.pstdev(ar)
    for n in (1, 2, 3, 8):
        means = [statistics.fmean(ar[i:i + n]) for i in range(0, len(ar) - n, n)]
        measured = statistics.pstdev(means) * math.sqrt(n) / sd1  # the mean's spread over independent windows'
        assert ar1_mean_factor(rho, n) == pytest.approx(measured, rel=0.04)
    assert ar1_mean_factor(rho, 1) == 1.0
    assert 1.0 < ar1_mean_factor(rho, 3) < ar1_mean_factor(rho, 30) < ar1_mean_factor(rho) == pytest.approx(
        math.sqrt(1.3 / 0.7))
    vals = ar[:20]
    long_run = Baseline.learn(vals, floor=0.01, rho=rho)
    three = Baseline.learn(vals, floor=0.01, rho=rho, horizon=3)
    assert three.scale == pytest.approx(long_run.scale * ar1_mean_factor(rho, 3) / ar1_mean_factor(rho))


def test_windows_to_find_a_slowdown_grow_with_the_noise_and_end_at_the_allowance() -> None:
    cusum = Cusum(h=4.0, k=1.25, direction="up")
    found_in = [windows_to_find(Baseline(centre=math.log(8.0), scale=s, transform="log"), cusum, 0.3)
                for s in (0.04, 0.08, 0.15, 0.25)]
    assert found_in[0] < found_in[1] < found_in[2] < 40 and found_in[0] < 2
    assert math.isinf(found_in[3])  # log 1.3 = 0.26 is 1.05 scales: within k = 1.25, found only by chance
    # the ARL the function gives is the one simulated CUSUMs take (Siegmund's approximation, within 15 %)
    rng = random.Random(3)
    shift = math.log(1.3) / 0.08
    runs = []
    for _ in range(2000):
        c, n = Cusum(h=4.0, k=1.25, direction="up"), 0
        while True:
            n += 1
            if c.update(rng.gauss(shift, 1.0)) == "up":
                break
        runs.append(n)
    assert statistics.fmean(runs) == pytest.approx(found_in[1], rel=0.15)


@pytest.mark.parametrize("transform", ["log", "identity", "sqrt"])
def test_the_smallest_rise_found_in_time_is_the_inverse_of_windows_to_find(transform: Transform) -> None:
    level = 8.0
    baseline = Baseline(centre=math.log(level) if transform == "log" else math.sqrt(level) if transform == "sqrt"
                        else level, scale=0.1, transform=transform)
    cusum = Cusum(h=4.0, k=1.25, direction="up")
    rises = [smallest_rise(baseline, cusum, w) for w in (1, 2, 3, 5, 12)]
    assert all(a > b > 0 for a, b in zip(rises, rises[1:], strict=False))  # sooner: only a larger rise
    for w, frac in zip((1, 2, 3, 5, 12), rises, strict=True):
        assert windows_to_find(baseline, cusum, frac) == pytest.approx(w, rel=1e-6)
    # given long enough, anything beyond the allowance: the allowance's own rise, found only by chance at it
    slow = smallest_rise(baseline, cusum, 1000)
    assert baseline.shift_of(slow, "up") == pytest.approx(cusum.k * baseline.scale)
    assert math.isinf(windows_to_find(baseline, cusum, slow * 0.999))
    # a noisier baseline sees only larger rises
    noisy = Baseline(centre=baseline.centre, scale=0.2, transform=transform)
    assert smallest_rise(noisy, cusum, 5) > rises[3]
    assert math.isinf(smallest_rise(Baseline(centre=0.0, scale=1.0), cusum, 5))  # no level: no share of it
    assert math.isinf(smallest_rise(baseline, cusum, 0))
