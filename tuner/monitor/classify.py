"""Alarms -> events. `Monitor` keeps a track per signal (tuner.monitor.detect), learns its baseline, runs the
CUSUMs and says what kind of change it saw:

- **drift** (the workload moved): an input signal (rate, prompt or output length) alarmed. Outputs that moved
  with it are part of the same event (more load is slower: no anomaly). The monitor then learns the new normal;
  the event carries the observed inputs for the next cycle to tune for. A fall of the rate that the requests in
  the server (Little's law) did not follow is no drift: a closed loop answered more slowly (MonitorConfig.paced_rate).
  Latencies that rose only by queueing (the requests in the server up, the added ones waiting, the ITL and the
  finished rate unchanged) are a drift too: a closed loop's users grew at its server's capacity
  (MonitorConfig.queued_load).
- **anomaly** (the server got worse at the same load): an output, state or GPU signal alarmed and no input
  alarmed within `settle_windows` windows after it (twice as long while an input's CUSUM is past half its
  threshold: the load may be moving, more slowly than the latency it drives). A GPU throttle (throttle
  reasons, SM clock down) is an anomaly whose cause says so. Answer: tuner.monitor.respond.
- **saturation**: a limit is reached (KV cache usage >= `kv_full_frac`, DRAM active >= `dram_limit_frac`, for
  `sat_windows` windows) or the queue grows (Mann-Kendall trend test over the last `trend_windows` windows,
  one-sided p < `trend_p`, with at least one request waiting).
- **recovery**: after an anomaly, every signal that alarmed stayed within 2 standard deviations of its
  baseline for `recovery_windows` windows; after a saturation, its condition was false that long.

Episodes: an anomaly or a saturation that opens again on the same cause within `reopen_gap_s` of its recovery
is the same episode reopened (`Event.reopened`, `Event.episode`: the window of the episode's first event), as an
alert that flaps is one incident; the daemon answers an episode once.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from scipy.stats import kendalltau

from tuner.measure.scrape import Snapshot
from tuner.monitor.config import RULES, TESTS, MonitorConfig
from tuner.monitor.contention import MAX_WAIT_FRAC, share_of, stretch
from tuner.monitor.detect import (
    CONFIDENCE,
    SECONDS_PER_DAY,
    Baseline,
    Cusum,
    Direction,
    SignalTrack,
    change_index,
    lag1,
    level_shift,
    smallest_rise,
    threshold,
    windows_to_find,
)
from tuner.monitor.expect import Expectation
from tuner.monitor.signals import GPU, INPUTS, LATENCIES, SIGNALS, MissingSeries, bucket_keys, window_signals

log = logging.getLogger(__name__)

EventKind = Literal["drift", "anomaly", "saturation", "recovery"]
KINDS: tuple[EventKind, ...] = ("drift", "anomaly", "saturation", "recovery")
GPU_THROTTLE = ("gpu_throttled", "gpu_sm_clock_mhz")
LENGTHS = ("prompt_tokens_mean", "output_tokens_mean")  # means over the window's finished requests
# a baseline on which the ITL mean's test would take more windows than this to find the slowdown to find
# (MonitorConfig.slowdown_to_find_frac) is named in a warning: 3 minutes at 15-s scrapes, the horizon of
# experiments/detection's trials (its busy host's baselines: 12-21 windows, or never)
MAX_SLOWDOWN_WINDOWS = 12.0
OPEN_CAUSES = {"anomaly": ("latency", "gpu", "gpu_throttle"),  # the causes an open anomaly or saturation has
               "saturation": ("kv_full", "bandwidth", "queue_growing")}


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
    # the window of the first event of its episode (an anomaly or saturation and its recoveries and reopenings;
    # a drift is its own); reopened: an anomaly or saturation that opened again soon after it recovered
    episode: int = 0
    reopened: bool = False

    def summary(self) -> dict[str, Any]:
        """JSON-ready, without the series."""
        return {"kind": self.kind, "time": self.time, "window": self.window, "cause": self.cause,
                "detail": self.detail, "signals": self.signals, "observed": self.observed,
                "episode": self.episode, "reopened": self.reopened}


@dataclass
class _Open:
    """An anomaly or a saturation the monitor waits to see recover."""

    kind: EventKind
    cause: str
    signals: dict[str, Direction]
    episode: int  # the window of the episode's first event
    calm: int = 0


@dataclass(frozen=True)
class _Closed:
    """An episode whose anomaly or saturation recovered: it reopens if the same cause comes back soon."""

    kind: EventKind
    cause: str
    episode: int
    time: float  # when it recovered


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
        self._warm_calm: list[float] | None = None  # a judged warm-up's calm windows (MonitorConfig.warmup_judged)
        self._warm_new = 0
        self._spent = 0  # windows spent on it, with those of a warm-up (MonitorConfig.warmup_p)
        self._pending: dict[str, tuple[int, Literal["up", "down"]]] = {}  # output alarms awaiting inputs
        self._open: list[_Open] = []
        self._closed: list[_Closed] = []  # recovered episodes within reopen_gap_s (MonitorConfig)
        self._sat_run: dict[str, int] = {}
        self._last: tuple[float, Snapshot] | None = None
        self.last_signals: dict[str, float] = {}
        self._waits: list[float] = []  # the shares of the latest wait_memory windows (_wait)
        self._window_shares: deque[float] = deque(maxlen=self.config.learn_windows)  # (MonitorConfig.wait_blend)
        self._window_waits: list[float] = []  # the same, of the window (the limit max_wait_judged)
        self._stretch: dict[float, float] = {}  # window end -> log 1 / (1 - its share) (wait_law_relative)
        self._stretch_ref = 0.0  # the baseline's windows' median of it
        # the latencies' baselines of the windows beyond max_wait_judged (MonitorConfig.starved_baseline), and
        # their windows' median stretch
        self._starved: dict[str, Baseline] = {}
        self._starved_ref = 0.0
        self._wait_now: float | None = None  # the last window's share lost to neighbours (_wait), once a window
        # whether the latencies' residuals are corrected for that share: off for a baseline whose learning windows
        # the correction widened (MonitorConfig.wait_checked; _check_wait)
        self._corrected = True
        # the host's speed's correction: its reference (the learning windows' median log host_probe_us) and
        # elasticity (0: off until a baseline is learnt; MonitorConfig.host_speed_elasticity)
        self._speed_ref = 0.0
        self._speed_e = 0.0
        self.unjudged = 0  # windows whose latencies were not judged (tuner.monitor.config.MonitorConfig)
        self._blind = False
        self._blind_times: set[float] = set()  # ends of the windows not judged (nor learnt from)
        self._calm: list[float] = []  # ends of the calm windows since the baseline (MonitorConfig.history_windows)
        self._calm_new = 0
        self._since = 0  # windows judged since the baseline was learnt (MonitorConfig.input_history_windows)
        self._judged: list[float] = []  # ends of the latest calm judged windows (MonitorConfig.relearn_insensitive)
        self._insensitive_tries = 0
        self._last_relearn = -math.inf
        self._rho = 0.0
        # each baseline's own autocorrelation estimate in the monitor's life, the latest last, and whether the
        # baseline being learnt has one there yet (MonitorConfig.autocorrelation_baselines)
        self._rhos: list[float] = []
        self._rho_new = True
        self._rho_speed: float | None = None  # the host-speed-judged latencies' (MonitorConfig.autocorrelation_apart)
        self._paced_note: tuple[int, str] | None = None  # (window, what) of the latest rate move a closed loop made
        self._paced_now: float | None = None  # this window's (_paced), judged once per window
        self._queue_floor = 0.0  # the lower quartile of the requests waiting in the baseline's windows (_learn)
        self._closed_loop = False  # the requests in the server held steady through them (_steady_inside)
        self._ends: deque[float] = deque(maxlen=self.config.learn_windows)  # the latest windows' ends

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
    def _enough(self) -> int:
        """The fewest windows a baseline is learnt from (fewer: a signal that came and went)."""
        return max(3, self.config.learn_windows // 2)

    @property
    def _half(self) -> int:
        """Half of learn_windows (at least one): the step by which a warm-up's learning goes on or is redone."""
        return max(1, self.config.learn_windows // 2)

    @property
    def wait_corrected(self) -> bool:
        """Whether the latencies are judged corrected for the server's CPU wait (MonitorConfig.wait_checked)."""
        return self._corrected

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
        if self._wait_now is not None and self._corrected:
            x *= 1.0 - self._wait_now
        probe = self.last_signals.get("host_probe_us", 0.0)
        share = self.config.host_speed_share(name)
        if self._speed_e and probe > 0 and share:
            x *= math.exp(-self._speed_e * share * (math.log(probe) - self._speed_ref))
        return x

    @property
    def host_speed_elasticity(self) -> float:
        """The exponent the latencies of MonitorConfig.host_speed_signals are judged at the host's speed with, times
        each one's share (0: not; _check_speed)."""
        return self._speed_e

    def _wait(self, law: str | None = None) -> float | None:
        """The share of the last window's work the server could not run (MonitorConfig.contention): its own wait
        for a CPU (the share MonitorConfig.wait_law, or `law`, names: of the window, or of the time it was ready
        to run, where read; "auto": the latter by degrees, MonitorConfig.wait_law) and the steal of its host's
        CPUs, 1 - (1 - wait)(1 - steal); None where neither is read (or the correction is off)."""
        sig = self.last_signals
        shares = [sig[n] for n in ("cpu_wait_frac", "cpu_steal_frac") if n in sig]
        if not self.config.contention or not shares:
            return None
        law = law or self.config.wait_law
        if "cpu_wait_frac" in sig and "cpu_ready_wait_frac" in sig and law != "window":
            window, ready = sig["cpu_wait_frac"], sig["cpu_ready_wait_frac"]
            # "auto": the ready share's weight rises from 0 where the window's share is half its error to 1 where
            # it is one and a half times it
            basis = window
            if self.config.wait_blend == "usual" and self._window_shares and window < 1.5 * self.config.wait_error:
                basis = statistics.median(self._window_shares)  # the usual share: a slower server waits longer
            weight = 1.0 if law == "ready" else min(1.0, max(0.0, basis / self.config.wait_error - 0.5))
            shares[0] = window + (ready - window) * weight
        return min(MAX_WAIT_FRAC, 1.0 - math.prod(1.0 - min(v, MAX_WAIT_FRAC) for v in shares))

    def _z(self, name: str) -> float:
        """The last window's standardised residual of a signal that has a baseline."""
        tr = self.tracks[name]
        baseline, usual_stretch = self._judging(name)
        assert baseline is not None
        z = baseline.z(tr.residuals[-1])
        done, usual = self.last_signals.get("finished_per_s"), self.tracks["finished_per_s"].baseline
        if name in LENGTHS and done is not None and usual is not None and usual.level > 0:
            z *= min(1.0, math.sqrt(done / usual.level))  # a mean of fewer requests than usual says less
        extra = 0.0  # the window's own uncertainty (log scale) on top of the baseline's scale
        if name in LATENCIES and self.config.contention and self._waits and self._corrected:
            w = min(max(self._waits), MAX_WAIT_FRAC)
            # the measured share's error, and the 1 / (1 - w) law's own (its exponent known to +- wait_law_error)
            # on the stretch, or on its departure from the baseline's usual one (wait_law_relative)
            ref = usual_stretch if self.config.wait_law_relative else 0.0
            away = max(abs(stretch(v) - ref) for v in self._waits)
            share_err = self.config.wait_error / (1.0 - w)
            if self.config.wait_error_relative:  # beyond the error at the baseline's usual stretch (the config)
                usual_err = self.config.wait_error * math.exp(usual_stretch)
                share_err = math.hypot(self.config.wait_error, math.sqrt(max(0.0, share_err ** 2 - usual_err ** 2)))
            extra = math.hypot(share_err, self.config.wait_law_error * away)
        if name in LATENCIES and self.config.bucket_error:
            extra = math.hypot(extra, tr.bucket_error())
        if extra > 0:
            z *= baseline.scale / math.hypot(baseline.scale, extra)
        return z

    def _judging(self, name: str) -> tuple[Baseline | None, float]:
        """The baseline the last window of a signal is judged against, and its windows' usual stretch: its
        starved windows' for a latency in a window beyond max_wait_judged where one was learnt
        (MonitorConfig.starved_baseline), else its own."""
        if self._blind and name in self._starved:
            return self._starved[name], self._starved_ref
        return self.tracks[name].baseline, self._stretch_ref

    def _settled(self) -> bool:
        """Whether the output alarms pending have waited long enough for an input alarm that would make them
        part of a drift: not at all for a GPU throttle (no load sets a clocks-event reason) or while no
        input's CUSUM holds evidence of a change (at least `settle_evidence` of h); else `settle_windows`,
        twice that while an input's CUSUM is past half of h (the load may be moving, more slowly than the
        latency it drives)."""
        waited = max(self.windows - w for w, _ in self._pending.values())
        if all(n in GPU_THROTTLE for n in self._pending):
            return True
        paced = self._paced_now  # the rate's move explained: no evidence of a load moving that way
        evidence = max((((tr.cusum.up if paced < 1 else tr.cusum.down) if paced is not None and n == "rate_per_s"
                         else tr.cusum.statistic)
                        for n in INPUTS if (tr := self.tracks[n]).baseline), default=0.0)
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
        self._ends.append(t)
        self.last_signals = {k: float(v) for k, v in signals.items() if k in self.tracks and math.isfinite(v)}
        if "cpu_wait_frac" in self.last_signals:
            self._window_shares.append(self.last_signals["cpu_wait_frac"])
        w = self._wait_now = self._wait()
        keep = self.config.wait_memory - 1
        self._waits = [*(self._waits[-keep:] if keep else []), w] if w is not None else []
        # not judged: the server waited more than max_wait_judged of one of those windows (the window's share)
        ww = self._wait("window")
        self._window_waits = [*(self._window_waits[-keep:] if keep else []), ww] if ww is not None else []
        self._blind = bool(self._window_waits) and max(self._window_waits) > self.config.max_wait_judged
        if w is not None:
            self._stretch[t] = stretch(w)
            if len(self._stretch) > self.tracks["itl_ms_mean"].keep:
                del self._stretch[next(iter(self._stretch))]
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
            shifted = self._learning_shift(t)
            if shifted is not None:
                events.append(shifted)
                return events
            if not self.learning:
                c = self.config
                warming = self._warming()
                if warming and not c.warmup_judged:
                    self._learned -= self._half
                else:
                    self._learn()
                    if warming:  # judged from now on, the latencies learnt again as the warm-up goes on
                        self._warm_calm, self._warm_new = list(self._calm), 0
                        self._learnt(warn=False)  # warned once the warm-up's baseline is learnt
                    elif (c.learn_until_sensitive and self._spent < c.warmup_max_factor * c.learn_windows
                            and (self.slowdown_windows() or 0.0) > MAX_SLOWDOWN_WINDOWS):
                        self._learned -= self._half  # learning goes on (learn_until_sensitive)
                    else:
                        self._learnt()
            return events
        self._paced_now = self._paced()
        alarms: dict[str, Literal["up", "down"]] = {}
        blind = self._blind
        self.unjudged += blind and "itl_ms_mean" not in self._starved
        for name in self.last_signals:
            tr = self.tracks[name]
            if tr.baseline is None or not RULES[name].tested or (blind and name in LATENCIES
                                                                   and name not in self._starved):
                continue
            z = self._z(name)
            clip = self.config.clip_for(tr.cusum.h, tr.cusum.k)
            side = tr.cusum.update(max(-clip, min(clip, z)))
            if side is not None:
                alarms[name] = side
        inputs = {n: s for n, s in alarms.items() if n in INPUTS}
        paced = self._paced_now
        if paced is not None and inputs.get("rate_per_s") == ("down" if paced < 1 else "up"):
            del inputs["rate_per_s"]  # a closed loop answered at another speed, its users still there: no drift
            self._paced_note = (self.windows, _paced_text(paced))
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
        drained = self._queue_moved(up=False)
        if drained is not None:  # the users a queue held left: fewer requests waiting, for confirm_windows
            events.append(self._drift(t, {"in_server_mean": "down"}, note=_queued_text(drained)))
            return events
        due = ({n: s for n, (_, s) in self._pending.items()}  # all the symptoms seen so far: one event
               if self._pending and self._settled() and self._corroborated() else {})
        opened = any(o.kind == "anomaly" and o.cause == "latency" for o in self._open)
        # a closed loop's queue of more users (their latencies' alarm now, the anomaly their first windows opened,
        # or no latency judged yet: windows that waited beyond max_wait_judged, a CUSUM still below h)
        queued = self._queued() if all(n in LATENCIES for n in due) else None
        if queued is not None:
            note = _queued_text(queued) + ("; the latency anomaly open since was this load" if not due and opened
                                           else "")
            events.append(self._drift(t, {"in_server_mean": "up"}, note=note))
            return events
        if due:
            self._pending.clear()
            events.append(self._anomaly(t, due))
        events.extend(self._recoveries(t))
        self._learn_history(t, blind)
        self._relearn_warm(t, blind)
        self._relearn_insensitive(t, blind)
        self._learn_inputs()
        return events

    # ---------------------------------------------------------------- baselines
    def _learn(self) -> None:
        """Every signal's baseline from the latest learn_windows windows (a latency's with what judges it: the
        autocorrelation, the usual stretch, the starved windows' baseline)."""
        n = self.config.learn_windows
        self._closed_loop = self._steady_inside(n)
        self._check_wait()
        self._check_speed()
        self._learn_rho()
        times = self.tracks["itl_ms_mean"].times[-n:]
        self._calm = [t for t in times if t not in self._blind_times]
        enough = self._enough
        # the starved windows' usual stretch: theirs where the calm windows make a baseline alone, else all of them
        self._starved = {}
        self._starved_ref = self._median_stretch(set(times) - set(self._calm) if len(self._calm) >= enough
                                                  else set(times))
        self._set_stretch_ref(set(self._calm) or set(times))
        self._calm_new = self._since = self._insensitive_tries = 0
        self._judged, self._last_relearn = [], -math.inf
        waits = self.tracks["waiting"].values[-n:]
        self._queue_floor = statistics.quantiles(waits, n=4)[0] if len(waits) >= max(2, enough) else 0.0
        for tr in self.tracks.values():
            vals = tr.residuals[-n:]
            if tr.name not in LATENCIES:
                self._learn_track(tr, vals)
                continue
            # a latency is learnt from the windows it would be judged in, where there are enough; its windows
            # beyond max_wait_judged make its starved baseline (MonitorConfig.starved_baseline)
            calm, starved = _split(tr.times[-n:], vals, self._blind_times)
            if len(calm) >= enough:
                vals = calm
            else:  # too few calm windows: the one baseline of every window, which knew the starved ones
                starved = vals
            baseline = self._learn_track(tr, vals)
            if baseline is not None and self.config.starved_baseline and len(starved) >= enough:
                self._starved[tr.name] = baseline if starved is vals else self._learnt_baseline(tr.name, starved)

    def _check_wait(self) -> None:
        """Whether this baseline's latencies are corrected for the server's CPU wait (MonitorConfig.wait_checked):
        not where, in a closed loop (_closed_loop: its clients send as fast as the server answers), over the
        learning windows that read a wait, the log ITL mean corrected spreads more than wait_checked times as wide
        as uncorrected (the wait did not stretch the server's work: its own load's clients and front end took the
        CPUs it waited for, busiest when it ran fastest); always in an open loop. The latencies' stored residuals
        are turned to the chosen form, so every baseline and relearning reads one form."""
        c, tr = self.config, self.tracks["itl_ms_mean"]
        if c.wait_checked is None or not c.contention:
            return
        n = c.learn_windows  # the learning windows that read a wait, starved ones too (their baseline)
        seen = [(self._stretch[t], math.log(r)) for t, r in zip(tr.times[-n:], tr.residuals[-n:], strict=True)
                if t in self._stretch and r > 0]
        if self._closed_loop and len(seen) < max(3, self._enough):
            return
        on = 1.0 if self._corrected else 0.0  # the stored residuals carry the stretch's correction where on
        raw = [x + on * st for st, x in seen]
        fixed = [x - st for (st, _), x in zip(seen, raw, strict=True)]
        corrected = not self._closed_loop or statistics.stdev(fixed) <= c.wait_checked * statistics.stdev(raw)
        if corrected == self._corrected:
            return
        self._corrected = corrected
        sign = -1.0 if corrected else 1.0  # into the new form: the stretch taken out, or put back
        for name in LATENCIES:
            lat = self.tracks[name]
            lat.residuals = [r * math.exp(sign * self._stretch[t]) if t in self._stretch else r
                             for t, r in zip(lat.times, lat.residuals, strict=True)]
        log.info("latencies %s for the CPU wait from this baseline on (MonitorConfig.wait_checked)",
                 "corrected" if corrected else "not corrected")

    def _check_speed(self) -> None:
        """The host's speed's correction for this baseline (MonitorConfig.host_speed_elasticity): its reference,
        the median probe of the learning windows judged that read it; the latencies' stored residuals are turned
        to the new form, so every baseline and relearning reads one."""
        e = self.config.host_speed_elasticity
        if not e:
            return
        probe = self.tracks["host_probe_us"]  # window end -> log probe, from the probe's own track
        speed = {t: math.log(v) for t, v in zip(probe.times, probe.values, strict=True) if v > 0}
        speeds = [speed[t] for t in self.tracks["itl_ms_mean"].times[-self.config.learn_windows:]
                  if t in speed and t not in self._blind_times]
        if not speeds:
            return
        ref = statistics.median(speeds)
        for name, share in self.config.host_speed_signals:  # into the new form: the old reference put back, the
            lat = self.tracks[name]  # new one taken out, each at the latency's share of the elasticity
            lat.residuals = [r * math.exp(share * (self._speed_e * (speed[t] - self._speed_ref) - e * (speed[t] - ref)))
                             if t in speed else r for t, r in zip(lat.times, lat.residuals, strict=True)]
        self._speed_e, self._speed_ref = e, ref

    def _learn_track(self, tr: SignalTrack, vals: list[float]) -> Baseline | None:
        """A track's baseline from `vals` and its CUSUM restarted; none where too few windows carried the signal
        (one that came and went)."""
        if len(vals) < self._enough:
            tr.baseline = None
            return None
        baseline = self._baseline(tr, vals)
        tr.cusum.reset()
        return baseline

    def _learnt(self, *, warn: bool = True) -> None:
        """The baselines _learn made are kept: the learning windows' marks dropped, and (`warn`) a warning where
        the ITL mean's would find the slowdown to find late or never."""
        self._blind_times.clear()
        if warn:
            self._warn_insensitive()

    def _warn_insensitive(self) -> None:
        """A warning where the ITL mean's baseline would find the slowdown to find late or never."""
        found_in = self.slowdown_windows()
        if found_in is not None and found_in > MAX_SLOWDOWN_WINDOWS:
            tr = self.tracks["itl_ms_mean"]
            assert tr.baseline is not None
            log.warning("the ITL mean's baseline varies by %.0f %% a window: a %+.0f %% slowdown %s, the smallest "
                        "found within %.0f windows is %+.0f %% (tuner_monitor_slowdown_windows, "
                        "tuner_monitor_detectable_slowdown_frac); a noisy host or a turbulent learning stretch",
                        100 * math.expm1(tr.baseline.scale), 100 * (self.config.slowdown_to_find_frac or 0),
                        "would never be found" if math.isinf(found_in)
                        else f"would take {found_in:.0f} windows to find", MAX_SLOWDOWN_WINDOWS,
                        100 * (self.detectable_slowdown() or 0.0))

    def _learn_history(self, t: float, blind: bool) -> None:
        """A calm window joins the latencies' history; every learn_windows of them the latencies' baselines are
        learnt again from it (MonitorConfig.history_windows), their CUSUMs going on."""
        c = self.config
        if c.history_windows is None or not self._calm_window(blind) or not self._usual_wait():
            return
        self._calm = [*self._calm[-(c.history_windows - 1):], t]
        self._calm_new += 1
        if self._calm_new < c.learn_windows:
            return
        self._calm_new = 0
        calm = set(self._calm)
        if c.autocorrelation_history:  # the autocorrelation from the history too, not its first 20 windows'
            self._learn_rho(calm)
        self._relearn_latencies(calm, c.learn_windows, reset=False)

    def _usual_wait(self) -> bool:
        """Whether the latest windows' waits (the wait memory) are all within wait_error of the baseline's usual
        share (MonitorConfig.history_usual_wait; always where it is off or no wait is read)."""
        c = self.config
        if not c.history_usual_wait or not self._waits:
            return True
        usual = share_of(self._stretch_ref)
        return all(abs(w - usual) <= c.wait_error for w in self._waits)

    def _calm_window(self, blind: bool) -> bool:
        """Whether this window's latencies may join a baseline: judged, no latency alarm pending, no anomaly open."""
        return not blind and not any(n in LATENCIES for n in self._pending) \
            and not any(o.kind == "anomaly" for o in self._open)

    def _set_stretch_ref(self, times: set[float]) -> None:
        """The usual stretch of the latencies' baseline: the median log 1 / (1 - w) of its windows ending at `times`
        (0 where none was read)."""
        self._stretch_ref = self._median_stretch(times)

    def _median_stretch(self, times: set[float]) -> float:
        """The median log 1 / (1 - w) of the windows ending at `times` (0 where none was read)."""
        got = [v for u, v in self._stretch.items() if u in times]
        return statistics.median(got) if got else 0.0

    def _relearn_latencies(self, calm: set[float], at_least: int, *, reset: bool) -> None:
        """The latencies' baselines (those that have one) learnt again from their windows ending at `calm`, where
        at least `at_least` of them are kept; their CUSUMs restarted where `reset`, else going on."""
        if sum(u in calm for u in self.tracks["itl_ms_mean"].times) >= at_least:
            self._set_stretch_ref(calm)
        for name in LATENCIES:
            tr = self.tracks[name]
            vals = tr.residuals_at(calm)
            if tr.baseline is not None and len(vals) >= at_least:
                self._baseline(tr, vals)
                if reset:
                    tr.cusum.reset()

    def _relearn_warm(self, t: float, blind: bool) -> None:
        """While a judged warm-up goes on (MonitorConfig.warmup_judged): every half of learn_windows calm judged
        windows, the latencies' baselines learnt again from the latest learn_windows of them; it ends once their
        latency no longer falls, or warmup_max_factor x learn_windows windows after learning began."""
        if self._warm_calm is None or not self._calm_window(blind):
            return
        c = self.config
        n = c.learn_windows
        self._warm_calm = [*self._warm_calm[-(n - 1):], t]
        self._warm_new += 1
        if self._warm_new < self._half:  # (the calm windows then number at least as many)
            return
        self._warm_new = 0
        self._spent += self._half
        calm = set(self._warm_calm)
        still = self._warming(calm)
        if c.autocorrelation:  # the warm-up's trend made the first baseline's
            self._learn_rho(calm)
        self._relearn_latencies(calm, self._half, reset=True)
        if not still or self._spent >= c.warmup_max_factor * n:
            self._warm_calm = None
            self._warn_insensitive()

    def _relearn_insensitive(self, t: float, blind: bool) -> None:
        """While the ITL mean's baseline would find the slowdown to find late (more than MAX_SLOWDOWN_WINDOWS),
        the latencies' baselines are learnt again from the latest learn_windows calm judged windows, every half
        of learn_windows of them, at most warmup_max_factor times (MonitorConfig.relearn_insensitive); the
        inputs and the GPU are judged all along."""
        c = self.config
        if not c.relearn_insensitive or not self._calm_window(blind):
            return
        n = c.learn_windows
        self._judged = [*self._judged[-(n - 1):], t]
        found_in = self.slowdown_windows()
        if found_in is None or found_in <= MAX_SLOWDOWN_WINDOWS or self._insensitive_tries >= c.warmup_max_factor:
            return
        if len(self._judged) < n or self._judged[-n // 2] <= self._last_relearn:
            return
        self._insensitive_tries += 1
        self._last_relearn = t
        self._relearn_latencies(set(self._judged), n // 2, reset=True)

    def _learn_inputs(self) -> None:
        """Every learn_windows windows after the baseline, the inputs' scales learnt again from their windows since
        its learning began (up to input_history_windows), their centres kept (MonitorConfig.input_history_windows);
        their CUSUMs go on, redesigned for the new scale."""
        c = self.config
        self._since += 1
        if c.input_history_windows is None or self._since % c.learn_windows:
            return
        n = min(c.learn_windows + self._since, c.input_history_windows, self.tracks["rate_per_s"].keep)
        for name in INPUTS:
            tr = self.tracks[name]
            if tr.baseline is None or len(tr.residuals) < n:
                continue
            self._baseline(tr, tr.residuals[-n:], centre=(tr.baseline.centre, c.learn_windows))

    def _baseline(self, tr: SignalTrack, vals: list[float], centre: tuple[float, int] | None = None) -> Baseline:
        """A track's baseline learnt from `vals` (a latency's widened by the learnt autocorrelation; `centre`
        kept where given: Baseline.learn), and its CUSUM designed for it (its reset is the caller's); returned."""
        tr.baseline = self._learnt_baseline(tr.name, vals, centre)
        tr.learn_bucket(self.config.learn_windows)
        tr.cusum.k, tr.cusum.h = self._design(tr.name, tr.baseline)
        return tr.baseline

    def _learnt_baseline(self, name: str, vals: list[float], centre: tuple[float, int] | None = None) -> Baseline:
        """A signal's baseline learnt from `vals` (Baseline.learn with the signal's rule and floors)."""
        rule, latency = RULES[name], name in LATENCIES
        floor = self.config.latency_rel_floor if latency else self.config.rel_floor
        confidence = self.config.input_confidence if name in INPUTS else CONFIDENCE
        floor_abs = rule.floor_abs
        if name == "rate_per_s" and self.config.rate_poisson_floor:  # a Poisson count's spread at the median rate
            floor_abs = max(floor_abs, math.sqrt(max(statistics.median(vals), 0.0) / self.config.interval_s))
        return Baseline.learn(vals, floor_abs, confidence, transform=rule.transform, rel_floor=floor,
                              rho=self._rho_of(name) if latency else 0.0, robust=latency and self.config.robust,
                              centre=centre, horizon=self.config.autocorrelation_horizon if latency else None)

    def slowdown_windows(self) -> float | None:
        """The mean windows the ITL mean's test is expected to take to find a slowdown of
        MonitorConfig.slowdown_to_find_frac at its current baseline (detect.windows_to_find): inf where the
        latency noise hides a slowdown of that size, None before a baseline (or with no slowdown to find)."""
        tr, frac = self.tracks["itl_ms_mean"], self.config.slowdown_to_find_frac
        if tr.baseline is None or frac is None:
            return None
        return windows_to_find(tr.baseline, tr.cusum, frac)

    def detectable_slowdown(self, windows: float = MAX_SLOWDOWN_WINDOWS) -> float | None:
        """The smallest slowdown (a fraction of the ITL mean) its test is expected to find within `windows` windows
        at its current baseline (detect.smallest_rise): what the latency noise lets the monitor see that soon (a
        window whose CPU wait widens its scale sees less); None before a baseline."""
        tr = self.tracks["itl_ms_mean"]
        return None if tr.baseline is None else smallest_rise(tr.baseline, tr.cusum, windows)

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

    def _warming(self, times: set[float] | None = None) -> bool:
        """Whether the learning windows' latency still falls (MonitorConfig.warmup_p): the judged residuals of
        the ITL mean (else the end-to-end or TTFT median), Mann-Kendall's one-sided test of a downward trend;
        `times`: the ends of the windows to test instead of the latest learn_windows."""
        c = self.config
        if c.warmup_p is None or self._spent >= c.warmup_max_factor * c.learn_windows:
            return False
        n = c.learn_windows
        for name in ("itl_ms_mean", "e2el_ms_p50", "ttft_ms_p50"):
            tr = self.tracks[name]
            vals = tr.residuals_at(times if times is not None else set(tr.times[-n:]) - self._blind_times)
            if len(vals) >= max(8, n // 2) and len(set(vals)) > 1:
                return bool(kendalltau(range(len(vals)), vals, alternative="less").pvalue < c.warmup_p)
        return False

    def _rho_of(self, name: str) -> float:
        """The autocorrelation that widens latency `name`'s baseline (MonitorConfig.autocorrelation_apart)."""
        if self._rho_speed is not None and name in self.config.host_speed_names:
            return self._rho_speed
        return self._rho

    def _learn_rho(self, times: set[float] | None = None) -> None:
        """The autocorrelations that widen the latencies' baselines being learnt (0 where MonitorConfig.
        autocorrelation is off): the latencies' pooled with earlier baselines' (_pooled_rho), and with
        MonitorConfig.autocorrelation_apart, while the latencies are judged at the host's speed, those judged so
        apart from the rest (this baseline's own estimate: not pooled with earlier baselines')."""
        c = self.config
        if not c.autocorrelation:
            self._rho, self._rho_speed = 0.0, None
            return
        apart = c.host_speed_names if c.autocorrelation_apart and self._speed_e else ()
        self._rho = self._pooled_rho(self._latency_rho(times, tuple(x for x in LATENCIES if x not in apart)))
        self._rho_speed = self._latency_rho(times, apart) if apart else None

    def _latency_rho(self, times: set[float] | None = None, names: tuple[str, ...] = LATENCIES) -> float:
        """The residual lag-1 autocorrelation of the latencies `names` over the learning windows (all of them: a
        gap would hide the dependence; `times`: the ends of the windows to use instead), pooled (their mean): one
        signal's 20 windows say little, the latencies share their neighbours."""
        n = self.config.learn_windows
        series = [tr.residuals[-n:] if times is None else tr.residuals_at(times)
                  for tr in (self.tracks[name] for name in names)]
        got = [r for vals in series if (r := lag1(vals, transform="log")) is not None]
        return statistics.fmean(got) if got else 0.0

    def _pooled_rho(self, estimate: float) -> float:
        """The autocorrelation that widens the baseline being learnt: `estimate` (its own, replacing any it had:
        the warm-up's later windows, learning that went on) pooled with those of up to
        autocorrelation_baselines - 1 baselines before it (their mean)."""
        if self._rho_new or not self._rhos:
            self._rhos.append(estimate)
            self._rho_new = False
        else:
            self._rhos[-1] = estimate
        del self._rhos[:-max(1, self.config.autocorrelation_baselines)]
        return statistics.fmean(self._rhos)

    def relearn(self) -> None:
        """Start a new baseline from the next window on (after a drift, or a new champion)."""
        self._rho_new = True
        self._learned = self._spent = 0
        self._warm_calm = None
        self._blind_times.clear()
        self._starved = {}
        self._calm, self._calm_new = [], 0
        self._pending.clear()
        self._paced_note = None
        self._open = [o for o in self._open if o.kind == "saturation"]
        self._closed = [c for c in self._closed if c.kind == "saturation"]  # an anomaly is judged anew
        for tr in self.tracks.values():
            tr.baseline = None
            tr.cusum.k, tr.cusum.h = self.config.k, self.h
            tr.cusum.reset()

    # ---------------------------------------------------------------- events
    def _signal_entry(self, name: str, side: str) -> dict[str, Any]:
        tr = self.tracks[name]
        b, _ = self._judging(name)
        onset = change_index(tr.residuals[-60:])
        start = len(tr.residuals[-60:])
        return {"direction": side, "baseline": b.level if b else None, "scale": b.scale if b else None,
                "transform": b.transform if b else RULES[name].transform, "expected": self._expected(name),
                "value": tr.values[-1] if tr.values else None,
                "onset_time": tr.times[-start + onset] if onset is not None else None}

    def _event(self, kind: EventKind, t: float, cause: str, sides: Mapping[str, str], detail: str, *,
               episode: int | None = None, reopened: bool = False) -> Event:
        """An event of this window with its signals' entries and series; its episode this window's unless given."""
        ev = Event(kind=kind, time=t, window=self.windows, cause=cause, detail=detail,
                   episode=self.windows if episode is None else episode, reopened=reopened)
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
        tr, (b, _) = self.tracks[name], self._judging(name)
        if b is None or not tr.values:
            return None
        x, r = tr.values[-1], tr.residuals[-1]
        return b.level * (x / r if r else 1.0)

    def _drift(self, t: float, inputs: Mapping[str, Literal["up", "down"]], note: str = "",
               since: float | None = None) -> Event:
        """A drift of `inputs`; its observed inputs the means since each one's onset (`since`: the window ending
        then, for every signal, where the change's place is known)."""
        sides: dict[str, str] = dict(inputs)
        sides.update({n: s for n, (_, s) in self._pending.items()})
        ev = self._event("drift", t, "inputs", sides, "workload drift: " + self._describe(sides)
                         + (f"; {note}" if note else ""))
        for name in (*INPUTS, *(n for n in inputs if n not in INPUTS)):
            tr = self.tracks[name]
            if since is not None and name in ev.signals:
                ev.signals[name]["onset_time"] = since
            onset = since if since is not None else ev.signals.get(name, {}).get("onset_time")
            vals = [v for tt, v in zip(tr.times, tr.values, strict=True) if onset is None or tt >= onset]
            if vals:
                ev.observed[name] = sum(vals[-self.config.learn_windows:]) / len(vals[-self.config.learn_windows:])
        self.relearn()
        return ev

    def _anomaly(self, t: float, sides: Mapping[str, Literal["up", "down"]]) -> Event:
        cause = _cause(sides)
        note, now = self._paced_note, self._paced_now
        if now is not None:  # the rate fell already, whether or not its test alarmed
            note = (self.windows, _paced_text(now))
        paced = f"; {note[1]}" if note is not None and self.windows - note[0] <= self.config.learn_windows else ""
        return self._opening("anomaly", t, cause, dict(sides), f"performance anomaly ({cause}) at unchanged "
                             "load: " + self._describe(sides) + paced)

    def _paced(self) -> float | None:
        """The request rate over its baseline's level in the last window where its move is a closed loop's answer
        to a server of another speed (MonitorConfig.paced_rate): it fell (a slower server), or in a closed loop
        (_steady_inside) rose (a faster one), and the requests in the server (Little's law, in_server_mean) moved
        the same way by less than paced_share of it on the log scale. None where the rate did not move so (by
        more than its CUSUM's allowance: an alarm's window always has), the requests in the server moved with it
        (users came or left), either has no baseline or no value in the last window, or it is off."""
        c = self.config
        rate, inside = self.tracks["rate_per_s"], self.tracks["in_server_mean"]
        if (not c.paced_rate or rate.baseline is None or inside.baseline is None or not rate.times
                or not inside.times or rate.times[-1] != inside.times[-1]):
            return None
        r, n = rate.values[-1], inside.values[-1]
        if min(r, n, rate.baseline.level, inside.baseline.level) <= 0:
            return None
        z = rate.baseline.z(r)
        if z > -rate.cusum.k and not (self._closed_loop and z >= rate.cusum.k):
            return None
        moved = math.log(r / rate.baseline.level)
        followed = math.log(n / inside.baseline.level)
        return math.exp(moved) if _unfollowed(moved, followed, c.paced_share) else None

    def _learning_shift(self, t: float) -> Event | None:
        """A change of the workload inside the learning windows so far (MonitorConfig.learning_shift): a drift,
        the learning restarted at its window (those after it kept). None where none."""
        c = self.config
        n = self._learned
        if not c.learning_shift or n < 4 or n > len(self._ends):
            return None
        start = self._ends[-n]
        names = (*INPUTS, "in_server_mean")
        p = c.false_alarms_per_day * c.interval_s / SECONDS_PER_DAY / len(names)
        rise = math.log(1 + (c.drift_to_find_frac if c.drift_to_find_frac is not None else 0.5))
        found: dict[str, tuple[float, float, float]] = {}  # name -> (its first window's end, moved (log), t)
        for name in names:
            tr = self.tracks[name]
            pairs = [(tt, v) for tt, v in zip(tr.times[-n:], tr.values[-n:], strict=True) if tt >= start]
            shift = level_shift([v for _, v in pairs], min_log=rise, floor_log=c.learning_shift_floor, p=p)
            if shift is None:
                continue
            at = pairs[shift.index][0]
            # users that came or left: a closed loop's on as many windows as a baseline's sign reads; a rate its
            # server moved (its warm-up: faster) is none on as few as the sign reads at all
            if name == "in_server_mean" and not self._closed_before(start, at, self._enough):
                continue  # an open loop's requests in the server follow its server's speed too
            # a closed loop's server answered at another speed, its users the same (or too few windows on either
            # side of the shift to read the loop's sign yet: the next ones tell)
            if (name == "rate_per_s" and c.paced_rate and self._paced_between(start, at, shift.moved_log)
                    and self._closed_around(start, at, 3) is not False):
                continue
            found[name] = (at, shift.moved_log, shift.t)
        if not found:
            return None
        at = max(a for a, _, _ in found.values())
        kept = [e for e in self._ends if e >= at]
        blind = {b for b in self._blind_times if b >= at}
        note = ("a change inside the baseline's learning windows, the learning restarted at it: "
                + ", ".join(f"{name} x{math.exp(moved):.2f} from the window ending {a:.0f} (t {stat:.1f})"
                            for name, (a, moved, stat) in found.items()))
        ev = self._drift(t, {name: "up" if moved > 0 else "down" for name, (_, moved, _) in found.items()}, note,
                         since=at)
        self._learned = self._spent = len(kept)
        self._blind_times |= blind
        return ev

    def _closed_before(self, start: float, at: float, least: int) -> bool:
        """Whether the learning windows from `start` to before `at`, at least `least` of them, were a closed loop's
        (_steady_inside; a few windows of an open loop's, one block of a replay, can hold as steady by chance)."""
        inside, done = self._load_between(start, at)
        return self._steadier_than_arrivals(inside, done, least)

    def _closed_around(self, start: float, at: float, least: int) -> bool | None:
        """The closed-loop sign around a shift at `at` inside the learning windows from `start`: read on the
        windows before it where at least `least` came before it, else on those from it on (the loop's sign holds
        through a change of its server's speed, and a shift early in the learning leaves too few before it);
        None where neither side has `least` windows yet."""
        inside, done = self._load_between(start, at)
        if len(inside) < least:
            inside, done = self._load_between(at, math.inf)
        return self._steadier_than_arrivals(inside, done, least) if len(inside) >= least else None

    def _load_between(self, start: float, end: float) -> tuple[list[float], list[float]]:
        """The requests in the server (positive ones) and the finished counts of the windows ending from `start`
        to before `end`."""
        tr, fin = self.tracks["in_server_mean"], self.tracks["finished_per_s"]
        inside = [v for tt, v in zip(tr.times, tr.values, strict=True) if start <= tt < end and v > 0]
        done = [x * self.config.interval_s for tt, x in zip(fin.times, fin.values, strict=True) if start <= tt < end]
        return inside, done

    def _paced_between(self, start: float, at: float, moved: float) -> bool:
        """Whether the requests in the server moved by less than paced_share of the rate's `moved` (log) at `at`
        within the learning windows from `start` (_paced's rule: a closed loop answered at another speed)."""
        tr = self.tracks["in_server_mean"]
        before: list[float] = []
        after: list[float] = []
        for tt, v in zip(tr.times, tr.values, strict=True):
            if tt >= start and v > 0:
                (after if tt >= at else before).append(math.log(v))
        if not before or not after:
            return False
        return _unfollowed(moved, statistics.fmean(after) - statistics.fmean(before), self.config.paced_share)

    def _steady_inside(self, n: int) -> bool:
        """A closed loop (MonitorConfig.queued_steady): over the latest `n` windows the requests in the server held
        steadier than arrivals would keep them. The spread of their log, the window farthest from its median left
        out (the traffic's start, or one window's chance), at most queued_steady times 1 / sqrt(the mean number
        finished in a window): the least an open loop's Poisson arrivals give it."""
        inside = [v for v in self.tracks["in_server_mean"].values[-n:] if v > 0]
        done = [x * self.config.interval_s for x in self.tracks["finished_per_s"].values[-n:]]
        return self._steadier_than_arrivals(inside, done, self._enough)

    def _steadier_than_arrivals(self, inside: Sequence[float], done: Sequence[float], least: int) -> bool:
        """The closed-loop sign on these windows' requests in the server and finished counts (at least `least`
        windows): arrival_spread_ratio at most queued_steady."""
        ratio = arrival_spread_ratio(inside, done) if len(inside) >= least else None
        return ratio is not None and ratio <= self.config.queued_steady

    def _queue_moved(self, up: bool) -> float | None:
        """The requests in the server over their baseline's level in the last window where their queue alone
        moved (MonitorConfig.queued_load) in a closed loop (the requests in the server held steadier than arrivals
        keep them through the baseline's windows, _steady_inside: each user's next request sent as the last is
        answered), `up`: that ratio at least 1 + drift_to_find_frac, or (not `up`) at most its inverse; the
        requests waiting moved the same way by at least queued_share of that change (and one request) in each of
        the latest confirm_windows windows (a queue that stays, not a snapshot's chance: a batch that is being
        filled holds requests waiting too); not `up`, a queue that stayed through the baseline's windows (one
        request or more waiting in three of every four: _queue_floor); the finished rate not below its baseline
        by more than its allowance (`up`: the server runs as many at once), or not above it (not `up`). None
        where any of them does not hold, has no baseline or no value in those windows, or it is off."""
        c = self.config
        tracks = [self.tracks[n] for n in ("in_server_mean", "waiting", "finished_per_s")]
        last = c.confirm_windows
        if not c.queued_load or not self._closed_loop or any(
                tr.baseline is None or len(tr.times) < last or tr.times[-last:] != tracks[0].times[-last:]
                for tr in tracks):
            return None
        inside, waiting, finished = tracks
        assert inside.baseline and waiting.baseline and finished.baseline
        n, n0 = inside.values[-1], inside.baseline.level
        if n <= 0 or n0 <= 0:
            return None
        rise = 1 + (c.drift_to_find_frac if c.drift_to_find_frac is not None else 0.5)
        sign = 1.0 if up else -1.0
        if (n / n0) ** sign < rise:
            return None
        if not up and self._queue_floor < 1.0:
            return None  # no queue stayed through the baseline's windows: nothing to drain
        moved = max(1.0, c.queued_share * sign * (n - n0))
        if any(sign * (x - waiting.baseline.level) < moved for x in waiting.values[-last:]):
            return None
        # more users served no fewer (a queue keeps the server's batch full between a user's answer and its next
        # request: vllm11's finished rate x1.13), fewer no more; a server that runs fewer at once finishes fewer
        return n / n0 if sign * finished.baseline.z(finished.values[-1]) >= -finished.cusum.k else None

    def _queued(self) -> float | None:
        """_queue_moved up, with the ITL mean within its CUSUM's allowance (the server's speed per token
        unchanged): more requests than the server runs at once, queued (their latencies up by that wait, judged
        or not)."""
        ratio = self._queue_moved(up=True)
        itl = self.tracks["itl_ms_mean"]
        if ratio is None or itl.baseline is None or itl.times[-1] != self.tracks["in_server_mean"].times[-1]:
            return None
        return ratio if self._z("itl_ms_mean") <= itl.cusum.k else None

    def _opening(self, kind: EventKind, t: float, cause: str, sides: dict[str, Direction], detail: str) -> Event:
        """The event of an anomaly or a saturation that opens: a new episode, or the same one reopened where
        it recovered within reopen_gap_s on the same cause."""
        gap = self.config.reopen_gap_s
        self._closed = [c for c in self._closed if gap is not None and t - c.time <= gap]
        prior = next((c for c in reversed(self._closed) if c.kind == kind and c.cause == cause), None)
        if prior is not None:
            self._closed.remove(prior)
            detail += f" (reopened {t - prior.time:.0f} s after it recovered: the episode of window {prior.episode})"
        ev = self._event(kind, t, cause, sides, detail, episode=prior.episode if prior is not None else None,
                         reopened=prior is not None)
        self._open.append(_Open(kind, cause, sides, ev.episode))
        return ev

    def _recovered(self, o: _Open, t: float, detail: str) -> Event:
        """The recovery event of an open anomaly or saturation, which leaves it open to reopening."""
        self._open.remove(o)
        self._closed.append(_Closed(o.kind, o.cause, o.episode, t))
        return self._event("recovery", t, o.kind, o.signals, detail, episode=o.episode)

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
                for name in o.signals:
                    self.tracks[name].cusum.reset()
                out.append(self._recovered(o, t, f"back to normal after the {o.cause} anomaly: "
                                           + ", ".join(o.signals)))
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
                limit = {"kv_full": f">= {c.kv_full_frac}", "bandwidth": f">= {c.dram_limit_frac}",
                         "queue_growing": "growing (Mann-Kendall)"}[cause]
                val = s.get(signal_of[cause], math.nan)
                out.append(self._opening("saturation", t, cause, {signal_of[cause]: "up"},
                                         f"saturation ({cause}): {signal_of[cause]} {val:.4g} {limit}"))
            elif opened is not None:
                opened.calm = opened.calm + 1 if not on else 0
                if opened.calm >= c.recovery_windows:
                    out.append(self._recovered(opened, t, f"back to normal after the {cause} saturation"))
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


def arrival_spread_ratio(inside: Sequence[float], done: Sequence[float]) -> float | None:
    """The spread (standard deviation) of the log of the requests in the server over windows (`inside`, each > 0;
    the window farthest from their median left out: a loop's start, or one window's chance) over the least an
    open loop's Poisson arrivals give it, 1 / sqrt(the mean number finished in a window, `done`). A closed loop
    with no think time holds them at its users: far below 1 (MonitorConfig.queued_steady). None with fewer than
    3 windows or none finished."""
    if len(inside) < 3 or not done or statistics.fmean(done) <= 0:
        return None
    logs = [math.log(v) for v in inside]
    mid = statistics.median(logs)
    kept = sorted(logs, key=lambda x: abs(x - mid))[:-1]
    return statistics.stdev(kept) * math.sqrt(statistics.fmean(done))


def _unfollowed(moved: float, followed: float, share: float) -> bool:
    """Whether the requests in the server (log move `followed`) moved the rate's way by less than `share` of the
    rate's log move `moved` (MonitorConfig.paced_rate): the server's speed moved the rate, not its users."""
    return (followed - share * moved) * moved < 0


def _paced_text(ratio: float) -> str:
    return (f"the request rate x{ratio:.2f} with the requests in the server steady (Little's law): a closed loop "
            f"answered {'more slowly' if ratio < 1 else 'faster'}")


def _queued_text(ratio: float) -> str:
    if ratio >= 1:
        return (f"the requests in the server x{ratio:.2f} (Little's law), the added ones waiting, at the same "
                "finished rate and speed per token: more requests than the server runs at once (a closed loop's "
                "users grew at its capacity)")
    return (f"the requests in the server x{ratio:.2f} (Little's law), fewer of them waiting, at the same finished "
            "rate: fewer requests beyond what the server runs at once (a closed loop's users at its capacity left)")


def _split(times: Sequence[float], vals: Sequence[float], starved: set[float]) -> tuple[list[float], list[float]]:
    """`vals` of the windows ending at `times`: (those not in `starved`, those in it)."""
    out: tuple[list[float], list[float]] = ([], [])
    for t, v in zip(times, vals, strict=True):
        out[t in starved].append(v)
    return out
