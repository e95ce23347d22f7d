"""Change detection: a two-sided CUSUM (Page 1954) on standardised residuals, one per signal and direction.

Each signal's window value x, on its watched scale (the log of a latency or a length; Transform),
is standardised against its baseline (the champion's own
behaviour: the median and spread of the first `learn_windows` windows after a (re)start),
z = (x - centre) / scale, and fed to

    S+ = max(0, S+ + z - k)      (an increase)      S- = max(0, S- - z - k)      (a decrease)

which alarms when S > h and then starts again from 0. `k` is half the shift (in standard deviations of one
window) the test is tuned to find fastest. The threshold h is not set by hand: it is the smallest h whose
in-control average run length (windows between false alarms, Siegmund's approximation for Gaussian residuals,
ARL0 = (exp(2kb) - 2kb - 1) / (2k^2) with b = h + 1.166) gives at most `false_alarms_per_day` false alarms
per day over all the tests the monitor runs at its scrape interval. experiments/detection measures how close
the real streams come to that.

After an alarm, `ruptures` (binary segmentation, least-squares cost) places the change inside the buffered
series: the window where the signal moved, for the record and its plot.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from scipy.optimize import brentq
from scipy.stats import chi2, norm

Direction = Literal["up", "down", "both"]
# the scale a signal is watched on: its own (identity), its log (latencies, lengths: multiplicative, right-skewed
# noise), or its square root (a count's rate: Poisson noise, whose variance is its mean, has a constant one there;
# tried for the request rate, experiments/detection, and not shipped: a doubling moves it fewer of its scales)
Transform = Literal["identity", "log", "sqrt"]
SECONDS_PER_DAY = 86400.0


def arl(h: float, drift: float) -> float:
    """Average run length (windows) of a one-sided CUSUM of threshold h on unit-variance residuals whose mean
    increment (their mean minus the allowance k) is `drift`, nonzero (Siegmund's approximation)."""
    b = h + 1.166
    return (math.exp(-2 * drift * b) + 2 * drift * b - 1) / (2 * drift * drift)


def windows_to_find(baseline: Baseline, cusum: Cusum, frac: float) -> float:
    """The mean windows (Siegmund) a signal's one-sided upward CUSUM takes to find its level x(1 + frac) at
    this baseline (its scale) and that CUSUM's k and h: inf where the shift is within the allowance (its mean
    increment <= 0: found only by chance), what the signal's noise allows at the false-alarm budget."""
    if baseline.scale <= 0:
        return 1.0
    drift = baseline.shift_of(frac, "up") / baseline.scale - cusum.k
    return arl(cusum.h, drift) if drift > 0 else math.inf


def smallest_rise(baseline: Baseline, cusum: Cusum, windows: float) -> float:
    """The smallest rise of a signal's level (a fraction: x(1 + frac)) that its one-sided upward CUSUM takes at
    most `windows` windows on average to find at this baseline (Siegmund; windows_to_find's inverse): what its
    noise lets it see that soon. Past b^2 windows (b = h + 1.166, the run length as the shift nears the allowance)
    every shift beyond the allowance k is found in time: the allowance's own rise. inf for a level of 0 or less
    (no rise of it is a share of it) or no window to find it in."""
    if baseline.level <= 0 or windows <= 0:
        return math.inf
    if baseline.scale <= 0:
        return 0.0
    lo = 1e-4  # arl(h, d) falls from b^2 (d -> 0, where its formula loses its digits) towards 0
    if windows >= arl(cusum.h, lo):
        drift = 0.0
    else:  # the drift at which it is `windows`
        hi = 1.0
        while arl(cusum.h, hi) > windows:
            hi *= 2
        drift = float(brentq(lambda d: arl(cusum.h, d) - windows, lo, hi))
    shift = (drift + cusum.k) * baseline.scale
    return inverse(baseline.centre + shift, baseline.transform) / baseline.level - 1


def arl0(h: float, k: float) -> float:
    """In-control average run length (windows) of a one-sided CUSUM on N(0, 1) residuals (Siegmund)."""
    return arl(h, -k)


def threshold(false_alarms_per_day: float, interval_s: float, tests: int, k: float) -> float:
    """The CUSUM threshold h for at most `false_alarms_per_day` over `tests` one-sided tests, each run once per
    `interval_s` window: every test gets ARL0 = windows per day x tests / false alarms per day."""
    if false_alarms_per_day <= 0 or interval_s <= 0 or tests < 1 or k <= 0:
        raise ValueError("false_alarms_per_day, interval_s and k must be > 0 and tests >= 1")
    target = SECONDS_PER_DAY / interval_s * tests / false_alarms_per_day
    if target <= arl0(0.0, k):
        return 0.0
    return float(brentq(lambda h: arl0(h, k) - target, 0.0, min(200.0, 300.0 / k)))  # exp() stays finite


MAX_RHO = 0.8
MAD_SE = 1.166  # the standard error of the MAD's normal-consistent scale, in sigma / sqrt(n)


def lag1(values: Sequence[float], *, transform: Transform = "identity") -> float | None:
    """The lag-1 autocorrelation of a series (on the scale `transform` names); None with fewer than 4 values or
    none varying."""
    vals = [forward(v, transform) for v in values if math.isfinite(v)]
    if len(vals) < 4:
        return None
    m = statistics.fmean(vals)
    den = sum((v - m) ** 2 for v in vals)
    if den <= 0:
        return None
    return sum((a - m) * (b - m) for a, b in zip(vals, vals[1:], strict=False)) / den


def forward(x: float, transform: Transform) -> float:
    """`x` on the scale `transform` names."""
    if transform == "log":
        return math.log(max(x, 1e-12))
    if transform == "sqrt":
        return math.sqrt(max(x, 0.0))
    return x


def inverse(y: float, transform: Transform) -> float:
    """The value in the signal's own unit of `y` on the scale `transform` names."""
    if transform == "log":
        return math.exp(y)
    if transform == "sqrt":
        return max(y, 0.0) ** 2
    return y


CONFIDENCE = 0.9  # the upper confidence bound a baseline's spread is taken at (Baseline.learn)


def ar1_mean_factor(rho: float, windows: int | None = None) -> float:
    """How much wider the mean of `windows` consecutive windows of an AR(1) series of lag-1 autocorrelation `rho`
    spreads than that of as many independent ones (sqrt(1 + 2 sum_j (1 - j/n) rho^j)); None: the long-run factor
    sqrt((1 + rho) / (1 - rho)), its limit."""
    if windows is None:
        return math.sqrt((1 + rho) / (1 - rho))
    n = max(1, windows)
    return math.sqrt(1 + 2 * sum((1 - j / n) * rho ** j for j in range(1, n)))


@dataclass(frozen=True)
class Baseline:
    """A signal's normal value and the spread of one window around it, on its watched scale (Transform)."""

    centre: float
    scale: float
    transform: Transform = "identity"

    @property
    def level(self) -> float:
        """The normal value in the signal's own unit."""
        return inverse(self.centre, self.transform)

    @classmethod
    def learn(cls, values: Sequence[float], floor: float, confidence: float = CONFIDENCE, *,
              transform: Transform = "identity", rel_floor: float = 0.0, rho: float = 0.0, robust: bool = False,
              centre: tuple[float, int] | None = None, horizon: int | None = None) -> Baseline:
        """The median, and as scale the larger of the MAD's normal-consistent scale and the upper `confidence`
        bound of the standard deviation (chi-square), times sqrt(1 + 1/n) for the centre's own error: a
        baseline learnt from n windows misjudges both, and a CUSUM fed a scale too small alarms far more often
        than its threshold promises. At least `floor` (the resolution below which a change means nothing: a
        queue of 0.5 requests, 1 % errors) and `rel_floor` of the median, both in the signal's unit and taken
        to its watched scale there. `rho`, the windows' lag-1 autocorrelation (> 0: a slow neighbour
        moves several windows together), widens the scale to the long-run one of an AR(1) series,
        sqrt((1 + rho) / (1 - rho)): the CUSUM sums windows, and correlated windows sum to more than independent
        ones would. `robust`: the scale from the MAD alone, at its upper `confidence` bound (its standard
        error is 1.166 sigma / sqrt(n)), for a signal whose noise is a calm body with rare far episodes (a
        latency on a shared host, whose episodes the expectation's own uncertainty covers): a standard
        deviation would make the scale of the episodes the scale of every window. `centre`: (the centre on the
        watched scale, the number of windows it was learnt from) kept as it is, the scale alone learnt from
        `values` (an input's longer history: a tighter bound on its spread, its normal where it was put).
        `horizon` (windows): `rho` widens the scale to that of the mean of so many consecutive windows instead of
        the long-run one (ar1_mean_factor): a CUSUM whose allowance is large sums only a few windows before it
        resets or alarms."""
        vals = [v for v in values if math.isfinite(v)]
        if not vals:
            raise ValueError("no values to learn a baseline from")
        med = statistics.median(vals)
        if transform == "log":  # the floor becomes relative: `floor` units at the median, or rel_floor
            floor = max(rel_floor, floor / max(med, 1e-12))
        elif transform == "sqrt":  # what `floor` units, or rel_floor of it, above the median are on the root scale
            root = math.sqrt(max(med, 0.0))
            floor = max(math.sqrt(root ** 2 + floor) - root, root * (math.sqrt(1 + rel_floor) - 1))
        else:
            floor = max(floor, rel_floor * abs(med))
        vals = [forward(v, transform) for v in vals]
        n = len(vals)
        mid = statistics.median(vals)
        mad = statistics.median(abs(v - mid) for v in vals) * 1.4826
        if robust:
            sd = mad * (1 + norm.ppf(confidence) * MAD_SE / math.sqrt(n))
            mad = 0.0
        else:
            sd = statistics.stdev(vals) * math.sqrt((n - 1) / chi2.ppf(1 - confidence, n - 1)) if n > 1 else 0.0
        rho = min(max(rho, 0.0), MAX_RHO)
        at, n_at = centre if centre is not None else (mid, n)
        return cls(centre=at, scale=max(sd, mad, floor) * math.sqrt(1 + 1 / n_at) * ar1_mean_factor(rho, horizon),
                   transform=transform)

    def z(self, x: float) -> float:
        return (forward(x, self.transform) - self.centre) / self.scale

    def shift_of(self, frac: float, direction: Direction) -> float:
        """How far the signal moves on its watched scale when its level grows by 1 + frac (`up`), falls to
        1 / (1 + frac) of it (`down`), or the smaller of the two (`both`): the shift a CUSUM designed to find
        that change takes half of as its allowance."""
        up = forward(self.level * (1 + frac), self.transform) - self.centre
        down = self.centre - forward(self.level / (1 + frac), self.transform)
        return up if direction == "up" else down if direction == "down" else min(up, down)


@dataclass
class Cusum:
    """One signal's two one-sided CUSUMs."""

    h: float
    k: float
    direction: Direction = "both"
    up: float = 0.0
    down: float = 0.0

    def update(self, z: float) -> Literal["up", "down"] | None:
        """Feed one standardised residual; the side that alarmed (and was reset), else None."""
        if self.direction in ("up", "both"):
            self.up = max(0.0, self.up + z - self.k)
            if self.up > self.h:
                self.reset()
                return "up"
        if self.direction in ("down", "both"):
            self.down = max(0.0, self.down - z - self.k)
            if self.down > self.h:
                self.reset()
                return "down"
        return None

    def reset(self) -> None:
        self.up = self.down = 0.0

    @property
    def statistic(self) -> float:
        return max(self.up, self.down)


@dataclass
class SignalTrack:
    """A signal's recent values (for the plot), their residuals against the expectation (for the baseline and
    the change's location), its baseline and its CUSUM."""

    name: str
    cusum: Cusum
    floor: float
    baseline: Baseline | None = None
    times: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    # what the baseline is about: the value divided by its expectation (tuner.monitor.expect), else the value
    residuals: list[float] = field(default_factory=list)
    # a histogram quantile's bucket bounds per window (tuner.monitor.signals.bucket_keys; None: not bucketed)
    buckets: list[tuple[float, float] | None] = field(default_factory=list)
    usual_bucket: tuple[float, float] | None = None  # the bucket the baseline's windows were in most often
    keep: int = 360

    def add(self, t: float, x: float, residual: float | None = None,
            bucket: tuple[float, float] | None = None) -> None:
        self.times.append(t)
        self.values.append(x)
        self.residuals.append(x if residual is None else residual)
        self.buckets.append(bucket)
        if len(self.values) > self.keep:
            del self.times[0], self.values[0], self.residuals[0], self.buckets[0]

    def residuals_at(self, times: set[float]) -> list[float]:
        """The residuals of the windows ending at `times`, in order."""
        return [r for t, r in zip(self.times, self.residuals, strict=True) if t in times]

    def learn_bucket(self, windows: int) -> None:
        """usual_bucket from the latest `windows` windows."""
        seen = Counter(b for b in self.buckets[-windows:] if b is not None)
        self.usual_bucket = seen.most_common(1)[0][0] if seen else None

    def bucket_error(self) -> float:
        """The last window's extra uncertainty (log scale) from bucketing: 0 in the usual bucket; in another,
        the interpolation's unknown offset in either bucket (uniform over its log width: width / sqrt 12), the
        two together. A quantile that crossed an edge into a wide bucket moved less than its value says."""
        now, usual = self.buckets[-1] if self.buckets else None, self.usual_bucket
        if now is None or usual is None or now == usual:
            return 0.0
        return math.hypot(_log_width(now), _log_width(usual)) / math.sqrt(12.0)


def _log_width(bucket: tuple[float, float]) -> float:
    lo, hi = bucket
    return math.log(hi / lo) if lo > 0 and math.isfinite(hi) else math.inf


def change_index(values: Sequence[float]) -> int | None:
    """Where the mean of `values` moved (ruptures' binary segmentation, one breakpoint, l2 cost): the index of
    the first value after the change, or None with too few values."""
    if len(values) < 4:
        return None
    import numpy as np
    import ruptures

    sig = np.asarray(values, dtype=float).reshape(-1, 1)
    bkps = ruptures.Binseg(model="l2", min_size=1, jump=1).fit(sig).predict(n_bkps=1)
    return int(bkps[0]) if bkps and bkps[0] < len(values) else None


@dataclass(frozen=True)
class LevelShift:
    """A level shift inside a stretch of windows (level_shift): where, by how much, and how sure."""

    index: int  # the first window after it
    moved_log: float  # the mean of the log after it minus the one before
    t: float  # the two-sample t statistic of that move (pooled spread)


def level_shift(values: Sequence[float], *, min_log: float, floor_log: float, p: float,
                min_size: int = 2) -> LevelShift | None:
    """One level shift of positive `values` on the log scale: ruptures' binary segmentation (one breakpoint, l2
    cost, each side at least `min_size` windows) places it, and it counts where the log means moved by at least
    `min_log` and a two-sample t-test (the pooled spread at least `floor_log`) rejects no move at the two-sided
    level `p`, Bonferroni-corrected over the breakpoints the segmentation could choose. None where it does not
    hold or there are too few values or one is not positive."""
    n = len(values)
    if n < 2 * min_size or min(values) <= 0:
        return None
    import numpy as np
    import ruptures
    from scipy.stats import t as student

    logs = np.log(np.asarray(values, dtype=float))
    bkps = ruptures.Binseg(model="l2", min_size=min_size, jump=1).fit(logs.reshape(-1, 1)).predict(n_bkps=1)
    i = int(bkps[0]) if bkps else n
    if not min_size <= i <= n - min_size:
        return None
    before, after = logs[:i], logs[i:]
    moved = float(after.mean() - before.mean())
    if abs(moved) < min_log:
        return None
    pooled = ((before.var() * len(before) + after.var() * len(after)) / (n - 2)) ** 0.5
    stat = moved / (max(float(pooled), floor_log) * math.sqrt(1 / len(before) + 1 / len(after)))
    choices = n - 2 * min_size + 1
    if abs(stat) < student.isf(p / 2 / choices, n - 2):
        return None
    return LevelShift(i, moved, stat)
