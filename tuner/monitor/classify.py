"""Alarms -> events. `Monitor` keeps a track per signal (tuner.monitor.detect), learns its baseline, runs the
CUSUMs and says what kind of change it saw:

- **drift** (the workload moved): an input signal (rate, prompt or output length) alarmed. Outputs that moved
  with it are part of the same event (more load is slower: no anomaly). The monitor then learns the new normal;
  the event carries the observed inputs for the next cycle to tune for.
- **anomaly** (the server got worse at the same load): an output, state or GPU signal alarmed and no input
  alarmed within `settle_windows` windows after it (twice as long while an input's CUSUM is past half its
  threshold: the load may be moving, more slowly than the latency it drives). A GPU throttle (throttle
  reasons, SM clock down) is an anomaly whose cause says so. Answer: tuner.monitor.respond.
- **saturation**: a limit is reached (KV cache usage >= `kv_full_frac`, DRAM active >= `dram_limit_frac`, for
  `sat_windows` windows) or the queue grows (Mann-Kendall trend test over the last `trend_windows` windows,
  one-sided p < `trend_p`, with at least one request waiting).
- **recovery**: after an anomaly, every signal that alarmed stayed within 2 standard deviations of its
  baseline for `recovery_windows` windows; after a saturation, its condition was false that long.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from scipy.stats import kendalltau

from tuner.measure.scrape import Snapshot
from tuner.monitor.contention import MAX_WAIT_FRAC
from tuner.monitor.detect import (
    SECONDS_PER_DAY,
    Baseline,
    Cusum,
    Direction,
    SignalTrack,
    Transform,
    change_index,
    lag1,
    threshold,
)
from tuner.monitor.expect import Expectation
from tuner.monitor.signals import GPU, INPUTS, LATENCIES, SIGNALS, MissingSeries, bucket_keys, window_signals
from tuner.spec import MonitorSpec

log = logging.getLogger(__name__)

EventKind = Literal["drift", "anomaly", "saturation", "recovery"]
KINDS: tuple[EventKind, ...] = ("drift", "anomaly", "saturation", "recovery")


@dataclass(frozen=True)
class SignalRule:
    direction: Direction  # which way a change matters
    floor_abs: float  # the resolution of the signal, in its unit (the baseline's smallest scale)
    transform: Transform = "identity"  # the scale it is watched on (tuner.monitor.detect.Transform)
    tested: bool = True  # False: an explanatory signal (the environment), recorded but never alarming


RULES: dict[str, SignalRule] = {
    # a length's windows have tails heavier than a Gaussian's on its own scale (a single long prompt moves a
    # window's mean), less so on the log one (experiments/detection's input_false_alarms.py); the rate stays on
    # its own, where a doubling moves it furthest (its square root cut its false alarms by a sixth, and made a
    # doubling take a window longer to find)
    "rate_per_s": SignalRule("both", 0.01), "prompt_tokens_mean": SignalRule("both", 1.0, "log"),
    "output_tokens_mean": SignalRule("both", 1.0, "log"),
    "ttft_ms_p50": SignalRule("up", 0.1, "log"), "ttft_ms_p90": SignalRule("up", 0.1, "log"),
    "itl_ms_mean": SignalRule("up", 0.05, "log"), "itl_ms_p90": SignalRule("up", 0.05, "log"),
    "e2el_ms_p50": SignalRule("up", 0.5, "log"), "e2el_ms_p90": SignalRule("up", 0.5, "log"),
    "error_frac": SignalRule("up", 0.01),
    # the requests in the server and their cache follow from the load and the latencies (Little's law), and
    # the token throughput from the rate and the output length while the server keeps up (when it does not,
    # its queue grows: saturation): tested again they would spend the false-alarm budget on what the inputs
    # and latencies already say, uncorrected for the environment; they feed the saturation rules
    "token_throughput_per_s": SignalRule("both", 1.0, tested=False),
    "running": SignalRule("both", 0.5, tested=False), "waiting": SignalRule("up", 0.5, tested=False),
    "kv_cache_usage_frac": SignalRule("up", 0.02, tested=False), "preemptions_per_s": SignalRule("up", 0.01),
    "gpu_util_pct": SignalRule("both", 2.0), "gpu_power_w": SignalRule("both", 5.0),
    "gpu_sm_clock_mhz": SignalRule("down", 15.0), "gpu_dram_active_frac": SignalRule("both", 0.02),
    "gpu_fb_used_mb": SignalRule("up", 256.0), "gpu_throttled": SignalRule("up", 0.05),
    "cpu_wait_frac": SignalRule("up", 0.02, tested=False), "cpu_steal_frac": SignalRule("up", 0.02, tested=False),
    "finished_per_s": SignalRule("both", 0.01, tested=False),
}
assert set(RULES) == set(SIGNALS)
TESTS = sum(2 if r.direction == "both" else 1 for r in RULES.values() if r.tested)  # one-sided tests per window
GPU_THROTTLE = ("gpu_throttled", "gpu_sm_clock_mhz")
LENGTHS = ("prompt_tokens_mean", "output_tokens_mean")  # means over the window's finished requests
OPEN_CAUSES = {"anomaly": ("latency", "gpu", "gpu_throttle"),  # the causes an open anomaly or saturation has
               "saturation": ("kv_full", "bandwidth", "queue_growing")}


@dataclass(frozen=True)
class MonitorConfig:
    interval_s: float = 60.0  # the scrape interval: one window
    false_alarms_per_day: float = 1.0  # over all signals; sets the CUSUM threshold
    # CUSUM allowance: half the shift (in scales of one window) found fastest. The changes worth finding are
    # 2.5 scales and more (a x2 rate at 2/s in 15-s windows ~4, a 30 % slower server 2.5-5 on its ITL); 1.0
    # (shifts of 2) met the delay goal less often for the same false-alarm rate (experiments/detection)
    k: float = 1.25
    # a latency's allowance is at least half the slowdown the monitor is to find (Page's design: the
    # reference is half the shift to detect; issue 24's +30 %), log(1 + frac) / 2 over its baseline's log
    # scale, and its threshold h the one for that allowance and the same share of the false-alarm budget: on a
    # quiet host, whose latency scale is small, 1.25 scales would be a shift of a few percent, and minutes of a
    # host slower by 10-16 % (experiments/detection) would add up to an alarm. None: k alone
    slowdown_to_find_frac: float | None = 0.3
    # an input's allowance likewise at least half the drift to find (a rate or a length 1 + frac times its
    # normal, or 1 / (1 + frac) of it) on its scale: the inputs' windows have heavy tails, and moderate
    # residuals summed over several windows made most of their false alarms (experiments/detection). None: k
    drift_to_find_frac: float | None = 0.5
    # residuals clipped to +-z_clip; by default (None) to h/2 + k + 0.25 (the signal's own h and k), where one
    # window, however far out, cannot alarm alone and two at the clip do: a burst of one window is no change
    z_clip: float | None = None
    rel_floor: float = 0.02  # a baseline's scale is at least this share of its centre
    # a latency's scale (log) is at least this: the smallest change of the server's speed worth an alarm (on the
    # streams of experiments/detection every latency's learnt scale was above it: it never bound there)
    latency_rel_floor: float = 0.05
    # an anomaly of latency quantiles alone (those not in `alone`) needs this many of them in alarm (a
    # slower server slows every request: its TTFT and end-to-end times move together), or one whose own
    # evidence goes on after its alarm (its CUSUM back at h/2 within `confirm_windows`): a quantile of a
    # window's few requests jumps across a histogram bucket alone (TTFT p90 on a quiet host: 22 of 120
    # windows at 1.5x its median), and two such windows in a row are no change of the server
    corroborate: int = 2
    confirm_windows: int = 2
    # quantiles of the same few requests count once toward `corroborate`: a window's p90s are its ~3 slowest
    # requests, and a request slow to its first token is slow to its end, so a few slow requests move the TTFT
    # p90 and the end-to-end p90 together (on the busy host of experiments/detection 25 of 28 replayed false
    # anomalies); a median moves only when half the requests do
    same_requests: tuple[tuple[str, ...], ...] = (("ttft_ms_p90", "e2el_ms_p90"),)
    # the latencies that alarm alone (the rest are corroborated as above): the ITL's mean, an exact sum over a
    # count. TTFT and end-to-end quantiles are of a window's few requests (a request or two move them across a
    # bucket at once). The ITL's p90 comes from every token but is interpolated inside a histogram bucket
    # (vLLM's 7.5, 10, 25 ms edges around a CPU server's 8-9 ms): a stall that stretches a few percent of the
    # steps across an edge moves it by half (+54 % in experiments/detection's quiet2 stall, the mean +16 %); a
    # slower server moves the mean as much as the p90, so the mean finds it alone
    alone: tuple[str, ...] = ("itl_ms_mean",)
    learn_windows: int = 20  # windows that make a baseline (after a start or a drift)
    # a fresh server warms up (its first minutes are slower: experiments/detection's engines 4-16 % on the ITL
    # for 2-7 minutes): while the learning windows' latency still falls (Mann-Kendall, one-sided p < warmup_p)
    # learning goes on by half of learn_windows, the baseline then from the latest learn_windows, at most
    # until warmup_max_factor x learn_windows have gone to it (warmup_p None: off). A baseline learnt on the
    # warm-up sits high and hides a slowdown of its size
    warmup_p: float | None = 0.01
    warmup_max_factor: int = 4
    settle_windows: int = 1  # an output alarm waits this long for an input alarm before it is an anomaly ...
    settle_evidence: float = 0.25  # ... while an input's CUSUM holds at least this share of h (else none)
    # latencies divided by 1 / (1 - w) where the wait is read: a server that waited a share w of the window for
    # a CPU (a noisy neighbour: cpu_wait_frac, and a hypervisor's other guests: cpu_steal_frac s, the two
    # together w = 1 - (1 - wait)(1 - s)) is expected to be 1 / (1 - w) times as slow
    contention: bool = True
    autocorrelation: bool = True  # latency scales widened by their pooled lag-1 autocorrelation (AR(1))
    # the CPU wait's own error (a share of the window): a latency corrected by 1 - w is uncertain by about
    # wait_error / (1 - w) on the log scale, which widens its scale in that window (and the next: the queue
    # a starved window built drains in the one after it)
    wait_error: float = 0.03
    robust: bool = False  # True: latency scales from the MAD (tuner.monitor.detect.Baseline.learn)
    # a latency quantile in another histogram bucket than its baseline's usual one is uncertain by both
    # buckets' interpolation (SignalTrack.bucket_error), which widens its scale in that window: vLLM's TTFT
    # buckets jump from 100 to 250 ms, and a server 14 % slower for two minutes took a TTFT median of 91 ms
    # across that edge to an interpolated 148 ms (+63 %, experiments/detection's quiet6)
    bucket_error: bool = True
    wait_law_error: float = 0.5
    wait_memory: int = 3  # windows whose CPU wait a latency's uncertainty takes (this one and those before)
    # a latency is not judged while the server waited more than this share of one of those windows: the
    # neighbours, not the server, set it then (the windows are counted in `unjudged`)
    max_wait_judged: float = 0.5
    recovery_windows: int = 3
    # the latencies' baselines learnt again, every learn_windows calm windows (judged, no latency alarm pending
    # and no anomaly open), from up to this many of the latest calm windows: a host whose speed wanders over
    # minutes is judged against its longer normal, not the first minutes' (None: the first baseline kept
    # until a drift). The cost: a slowdown slower than the CUSUM finds is partly learnt as normal
    history_windows: int | None = None
    kv_full_frac: float = 0.95
    dram_limit_frac: float = 0.85
    sat_windows: int = 2
    trend_windows: int = 8
    # the queue trend's one-sided p-value; by default (None) the false-alarm budget's share of one window,
    # false_alarms_per_day x interval_s / 86400 (a test run every window at 0.01 would alarm daily)
    trend_p: float | None = None

    @property
    def h(self) -> float:
        return threshold(self.false_alarms_per_day, self.interval_s, TESTS, self.k)

    @property
    def clip(self) -> float:
        return self.clip_for(self.h, self.k)

    def clip_for(self, h: float, k: float) -> float:
        """The residuals' clip for a CUSUM of threshold h and allowance k (z_clip where set)."""
        return self.z_clip if self.z_clip is not None else h / 2 + k + 0.25

    @classmethod
    def from_spec(cls, spec: MonitorSpec, interval_s: float) -> MonitorConfig:
        """The agent file's `watch.monitor` at the watch's scrape interval."""
        return cls(interval_s=interval_s, false_alarms_per_day=spec.false_alarms_per_day,
                   learn_windows=spec.learn_windows, settle_windows=spec.settle_windows,
                   recovery_windows=spec.recovery_windows, slowdown_to_find_frac=spec.slowdown_to_find_frac,
                   drift_to_find_frac=spec.drift_to_find_frac,
                   kv_full_frac=spec.kv_full_frac,
                   dram_limit_frac=spec.dram_limit_frac)


@dataclass
class Event:
    kind: EventKind
    time: float  # the end of the window that raised it (seconds since the epoch)
    window: int  # its index in the monitor's stream
    cause: str  # "inputs" | "latency" | "gpu_throttle" | ... | for a recovery, the kind it ends
    detail: str  # one line for logs and `tuner history`
    signals: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> direction, baseline, value, onset
    observed: dict[str, float] = field(default_factory=dict)  # a drift's new inputs (since its onset)
    series: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)  # for the plot

    def summary(self) -> dict[str, Any]:
        """JSON-ready, without the series."""
        return {"kind": self.kind, "time": self.time, "window": self.window, "cause": self.cause,
                "detail": self.detail, "signals": self.signals, "observed": self.observed}


@dataclass
class _Open:
    """An anomaly or a saturation the monitor waits to see recover."""

    kind: EventKind
    cause: str
    signals: dict[str, Direction]
    calm: int = 0


class Monitor:
    """The stateful monitor of one server: feed it a window at a time (`observe`) or scrapes (`scrape`)."""

    def __init__(self, config: MonitorConfig | None = None, expectation: Expectation | None = None) -> None:
        """`expectation`: the champion's expected outputs at the observed load (tuner.monitor.expect); the
        baselines are then learnt on the ratio of each output to it, so load moving within a window's noise,
        and the environment, do not look like a change of the server."""
        self.config = config or MonitorConfig()
        self.expectation = expectation
        self.h = self.config.h
        self.tracks = {name: SignalTrack(name, Cusum(self.config.h, self.config.k, RULES[name].direction),
                                         RULES[name].floor_abs) for name in SIGNALS}
        self.missing = MissingSeries()
        self.windows = 0
        self._learned = 0  # windows into the current baseline's learning
        self._spent = 0  # windows spent on it, with those of a warm-up (MonitorConfig.warmup_p)
        self._pending: dict[str, tuple[int, Literal["up", "down"]]] = {}  # output alarms awaiting inputs
        self._open: list[_Open] = []
        self._sat_run: dict[str, int] = {}
        self._last: tuple[float, Snapshot] | None = None
        self.last_signals: dict[str, float] = {}
        self._waits: list[float] = []
        self._wait_now: float | None = None  # the last window's share lost to neighbours (_wait), once a window
        self.unjudged = 0  # windows whose latencies were not judged (tuner.monitor.classify.MonitorConfig)
        self._blind = False
        self._blind_times: set[float] = set()  # ends of the windows not judged (nor learnt from)
        self._calm: list[float] = []  # ends of the calm windows since the baseline (MonitorConfig.history_windows)
        self._calm_new = 0
        self._rho = 0.0

    # ---------------------------------------------------------------- feeding
    def scrape(self, t: float, snap: Snapshot, gpu: Mapping[str, float] | None = None) -> list[Event]:
        """One scrape of the server's /metrics at time `t` (and the GPU signals read then): the window since
        the previous scrape, observed. The first scrape, or one after a server restart, opens no window."""
        last, self._last = self._last, (t, snap)
        if last is None or t <= last[0]:
            return []
        sig = window_signals(last[1], snap, t - last[0], self.missing)
        if sig is None:
            return []
        return self.observe(t, {**sig, **(gpu or {})})

    @property
    def opened(self) -> list[tuple[str, str]]:
        """(kind, cause) of every anomaly and saturation not yet recovered."""
        return [(o.kind, o.cause) for o in self._open]

    @property
    def learning(self) -> bool:
        return self._learned < self.config.learn_windows

    def residual(self, name: str, x: float) -> float:
        """`x` over what the champion is expected to show in this window (its load, its environment): what
        the signal's baseline and CUSUM are about. The signal itself where nothing is expected of it."""
        if name not in LATENCIES:
            return x
        if self.expectation is not None:
            x /= self.expectation.factor(name, self.last_signals)
        if self._wait_now is not None:
            x *= 1.0 - self._wait_now
        return x

    def _wait(self) -> float | None:
        """The share of the last window the server could not run (MonitorConfig.contention): its own wait for a
        CPU and the steal of its host's CPUs, 1 - (1 - wait)(1 - steal); None where neither is read (or the
        correction is off)."""
        shares = [self.last_signals[n] for n in ("cpu_wait_frac", "cpu_steal_frac") if n in self.last_signals]
        if not self.config.contention or not shares:
            return None
        return min(MAX_WAIT_FRAC, 1.0 - math.prod(1.0 - min(v, MAX_WAIT_FRAC) for v in shares))

    def _z(self, name: str) -> float:
        """The last window's standardised residual of a signal that has a baseline."""
        tr = self.tracks[name]
        assert tr.baseline is not None
        z = tr.baseline.z(tr.residuals[-1])
        done, usual = self.last_signals.get("finished_per_s"), self.tracks["finished_per_s"].baseline
        if name in LENGTHS and done is not None and usual is not None and usual.level > 0:
            z *= min(1.0, math.sqrt(done / usual.level))  # a mean of fewer requests than usual says less
        extra = 0.0  # the window's own uncertainty (log scale) on top of the baseline's scale
        if name in LATENCIES and self.config.contention and self._waits:
            w = min(max(self._waits), MAX_WAIT_FRAC)
            # the measured share's error, and the 1 / (1 - w) law's own (its exponent known to +- wait_law_error)
            extra = math.hypot(self.config.wait_error / (1.0 - w), self.config.wait_law_error * -math.log1p(-w))
        if name in LATENCIES and self.config.bucket_error:
            extra = math.hypot(extra, tr.bucket_error())
        if extra > 0:
            z *= tr.baseline.scale / math.hypot(tr.baseline.scale, extra)
        return z

    def _settled(self) -> bool:
        """Whether the output alarms pending have waited long enough for an input alarm that would make them
        part of a drift: not at all for a GPU throttle (no load sets a clocks-event reason) or while no
        input's CUSUM holds evidence of a change (at least `settle_evidence` of h); else `settle_windows`,
        twice that while an input's CUSUM is past half of h (the load may be moving, more slowly than the
        latency it drives)."""
        waited = max(self.windows - w for w, _ in self._pending.values())
        if all(n in GPU_THROTTLE for n in self._pending):
            return True
        evidence = max((self.tracks[n].cusum.statistic for n in INPUTS if self.tracks[n].baseline), default=0.0)
        if evidence < self.config.settle_evidence * self.h:
            return True
        return waited >= self.config.settle_windows * (2 if evidence > self.h / 2 else 1)

    def _corroborated(self) -> bool:
        """Whether the pending output alarms make an anomaly (see MonitorConfig.corroborate); a lone latency
        alarm whose evidence did not go on within `confirm_windows` is dropped."""
        lat = [n for n in self._pending if n in LATENCIES and n not in self.config.alone]
        evidence = {next((g for g in self.config.same_requests if n in g), n) for n in lat}
        if len(lat) < len(self._pending) or len(evidence) >= self.config.corroborate:
            return True
        for n in lat:
            since, side = self._pending[n]
            cusum = self.tracks[n].cusum
            if (cusum.up if side == "up" else cusum.down) >= cusum.h / 2 and self.windows > since:
                return True
            if self.windows - since >= self.config.confirm_windows:
                del self._pending[n]
        return False

    def observe(self, t: float, signals: Mapping[str, float]) -> list[Event]:
        """One window's signal values (any subset of tuner.monitor.signals.SIGNALS) ending at time `t`."""
        self.windows += 1
        self.last_signals = {k: float(v) for k, v in signals.items() if k in self.tracks and math.isfinite(v)}
        w = self._wait_now = self._wait()
        keep = self.config.wait_memory - 1
        self._waits = [*(self._waits[-keep:] if keep else []), w] if w is not None else []
        self._blind = bool(self._waits) and max(self._waits) > self.config.max_wait_judged
        if self._blind and self.learning:
            self._blind_times.add(t)
        for name, x in self.last_signals.items():
            lo, hi = (signals.get(k) for k in bucket_keys(name))
            bucket = (lo, hi) if lo is not None and hi is not None else None
            self.tracks[name].add(t, x, self.residual(name, x), bucket)
        events = self._saturation(t)
        if self.learning:
            self._learned += 1
            self._spent += 1
            if not self.learning:
                if self._warming():
                    self._learned -= max(1, self.config.learn_windows // 2)
                else:
                    self._learn()
            return events
        alarms: dict[str, Literal["up", "down"]] = {}
        blind = self._blind
        self.unjudged += blind and not self.learning
        for name in self.last_signals:
            tr = self.tracks[name]
            if tr.baseline is None or not RULES[name].tested or (blind and name in LATENCIES):
                continue
            z = self._z(name)
            clip = self.config.clip_for(tr.cusum.h, tr.cusum.k)
            side = tr.cusum.update(max(-clip, min(clip, z)))
            if side is not None:
                alarms[name] = side
        inputs = {n: s for n, s in alarms.items() if n in INPUTS}
        for n, s in alarms.items():
            if n in INPUTS:
                continue
            same = next((o for o in self._open if o.kind == "anomaly" and o.cause == _cause([n])), None)
            if same is not None:  # one more symptom of an anomaly already reported
                same.signals.setdefault(n, s)
            else:
                self._pending.setdefault(n, (self.windows, s))
        if inputs:
            events.append(self._drift(t, inputs))
            return events
        if self._pending and self._settled() and self._corroborated():
            due = {n: s for n, (_, s) in self._pending.items()}  # all the symptoms seen so far: one event
            self._pending.clear()
            events.append(self._anomaly(t, due))
        events.extend(self._recoveries(t))
        self._learn_history(t, blind)
        return events

    # ---------------------------------------------------------------- baselines
    def _learn(self) -> None:
        n = self.config.learn_windows
        self._rho = self._latency_rho() if self.config.autocorrelation else 0.0
        self._calm = [t for t in self.tracks["itl_ms_mean"].times[-n:] if t not in self._blind_times]
        self._calm_new = 0
        for tr in self.tracks.values():
            vals = tr.residuals[-n:]
            if tr.name in LATENCIES:  # learnt from the windows it would be judged in, where there are enough
                judged = [r for t, r in zip(tr.times[-n:], vals, strict=True) if t not in self._blind_times]
                vals = judged if len(judged) >= max(3, n // 2) else vals
            if len(vals) < max(3, n // 2):
                tr.baseline = None  # too few windows carried it (a signal that came and went)
                continue
            self._baseline(tr, vals)
            tr.cusum.reset()
        self._blind_times.clear()

    def _learn_history(self, t: float, blind: bool) -> None:
        """A calm window joins the latencies' history; every learn_windows of them the latencies' baselines are
        learnt again from it (MonitorConfig.history_windows), their CUSUMs going on."""
        c = self.config
        if c.history_windows is None or blind or any(n in LATENCIES for n in self._pending) \
                or any(o.kind == "anomaly" for o in self._open):
            return
        self._calm = [*self._calm[-(c.history_windows - 1):], t]
        self._calm_new += 1
        if self._calm_new < c.learn_windows:
            return
        self._calm_new = 0
        calm = set(self._calm)
        for name in LATENCIES:
            tr = self.tracks[name]
            vals = [r for u, r in zip(tr.times, tr.residuals, strict=True) if u in calm]
            if tr.baseline is None or len(vals) < c.learn_windows:
                continue
            self._baseline(tr, vals)

    def _baseline(self, tr: SignalTrack, vals: list[float]) -> None:
        """A track's baseline learnt from `vals` (a latency's widened by the learnt autocorrelation), and its
        CUSUM designed for it (its reset is the caller's)."""
        rule, latency = RULES[tr.name], tr.name in LATENCIES
        floor = self.config.latency_rel_floor if latency else self.config.rel_floor
        tr.baseline = Baseline.learn(vals, rule.floor_abs, transform=rule.transform, rel_floor=floor,
                                     rho=self._rho if latency else 0.0, robust=latency and self.config.robust)
        tr.learn_bucket(self.config.learn_windows)
        tr.cusum.k, tr.cusum.h = self._design(tr.name, tr.baseline)

    def _design(self, name: str, baseline: Baseline) -> tuple[float, float]:
        """A signal's CUSUM allowance k and threshold h on this baseline: MonitorConfig.k, and for a latency at
        least half the slowdown to find in its scale (MonitorConfig.slowdown_to_find_frac), for an input at least
        half the drift to find (drift_to_find_frac); h from k for the test's share of the false-alarm budget (the
        same for every test, whatever its k)."""
        c = self.config
        k = c.k
        frac = c.slowdown_to_find_frac if name in LATENCIES else c.drift_to_find_frac if name in INPUTS else None
        if frac is not None and baseline.scale > 0:
            k = max(k, baseline.shift_of(frac, RULES[name].direction) / 2 / baseline.scale)
        return k, (self.h if k == c.k else threshold(c.false_alarms_per_day, c.interval_s, TESTS, k))

    def _warming(self) -> bool:
        """Whether the learning windows' latency still falls (MonitorConfig.warmup_p): the judged residuals of
        the ITL mean (else the end-to-end or TTFT median), Mann-Kendall's one-sided test of a downward trend."""
        c = self.config
        if c.warmup_p is None or self._spent >= c.warmup_max_factor * c.learn_windows:
            return False
        n = c.learn_windows
        for name in ("itl_ms_mean", "e2el_ms_p50", "ttft_ms_p50"):
            tr = self.tracks[name]
            vals = [r for t, r in zip(tr.times[-n:], tr.residuals[-n:], strict=True) if t not in self._blind_times]
            if len(vals) >= max(8, n // 2) and len(set(vals)) > 1:
                return bool(kendalltau(range(len(vals)), vals, alternative="less").pvalue < c.warmup_p)
        return False

    def _latency_rho(self) -> float:  # over all the learning windows: a gap would hide the dependence
        """The latencies' residual lag-1 autocorrelation over the learning windows, pooled (their mean): one
        signal's 20 windows say little, the latencies share their neighbours."""
        n = self.config.learn_windows
        got = [r for name in LATENCIES if (r := lag1(self.tracks[name].residuals[-n:], transform="log")) is not None]
        return statistics.fmean(got) if got else 0.0

    def relearn(self) -> None:
        """Start a new baseline from the next window on (after a drift, or a new champion)."""
        self._learned = self._spent = 0
        self._blind_times.clear()
        self._calm, self._calm_new = [], 0
        self._pending.clear()
        self._open = [o for o in self._open if o.kind == "saturation"]
        for tr in self.tracks.values():
            tr.baseline = None
            tr.cusum.k, tr.cusum.h = self.config.k, self.h
            tr.cusum.reset()

    # ---------------------------------------------------------------- events
    def _signal_entry(self, name: str, side: str) -> dict[str, Any]:
        tr = self.tracks[name]
        b = tr.baseline
        onset = change_index(tr.residuals[-60:])
        start = len(tr.residuals[-60:])
        return {"direction": side, "baseline": b.level if b else None, "scale": b.scale if b else None,
                "transform": b.transform if b else RULES[name].transform, "expected": self._expected(name),
                "value": tr.values[-1] if tr.values else None,
                "onset_time": tr.times[-start + onset] if onset is not None else None}

    def _event(self, kind: EventKind, t: float, cause: str, sides: Mapping[str, str], detail: str) -> Event:
        ev = Event(kind=kind, time=t, window=self.windows, cause=cause, detail=detail)
        for name, side in sides.items():
            ev.signals[name] = self._signal_entry(name, side)
            tr = self.tracks[name]
            ev.series[name] = (list(tr.times), list(tr.values))
        return ev

    def _describe(self, sides: Mapping[str, str]) -> str:
        parts = []
        for name, side in sides.items():
            tr = self.tracks[name]
            now = tr.values[-1] if tr.values else math.nan
            exp = self._expected(name)
            parts.append(f"{name} {side} (expected {exp:.4g}, seen {now:.4g})" if exp is not None
                         else f"{name} {side}")
        return ", ".join(parts)

    def _expected(self, name: str) -> float | None:
        """The signal's expected value in the last window: its baseline, at the window's load and
        environment."""
        tr = self.tracks[name]
        if tr.baseline is None or not tr.values:
            return None
        x, r = tr.values[-1], tr.residuals[-1]
        return tr.baseline.level * (x / r if r else 1.0)

    def _drift(self, t: float, inputs: Mapping[str, Literal["up", "down"]]) -> Event:
        sides: dict[str, str] = dict(inputs)
        sides.update({n: s for n, (_, s) in self._pending.items()})
        ev = self._event("drift", t, "inputs", sides, "workload drift: " + self._describe(sides))
        for name in INPUTS:
            tr = self.tracks[name]
            onset = ev.signals.get(name, {}).get("onset_time")
            vals = [v for tt, v in zip(tr.times, tr.values, strict=True) if onset is None or tt >= onset]
            if vals:
                ev.observed[name] = sum(vals[-self.config.learn_windows:]) / len(vals[-self.config.learn_windows:])
        self.relearn()
        return ev

    def _anomaly(self, t: float, sides: Mapping[str, Literal["up", "down"]]) -> Event:
        cause = _cause(sides)
        ev = self._event("anomaly", t, cause, sides, f"performance anomaly ({cause}) at unchanged load: "
                         + self._describe(sides))
        self._open.append(_Open("anomaly", cause, dict(sides)))
        return ev

    def _recoveries(self, t: float) -> list[Event]:
        out: list[Event] = []
        for o in list(self._open):
            if o.kind != "anomaly":
                continue
            calm = True
            for name, side in o.signals.items():
                tr = self.tracks[name]
                if tr.baseline is None or name not in self.last_signals:
                    continue
                z = self._z(name)
                if (side == "up" and z > 2) or (side == "down" and z < -2):
                    calm = False
            o.calm = o.calm + 1 if calm else 0
            if o.calm >= self.config.recovery_windows:
                self._open.remove(o)
                for name in o.signals:
                    self.tracks[name].cusum.reset()
                out.append(self._event("recovery", t, "anomaly", o.signals,
                                       f"back to normal after the {o.cause} anomaly: " + ", ".join(o.signals)))
        return out

    def _saturation(self, t: float) -> list[Event]:
        c = self.config
        s = self.last_signals
        now: dict[str, bool] = {
            "kv_full": s.get("kv_cache_usage_frac", 0.0) >= c.kv_full_frac,
            "bandwidth": s.get("gpu_dram_active_frac", 0.0) >= c.dram_limit_frac,
            "queue_growing": self._queue_growing(),
        }
        signal_of = {"kv_full": "kv_cache_usage_frac", "bandwidth": "gpu_dram_active_frac",
                     "queue_growing": "waiting"}
        out: list[Event] = []
        for cause, on in now.items():
            self._sat_run[cause] = self._sat_run.get(cause, 0) + 1 if on else 0
            opened = next((o for o in self._open if o.kind == "saturation" and o.cause == cause), None)
            need = 1 if cause == "queue_growing" else c.sat_windows
            if opened is None and self._sat_run[cause] >= need:
                self._open.append(_Open("saturation", cause, {signal_of[cause]: "up"}))
                limit = {"kv_full": f">= {c.kv_full_frac}", "bandwidth": f">= {c.dram_limit_frac}",
                         "queue_growing": "growing (Mann-Kendall)"}[cause]
                val = s.get(signal_of[cause], math.nan)
                out.append(self._event("saturation", t, cause, {signal_of[cause]: "up"},
                                       f"saturation ({cause}): {signal_of[cause]} {val:.4g} {limit}"))
            elif opened is not None:
                opened.calm = opened.calm + 1 if not on else 0
                if opened.calm >= c.recovery_windows:
                    self._open.remove(opened)
                    out.append(self._event("recovery", t, "saturation", opened.signals,
                                           f"back to normal after the {cause} saturation"))
        return out

    def _queue_growing(self) -> bool:
        tr = self.tracks["waiting"]
        n = self.config.trend_windows
        if len(tr.values) < n or tr.values[-1] < 1:
            return False
        vals = tr.values[-n:]
        if len(set(vals)) < 2:
            return False
        res = kendalltau(range(n), vals, alternative="greater")
        p = self.config.trend_p
        if p is None:
            p = self.config.false_alarms_per_day * self.config.interval_s / SECONDS_PER_DAY
        return bool(res.pvalue < p)


def _cause(signals: Iterable[str]) -> str:
    """An anomaly's cause from the signals that moved: a GPU throttle, another GPU change, else the server's
    latency (or state)."""
    names = list(signals)
    if any(n in GPU_THROTTLE for n in names):
        return "gpu_throttle"
    return "gpu" if any(n in GPU for n in names) else "latency"
