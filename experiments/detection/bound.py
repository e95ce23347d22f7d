"""What a stream's noise allows: the fewest windows in which any test of the server's level at the false-alarm
budget finds a slowdown in half the trials, against the shipped detector's learnt noise.

    python experiments/detection/bound.py --streams quiet10=recorded-quiet10.jsonl.gz ... \
        --sim-model ../sim-calibration/model-cpu.json

For each stream's steady state (its stationary phase after the warm-up cut, run.py's MSER-5 or --cut) the
log ITL mean the monitor judges (its residual: over the champion's expectation, corrected for the CPU wait) has
a spread sigma and a lag-1 autocorrelation rho, measured over the whole stationary stretch (what a detector
would know if it had watched it all). A slowdown moves that log by delta: the recorded phase `slowdown30`'s
median against the stationary one's (a real +30 % per step), or log 1.3 and log 2 (the modelled slowdowns).

The bound: a test that judges the mean of the latest n windows (what a CUSUM sums) against the known normal,
with the noise of a stationary AR(1) series of that sigma and rho (the variance of a sum of n windows,
sigma^2 (n + 2 sum_j (n - j) rho^j)), finds the shift in half the trials when n delta / sd(sum) reaches the
one-sided normal quantile of its false-alarm probability. Any detector of the windows' levels (a CUSUM, an
EWMA, a Shewhart chart) that alarms within n windows of the change in half the trials, and at most once in ARL0
windows on stationary traffic, meets that on those n windows (Neyman-Pearson, with alpha = n / ARL0): its median
delay is at least that n. A detector that models the autocorrelation (one of the AR(1) innovations, with the
past known) sees the first window after a change as a larger surprise where rho > 0: its own bound, a column too,
is sooner there (and rests on the model being exact, heavy tails and wander aside). ARL0 is the budget's:
windows per day x the one-sided tests sharing it / false alarms per day (the shipped detector's 23 tests), and,
the most generous, with the whole budget given to this one test. Assumptions: Gaussian noise on the log scale,
correlation no longer-ranged than AR(1), parameters known exactly (a detector learns them from 20 windows and
pays for it: the last columns, its learnt scale against sigma and Siegmund's windows for that scale).
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
from scipy.stats import norm

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import run  # noqa: E402

from tuner.monitor.classify import MAX_SLOWDOWN_WINDOWS, Monitor  # noqa: E402
from tuner.monitor.config import TESTS, MonitorConfig  # noqa: E402
from tuner.monitor.detect import SECONDS_PER_DAY, Baseline, Cusum, lag1, smallest_rise, windows_to_find  # noqa: E402
from tuner.monitor.expect import ChampionExpectation  # noqa: E402
from tuner.monitor.hostspeed import TASKS  # noqa: E402
from tuner.monitor.signals import LATENCIES  # noqa: E402

Window = run.Window
MAX_WINDOWS = 60
MIN_STEADY = 8  # steady windows a spread and an autocorrelation are measured from


def sum_sd(n: int, rho: float) -> float:
    """The standard deviation, in sigmas, of the sum of n consecutive windows of a stationary AR(1) series of
    lag-1 autocorrelation rho."""
    return math.sqrt(n + 2 * sum((n - j) * rho ** j for j in range(1, n)))


def fewest_windows(shift: float, rho: float, arl0: float) -> float:
    """The fewest windows n in which the mean of n windows, shifted by `shift` sigmas, reaches the false-alarm
    threshold of alpha = n / arl0 (one-sided) in half the trials; inf past MAX_WINDOWS."""
    for n in range(1, MAX_WINDOWS + 1):
        if n * shift / sum_sd(n, rho) >= norm.isf(min(0.5, n / arl0)):
            return float(n)
    return math.inf


def fewest_windows_innovations(shift: float, rho: float, arl0: float) -> float:
    """The same for a test that knows the AR(1) model and its past (Neyman-Pearson on the innovations
    x_t - rho x_(t-1), which a step moves by shift at once and by (1 - rho) shift after): the first window after a
    change is a surprise of shift / sqrt(1 - rho^2) sds, so for rho > 0 it can be sooner than a test of levels."""
    rho = min(max(rho, -0.99), 0.99)
    for n in range(1, MAX_WINDOWS + 1):
        snr = shift * math.sqrt((1 + (n - 1) * (1 - rho) ** 2) / (1 - rho * rho))
        if snr >= norm.isf(min(0.5, n / arl0)):
            return float(n)
    return math.inf


def log_residuals(windows: list[Window], cfg: MonitorConfig, expect: ChampionExpectation | None
                  ) -> dict[str, list[float]]:
    """Each latency's log residual the monitor judges, window by window (over the expectation, times 1 - the CPU
    wait; nan where a window has none), from the monitor's own code."""
    m = Monitor(cfg, expect)
    keep = m.tracks["itl_ms_mean"].keep
    if len(windows) > keep:
        raise SystemExit(f"bound.py: {len(windows)} windows, more than a track keeps ({keep})")
    for i, w in enumerate(windows):
        m.observe(cfg.interval_s * i, w)
    # read at the end: a baseline's check of the CPU wait's law (MonitorConfig.wait_checked) turns the residuals
    # stored before it to its form
    out: dict[str, list[float]] = {}
    for n in LATENCIES:
        tr = m.tracks[n]
        at = dict(zip(tr.times, tr.residuals, strict=True))
        out[n] = [math.log(r) if (r := at.get(cfg.interval_s * i, 0.0)) > 0 else math.nan for i in range(len(windows))]
    return out


def pooled(res: dict[str, list[float]], sigmas: dict[str, float]) -> list[float]:
    """The latencies' equal-weight index: the mean of their log residuals over their own sigmas (windows where
    all of them are read)."""
    rows = zip(*(res[n] for n in sigmas), strict=True)
    return [statistics.fmean(v / sigmas[n] for n, v in zip(sigmas, row, strict=True)) for row in rows
            if all(math.isfinite(v) for v in row)]


def mahalanobis(res: dict[str, list[float]], shifts: dict[str, float]) -> float:
    """The shift of the latencies together in sds of the best linear combination of them (sqrt(d' S^-1 d), S their
    windows' covariance, its inverse's upward bias (n - 1) / (n - p - 2) taken out): the most any test of the
    latencies' levels can see in one window, where the noise is Gaussian and S known."""
    names = [n for n in shifts if n in res]
    rows = np.array([row for row in zip(*(res[n] for n in names), strict=True)
                     if all(math.isfinite(v) for v in row)])
    n, p = rows.shape
    if n <= p + 2:
        return math.nan
    d = np.array([shifts[k] for k in names])
    inv = np.linalg.inv(np.cov(rows, rowvar=False)) * (n - p - 2) / (n - 1)
    return float(math.sqrt(max(0.0, float(d @ inv @ d))))


def finite(vals: list[float]) -> list[float]:
    return [v for v in vals if math.isfinite(v)]


def learnt(stat: list[Window], cfg: MonitorConfig, expect: ChampionExpectation | None,
           step: int) -> list[tuple[float, float, float]]:
    """(scale, k, h) of the ITL mean's baseline and CUSUM the shipped monitor learns from each start (every
    `step` windows) of the steady state, as run.py's trials start."""
    out = []
    for i in range(0, len(stat) - cfg.learn_windows, step):
        m = Monitor(cfg, expect)
        for j, w in enumerate(stat[i:i + cfg.learn_windows + 1]):
            m.observe(cfg.interval_s * j, w)
        tr = m.tracks["itl_ms_mean"]
        if tr.baseline is not None:
            out.append((tr.baseline.scale, tr.cusum.k, tr.cusum.h))
    return out


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", nargs="+", required=True, metavar="[LABEL=]PATH",
                    help="recorded streams (run.py's); each needs a `stationary_b` phase")
    ap.add_argument("--sim-model", type=Path, default=None,
                    help="the step-cost model for the expectation of the CPU streams (their interval > 10 s)")
    ap.add_argument("--cut", nargs="+", default=[], metavar="LABEL=WINDOWS",
                    help="a stream's warm-up cut instead of MSER-5 (the H200 tables' 5)")
    ap.add_argument("--false-alarms-per-day", type=float, default=1.0)
    ap.add_argument("--every", type=int, default=1,
                    help="a window spans this many recorded scrape intervals (a slower scrape of the same traffic)")
    ap.add_argument("--step", type=int, default=5, help="windows between the starts of the learnt baselines")
    ap.add_argument("--host-speed-elasticity", type=float, default=None, metavar="E",
                    help="the latencies judged at the host's speed with this elasticity (run.py's option)")
    ap.add_argument("--host-probe", choices=("index", "own", "own+index", *TASKS), default="index",
                    help="what a probed stream's host_probe_us is (run.py's option)")
    return ap


class Steady(NamedTuple):
    """A stream bound.py reads: its label, phases, the monitor's config at its interval, the expectation and its
    steady state (stationary_b after the warm-up cut)."""

    label: str
    phases: dict[str, list[tuple[float, Window]]]
    cfg: MonitorConfig
    expect: ChampionExpectation | None
    stat: list[Window]


def steady_states(args: argparse.Namespace, cuts: dict[str, int]) -> list[Steady]:
    """Each stream's (label, phases, the monitor's config at its interval, the expectation, its steady state),
    every file and phase checked before anything is printed."""
    out: list[Steady] = []
    for arg in args.streams:
        label, _, path = arg.rpartition("=")
        label = label or Path(path).name
        if not Path(path).is_file():
            raise SystemExit(f"bound.py: --streams {arg}: no such file")
        phases, _ = run.load(Path(path), every=args.every, host_probe=args.host_probe)
        if len(phases.get("stationary_b", [])) < MIN_STEADY + 2:
            raise SystemExit(f"bound.py: {path}: the phase stationary_b needs at least {MIN_STEADY + 2} windows "
                             f"(it has {len(phases.get('stationary_b', []))}; phases: {', '.join(phases) or 'none'})")
        times = [t for t, _ in phases["stationary_b"]]
        interval = round(statistics.median(b - a for a, b in zip(times, times[1:], strict=False)))
        cfg = MonitorConfig(interval_s=interval, false_alarms_per_day=args.false_alarms_per_day,
                            host_speed_elasticity=args.host_speed_elasticity)
        expect = run.expectation(args.sim_model) if interval > 10 and args.sim_model else None
        windows = [w for _, w in phases["stationary_b"]]
        cut = (cuts[label] + args.every - 1) // args.every if label in cuts else run.warmup(windows, cfg, expect)
        stat = windows[cut:]
        if len(stat) < MIN_STEADY:
            raise SystemExit(f"bound.py: {path}: {len(stat)} windows of stationary_b after a cut of {cut}; "
                             f"the bound needs at least {MIN_STEADY}")
        out.append(Steady(label, phases, cfg, expect, stat))
    return out


def stream_rows(stream: Steady, args: argparse.Namespace) -> list[str]:
    """One stream's rows of the table: each change's shift and bounds, and what the shipped monitor learns."""
    label, phases, cfg, expect, stat = stream
    rows: list[str] = []
    interval = cfg.interval_s
    base = log_residuals(stat, cfg, expect)
    read = {n: finite(v) for n, v in base.items()}
    itl = read["itl_ms_mean"]
    sigma, rho = statistics.stdev(itl), lag1(itl) or 0.0
    sigmas = {n: statistics.stdev(v) for n, v in read.items() if len(v) > 2}
    index = pooled(base, sigmas)
    per_day = SECONDS_PER_DAY / interval
    arl_shared = per_day * TESTS / args.false_alarms_per_day
    arl_alone = per_day / args.false_alarms_per_day
    # (name, each latency's shift on its log residual, the pooled index's shift in its own sds)
    changes: list[tuple[str, dict[str, float], float]] = []
    if "slowdown30" in phases:  # a recorded slowdown: its windows after the stationary ones (the same expectation)
        after = log_residuals(stat[:cfg.learn_windows] + [w for _, w in phases["slowdown30"]], cfg, expect)
        after = {n: v[cfg.learn_windows:] for n, v in after.items()}
        shifts = {n: statistics.median(later) - statistics.median(read[n]) for n in sigmas
                  if (later := finite(after[n]))}
        moved = statistics.median(pooled(after, sigmas)) - statistics.median(index)
        changes.append(("slowdown30 (recorded)", shifts, moved / statistics.stdev(index)))
    for x in (1.3, 2.0):
        changes.append((f"latencies x{x:g} (model)", dict.fromkeys(sigmas, math.log(x)),
                        statistics.fmean(math.log(x) / sd for sd in sigmas.values()) / statistics.stdev(index)))
    fits = learnt(stat, cfg, expect, args.step)
    ratio = statistics.median(s for s, _, _ in fits) / sigma if fits else math.nan
    seen = statistics.median(smallest_rise(Baseline(0.0, s, "log"), Cusum(h, k), MAX_SLOWDOWN_WINDOWS)
                             for s, k, h in fits) if fits else math.nan
    for name, shifts, index_shift in changes:
        delta = shifts["itl_ms_mean"]
        shift = delta / sigma
        other = max((n for n in shifts if n != "itl_ms_mean"), key=lambda n: shifts[n] / sigmas[n])
        best = mahalanobis(base, shifts)
        sieg = [windows_to_find(Baseline(0.0, s, "log"), Cusum(h, k), math.exp(delta) - 1)
                for s, k, h in fits]
        sieg_med = statistics.median(sieg) if sieg else math.nan
        rows.append(f"| {label} | {interval} | {len(stat)} | {sigma:.3f} | {rho:+.2f} | {name} | {delta:+.3f} | "
              f"{shift:.2f} | {other} {shifts[other] / sigmas[other]:.2f} | {index_shift:.2f} | {best:.2f} | "
              f"{fewest_windows(shift, rho, arl_shared):g} | {fewest_windows(shift, rho, arl_alone):g} | "
              f"{fewest_windows_innovations(shift, rho, arl_shared):g} | "
              f"{fewest_windows(best, rho, arl_shared):g} | {ratio:.2f} | {sieg_med:.1f} | {100 * seen:+.0f} % |")
    return rows


def main() -> None:
    args = parser().parse_args()
    logging.getLogger("tuner.monitor").setLevel(logging.ERROR)
    cuts: dict[str, int] = {}
    for item in args.cut:
        name, _, n = item.partition("=")
        if not n.isdigit():
            raise SystemExit(f"bound.py: --cut {item}: LABEL=WINDOWS, a whole number of windows")
        cuts[name] = int(n)
    streams = steady_states(args, cuts)
    print(f"# What the noise allows ({time.strftime('%Y-%m-%d %H:%M')})\n")
    print("command: `python experiments/detection/bound.py " + " ".join(sys.argv[1:]) + "`\n")
    print("sigma, rho: the log ITL mean's spread and lag-1 autocorrelation over the steady state; delta: the "
          "slowdown's shift of it; fewest windows: the bound at the budget shared by "
          f"{TESTS} one-sided tests / given to this test alone (`inf`: not within {MAX_WINDOWS}) / for a test of the "
          "AR(1) innovations (one that knows the model and the past: the first window's surprise); the best other "
          "latency's shift, the six latencies' equal-weight index's and their best linear combination's (the "
          "shift's Mahalanobis length under their windows' covariance: the most any test of their levels sees in a "
          "window; its bound takes the ITL mean's rho), each in its own sds: whether another signal, or all of "
          "them, says more than the ITL mean; learnt: the shipped monitor's ITL-mean scale over sigma and "
          "Siegmund's mean windows for its CUSUM to find the shift and the smallest slowdown it finds within "
          f"{MAX_SLOWDOWN_WINDOWS:g} windows (Monitor.detectable_slowdown, the daemon's "
          "tuner_monitor_detectable_slowdown_frac), medians over its baselines from every few windows of the steady "
          "state.\n")
    print("| stream | window s | steady windows | sigma | rho | change | delta | delta / sigma | the best other "
          "latency's | the six pooled | the six, best combination | fewest windows, ITL mean (23 tests) | "
          "(this test alone) | (AR(1) innovations, 23 tests) | fewest windows, best combination (23 tests) | "
          "learnt scale / sigma | "
          "learnt: Siegmund windows | learnt: the smallest slowdown found within 12 windows |")
    print("|---|---:|---:|---:|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for stream in streams:
        print("\n".join(stream_rows(stream, args)))


if __name__ == "__main__":
    main()
