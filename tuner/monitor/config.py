"""What the monitor watches and how it is set: each signal's rule (`RULES`: the direction that matters, its
resolution, the scale it is watched on, whether it alarms at all), the number of one-sided tests they make
(`TESTS`, among which the false-alarm budget is shared), and `MonitorConfig`, every setting of the detector
and of the classification (tuner.monitor.classify), with the reason for each default (experiments/detection).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Literal

from tuner.monitor.detect import CONFIDENCE, Direction, Transform, threshold
from tuner.monitor.signals import LATENCIES, SIGNALS
from tuner.spec import MonitorSpec


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
    # NVML's (and DCGM's) utilisation is the share of one short sample period (1/6-1 s) in which a kernel ran: read
    # once a window it moved 7-31 % around 20 % between 4-s windows at a steady load on the H200 (tails both ways),
    # which scales learnt from 20 windows took for changes (4-9 false alarms a day on its own scale or the log's,
    # experiments/detection's fifteenth step); its resolution is 10 points. The monitor now reads the window's
    # mean where NVML's buffer or Prometheus holds one (a spread of 3 points there, the sixteenth step), one read
    # where not (the first window, a driver without the buffer, a window shorter than Prometheus' scrape
    # interval), so the resolution stays. Power, which integrates, moved 137-155 W there
    "gpu_util_pct": SignalRule("both", 10.0), "gpu_power_w": SignalRule("both", 5.0),
    "gpu_sm_clock_mhz": SignalRule("down", 15.0), "gpu_dram_active_frac": SignalRule("both", 0.02),
    "gpu_fb_used_mb": SignalRule("up", 256.0), "gpu_throttled": SignalRule("up", 0.05),
    "cpu_wait_frac": SignalRule("up", 0.02, tested=False), "cpu_steal_frac": SignalRule("up", 0.02, tested=False),
    "cpu_ready_wait_frac": SignalRule("up", 0.02, tested=False),
    "host_probe_us": SignalRule("up", 1.0, "log", tested=False),
    "finished_per_s": SignalRule("both", 0.01, tested=False),
    # Little's law's mean requests in the server: it judges whether a fall of the rate is fewer users (it falls
    # too) or a closed loop answered more slowly (it does not: MonitorConfig.paced_rate); never alarms itself
    "in_server_mean": SignalRule("both", 0.05, "log", tested=False),
}
assert set(RULES) == set(SIGNALS)
TESTS = sum(2 if r.direction == "both" else 1 for r in RULES.values() if r.tested)  # one-sided tests per window


def host_speed_signal_problem(name: str, share: float) -> str | None:
    """What is wrong with judging latency `name` at the host's speed with `share` of the elasticity
    (MonitorConfig.host_speed_signals), None where nothing is."""
    if name not in LATENCIES:
        return f"the latency is one of {', '.join(LATENCIES)}"
    if not 0.0 < share <= 2.0:
        return "its share of the elasticity is a number above 0 and at most 2"
    return None


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
    # host slower by 10-16 % (experiments/detection) would add up to an alarm. None: k alone. (Never below k:
    # on a busy host, whose latency scale is as large as the slowdown, the exact half found hardly more and the
    # inputs alarmed more often: experiments/detection's ninth step)
    slowdown_to_find_frac: float | None = 0.3
    # an input's allowance likewise at least half the drift to find (a rate or a length 1 + frac times its
    # normal, or 1 / (1 + frac) of it) on its scale: the inputs' windows have heavy tails, and moderate
    # residuals summed over several windows made most of their false alarms (experiments/detection). None: k
    drift_to_find_frac: float | None = 0.5
    # the request rate's learnt spread at least a Poisson count's at its median rate, sqrt(rate / interval_s) (the
    # arrivals of many independent users are Poisson or burstier): a spread learnt from 20 windows is below the
    # true one in about 1 baseline in 10, and a CUSUM on a scale too small alarms more often than its design (its
    # centre's error is a bias every window sums). On Poisson arrivals the rate's test alone alarmed 0.16-0.34
    # times a day without it, 4-8 times its share of the budget (1 / 23 a day), 0.06-0.16 with it
    # (experiments/detection/poisson_rate.py). Off by default: on the recorded streams it took few false alarms
    # away (every total already within one a day) and found the quiet stream's recorded rate doubling in a median
    # of 3 windows instead of 2 (experiments/detection, twentieth step)
    rate_poisson_floor: bool = False
    # the upper confidence bound of an input's spread learnt from its baseline's windows (Baseline.learn). 0.99
    # held the rate's test to its share on Poisson arrivals (0-0.06 a day), but widened every input's baseline and
    # found the recorded rate doublings later (quiet8 in a median of 3 -> 5 windows, quiet and quiet9 2 -> 3)
    input_confidence: float = CONFIDENCE
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
    # a warm-up judged (on by default): learning ends at learn_windows whatever the trend, every signal then
    # judged, the latencies against that first baseline (it sits high: only a change beyond the warm-up's excess
    # is found meanwhile); while their calm windows' latency still falls (warmup_p) the latencies' baselines are
    # learnt again from the latest learn_windows calm judged windows (no latency alarm pending, no anomaly open),
    # every half of learn_windows of them, until it no longer falls or warmup_max_factor x learn_windows windows
    # have gone. Off: learning goes on through the warm-up, nothing judged, and a drift, a GPU fault or a
    # slowdown that came meanwhile was learnt as normal and never found (experiments/detection's H200 streams: 2
    # of 13 starts missed a 2x rate, a GPU neighbour at 690 W against 145 W and a server twice as slow)
    warmup_judged: bool = True
    settle_windows: int = 1  # an output alarm waits this long for an input alarm before it is an anomaly ...
    settle_evidence: float = 0.25  # ... while an input's CUSUM holds at least this share of h (else none)
    # a closed loop's rate is the server's answer, not its users' input: they send the next request when the last
    # is answered, so a slower server answers fewer a second. A window's fall of the request rate (beyond its
    # allowance) whose requests in the server (Little's law: in_server_mean = rate x time in the server) fell by
    # less than paced_share of it, on the log scale, is that (a slower server: no drift, and no
    # evidence an output alarm waits for); fewer users of an open or a closed loop take it down with the rate (the
    # time in the server the same or shorter). The mirror, in a closed loop only (queued_steady): a rise of the
    # rate whose requests in the server rose by less than paced_share of it is a faster server (its warm-up, a
    # neighbour that left), no drift; more users of a closed loop below its capacity raise both (twenty-eighth
    # step). Off: the rate is an input whatever paces it, and a closed loop's slowdown is called a drift
    # (experiments/detection, twenty-fifth step)
    paced_rate: bool = True
    paced_share: float = 0.5
    # a closed loop at its server's capacity whose users grew: the server runs no more requests at once, so its
    # rate stays and the added users wait in its queue, every request's TTFT and end-to-end time longer by that
    # wait while the server's speed per token is unchanged. In a window where no output but latencies alarms (the
    # latencies' anomaly, or none yet: a CUSUM below h, windows that waited beyond max_wait_judged, twenty-eighth
    # step) whose requests in the server (in_server_mean) rose to at least 1 + drift_to_find_frac (0.5 where None)
    # times their baseline, at least queued_share of that rise (and at least one request) more waiting in each
    # of the latest confirm_windows windows, with the ITL mean within its CUSUM's allowance and the finished rate
    # not below its own (more users keep the server's batch full: it may finish more), the load moved: a drift
    # (the next cycle tunes the traffic it observes); and the mirror (latencies only fall), where a queue that
    # stayed through the baseline drains at a finished rate not above its allowance: the users left, another
    # drift. A slower server raises its ITL, a server that runs fewer requests at once
    # finishes fewer: both stay anomalies. Off: an anomaly "at unchanged load", and their leaving no event
    # (experiments/detection, twenty-sixth step)
    queued_load: bool = True
    queued_share: float = 0.5
    # ... only in a closed loop: the requests in the server held steadier through the baseline's windows than
    # arrivals keep them. The spread of their log (the window farthest from its median left out: the traffic's
    # start, or one window's chance) at most queued_steady times 1 / sqrt(the mean number finished in a window),
    # the spread an open loop's Poisson arrivals give it at the least. A closed loop with no think time holds them
    # at its users: 0.02-0.16 of it over 15 windows on the recorded vLLM closed loops (15-s windows), up to 0.25
    # on the engine's 1-s windows of ~10 requests on a host whose 2 cores 3 busy processes share; open loops'
    # wander with their arrivals: 0.40 at the least, ~1 typically, over every 15 windows of every recorded open
    # loop (experiments/detection, twenty-eighth step). The first form, the spread at most 0.1 whatever the
    # windows' size, took 17 % of one open loop's stretches for closed ones and none of a loop whose learning
    # windows held its start
    queued_steady: float = 1 / 3
    # a change of the workload inside a baseline's learning windows (none of them is judged: the CUSUMs start
    # with the baseline): at every learning window, a level shift of an input (rate, prompt or output length) or,
    # in a closed loop (queued_steady over the windows before it), of the requests in the server (its users), by
    # at least drift_to_find_frac (0.5 where None) on the log scale (tuner.monitor.detect.level_shift: ruptures
    # places it, a t-test at the false-alarm budget's share of one window, the windows' spread at least
    # learning_shift_floor, judges it) is a drift, and the learning restarts at the shift. A rate moved by a
    # closed loop's server (its requests in the server did not follow: paced_rate) is none, the loop's sign read on
    # the windows before the shift, or after it where fewer than 3 came before (vllm15). The learning windows'
    # share of the budget is otherwise unspent. Off: a baseline learnt across the change, which judges what came
    # after against a mix of both loads (vllm13: the users' return 0/8 found, the slowdown after it a drift 8/8;
    # experiments/detection, twenty-ninth step)
    learning_shift: bool = True
    learning_shift_floor: float = 0.05
    # latencies divided by 1 / (1 - w) where the wait is read: a server that waited a share w of the window for
    # a CPU (a noisy neighbour: cpu_wait_frac, and a hypervisor's other guests: cpu_steal_frac s, the two
    # together w = 1 - (1 - wait)(1 - s)) is expected to be 1 / (1 - w) times as slow
    contention: bool = True
    autocorrelation: bool = True  # latency scales widened by their pooled lag-1 autocorrelation (AR(1))
    # the autocorrelation that widens a baseline: the mean of the estimates of this baseline and of up to
    # autocorrelation_baselines - 1 baselines learnt before it in the monitor's life (after a drift or a new
    # champion the server and its host are the same; 20 windows' lag-1 estimate has a standard error of about
    # 0.2, and one wander in them widened a relearnt scale x1.51: experiments/detection, twenty-fourth step);
    # 1: this baseline's alone
    autocorrelation_baselines: int = 1
    # with the latencies judged at the host's speed, the autocorrelation of those judged so (host_speed_signals)
    # pooled apart from the rest's, each group's widening its own: the quantiles left with the host's wander are
    # autocorrelated where the corrected ITL mean is less so, and pooled with them it widened the ITL mean's scale
    # (experiments/detection, thirty-fifth step: bound.py's learnt scale 1.45 -> 1.59 on vllm23h). Off: all six pooled
    autocorrelation_apart: bool = False
    # the windows over which the autocorrelation widens a latency's scale: None, the long-run scale of an AR(1)
    # series (every window's sum, however long); a number, that of the mean of so many consecutive windows
    # (detect.ar1_mean_factor): a CUSUM whose allowance k is large sums about h / k windows (3 at k = 1.25,
    # h = 4) before it resets or alarms, and the long-run factor widens it for sums it never makes
    # (experiments/detection, thirty-sixth step). The agent file's default is 3 where the probe follows the server's
    # CPU (autocorrelation_horizon_of)
    autocorrelation_horizon: int | None = None
    # with the latencies' history (history_windows), their autocorrelation estimated again from its windows at each
    # relearning, as their spread is: one from the first baseline's 20 windows is uncertain by about 0.2 (1 /
    # sqrt(20)), and the long-run widening it gives, x1.67 at 0.47 against x1.22 at 0.2, stayed with every
    # relearnt baseline (experiments/detection, thirty-sixth step). Off: the learning stretch's, kept
    autocorrelation_history: bool = False
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
    # the 1 / (1 - w) law's own error: its exponent known to +- this (the busy streams' fitted exponents of the
    # ready share, 0.89 and 1.03: experiments/detection, thirteenth step; 0.5 was the window share's)
    wait_law_error: float = 0.2
    # which share of the wait stretches the latencies (w in 1 / (1 - w)): "window", the share of the window the
    # server waited (cpu_wait_frac: right for a thread never idle); "ready", the share of the time it was ready
    # to run that it waited (cpu_ready_wait_frac, read from a process's schedstat: its CPU work took
    # 1 / (1 - w) as long whatever the share of the window it slept; the window's share where it is not read);
    # "auto", the ready share where the server measurably waited, the window's where it did not, by degrees
    # around wait_error: none of the ready share where the window's share is half of wait_error, all of it at
    # one and a half times it, in proportion between. On a quiet host the ready share is the wake-up wait (about
    # 0.07 of the time ready, against 0.01 of the window) and its noise, not contention, and "ready" raised
    # quiet hosts' false alarms (experiments/detection, thirteenth step); a switch at wait_error corrected the
    # windows of a real vLLM whose share sits at it by x0.98 or x0.77 at random, a noise of its own that hid a
    # +30 % slowdown (experiments/detection, eighteenth step)
    wait_law: Literal["window", "ready", "auto"] = "auto"
    # what sets "auto"'s degree below one and a half times wait_error: the median share of the window over the
    # latest learn_windows windows ("usual") or the window's own ("window"). At a steady contention a server 30 %
    # slower is busy, and waits, 30 % longer in a window while its ready share stays: inside the band the window's
    # own share moved the degree enough to explain part of a slowdown away, and its wander was a noise of its
    # own (a real vLLM at 2 req/s: a +30 % slowdown found in a median of 6 windows, 4 by the usual share;
    # experiments/detection, nineteenth step)
    wait_blend: Literal["window", "usual"] = "usual"
    # the law's error (wait_law_error) counted on the window's stretch 1 / (1 - w) away from the one usual in
    # the baseline's windows (their median), which the baseline already holds (True), or on all of it (False)
    wait_law_relative: bool = True
    # the share's own error, wait_error / (1 - w), counted (True) only beyond the one the baseline's windows
    # already hold (at their median stretch: a window's error of the measured share is in their spread, so in
    # the learnt scale), never below wait_error itself: sqrt(wait_error^2 + max(0, err(w)^2 - err(usual)^2));
    # False: in full on top of the scale. Where a neighbour keeps the server waiting 0.7 of its ready time the
    # full error (0.1 on the log scale) counted again shrank a +30 % slowdown's z to near the CUSUM's allowance
    # (found 37 of 100 times on the busy stationary_b; 66 counted once), while the windows near the usual wait
    # spread 0.057 in all (experiments/detection, nineteenth step). On a quiet host both are wait_error.
    wait_error_relative: bool = True
    # the correction checked on each baseline's learning windows: where it spreads the log ITL mean more than
    # this many times as wide as uncorrected, that baseline's latencies are judged uncorrected (and without the
    # wait's error). The law holds where neighbours take the CPUs (the busy streams: the ITL's slope on the
    # stretch 0.8-1.2, the correction narrowing it x0.3-0.4); a closed loop on a small host waits for its own
    # load's clients and front end, most when the server runs fastest (vLLM capped at 3 at once: slope -1.2,
    # the correction widening it x1.43; at 2: x2.1), and the correction hid its slowdowns
    # (experiments/detection, twenty-seventh step). Checked in a closed loop only (queued_steady over the learning
    # windows): there the clients send as fast as the server answers, so the CPU they take follows its speed; an open
    # loop's clients are paced by its arrivals, and checking one (vllm7) took a wander the correction explained
    # for anomalies (twenty-ninth step). On by default since the thirtieth step: a closed loop whose wait was a
    # neighbour's (vLLM capped at 3 on 2 cores, a process spinning on one of them for minutes at a time: the ready
    # share 0.9, the ITL x1.7 where the law says x7) was left blind by the law (a server twice as slow found 9 times
    # in 100, 100 with the check; false alarms in blocks of 8 over 1200 h 4.46 -> 0.54 episodes a day); the price,
    # on the closed loops whose wait was their own clients': vllm11 0.12 -> 1.38 and vllm13 0.48 -> 1.08 a day.
    # None: always corrected
    wait_checked: float | None = 1.25
    # the host's own speed (the signal host_probe_us, tuner.monitor.hostspeed: the geometric mean of the CPU time of
    # three fixed tasks, on the CPU the server works on where the daemon follows its processes): a server on a shared
    # host gets slower at unchanged load, without waiting for a CPU, when the hypervisor's other guests share its core
    # or fill the cache and memory bus. With an elasticity e its ITL mean (host_speed_signals) is judged at the host's
    # speed, x (probe / the baseline's median probe) ** -e. e is the server's on its host (the slope of its log ITL mean
    # on the log probe over a long calm stretch: experiments/detection's host_speed.py). vLLM's CPU build with its model
    # in the engine core on one thread (the uni executor): 1.0 (the thirty-fourth step: 1.06, 1.01, 1.05 on three
    # streams, 1.01 on a fourth recorded after, whose log ITL mean's spread it took 0.159 -> 0.063 read on the engine's
    # own CPU). In vLLM's default multiprocess executor its processes spin on each other and the probe explains nothing:
    # 1.0 there raised vllm17's false alarms (from every start 15.77 -> 23.94 a day, window by window 0.40 -> 0.76 at
    # 1200 h), so there is no default. Each baseline's own fit over its 20 learning windows was tried and dropped
    # (thirty-third step: it ranged 0-1 from one start to the next). None: not corrected (the signal still recorded)
    host_speed_elasticity: float | None = None
    # the latencies judged at the host's speed, each with its share of the elasticity (judged with e x share): the
    # one read exactly, the ITL mean (a sum over a count), on which the elasticity was measured, at 1; the TTFT
    # median at 0.5, the share it follows the host with (0.37-0.54 on six of nine probed streams, median 0.51:
    # experiments/detection's latency_speed.py, thirty-eighth step). Judged without the host's speed, the TTFT
    # median called a host episode the probe read (+0.27 log) an anomaly (vllm31h: 114 false alarms a day in its
    # life, its slowdown found from none of 20 starts; at 0.5: 0 and 20/20; thirty-ninth step, where the cost was
    # vllm28h's blocks of 8, 7.48 -> 7.88 a day). Not the other quantiles: a histogram's quantile is interpolated
    # inside its bucket, and a bucket wider than the host's wander holds it still: vllm25's end-to-end p50 and p90
    # sat at 150 and 270 ms inside vLLM's 100-300 ms bucket while the host ran x0.7-1.3, and judged at the host's
    # speed they read that wander as their own and called the fast host's minutes an anomaly (thirty-fifth step)
    host_speed_signals: tuple[tuple[str, float], ...] = (("itl_ms_mean", 1.0), ("ttft_ms_p50", 0.5))
    wait_memory: int = 3  # windows whose CPU wait a latency's uncertainty takes (this one and those before)
    # a latency is not judged while the server waited more than this share of one of those windows (the
    # window's share): the neighbours, not the server, set it then (the windows are counted in `unjudged`).
    # 1.0 judges every window, a starved one with the wide scale its wait's error gives it: with the ready law
    # it found a server twice as slow on the busy host far more often, but a baseline learnt in a calm stretch
    # then took the starved windows for anomalies (3.1 a day; experiments/detection, thirteenth step)
    max_wait_judged: float = 0.5
    # the windows beyond max_wait_judged judged against a baseline of their own: the latencies of the learning
    # stretch's windows beyond it (where at least half of learn_windows were; where fewer than half were within
    # it, the one baseline of every learning window, which knew them), with their own usual stretch; where the
    # learning stretch had too few of them they stay not judged. A baseline learnt in calm windows never judges
    # starved ones (what raised design 1's false alarms), and a host starved all along is judged against its
    # starved normal (experiments/detection, fourteenth step). False: not judged, whatever the baseline saw
    starved_baseline: bool = True
    recovery_windows: int = 3
    # an anomaly or a saturation that opens again, on the same cause, within this many seconds of its recovery
    # is the same episode reopened (Prometheus alerting rules' keep_firing_for, Alertmanager's grouping): its
    # event says so (Event.reopened, Event.episode) and the daemon does not answer it again. One baseline a few
    # percent off its stream's normal lets an anomaly recover and reopen for hours (experiments/detection's
    # quiet stream in blocks of 8: 79 events, 14 episodes at 15 minutes). None: every opening a new episode
    reopen_gap_s: float | None = 900.0
    # the latencies' baselines learnt again, every learn_windows calm windows (judged, no latency alarm pending
    # and no anomaly open), from up to this many of the latest calm windows: a host whose speed wanders over
    # minutes is judged against its longer normal, not the first minutes' (None: the first baseline kept
    # until a drift). The cost: a slowdown slower than the CUSUM finds is partly learnt as normal, and where the
    # speed wanders the longer normal's scale holds the wander. Off by default: at 160 the quiet streams' real
    # orders kept within one false alarm a day (quiet5 1.09 -> 0), but the quiet stream's +30 % found in a median
    # of 3 windows instead of 2 (experiments/detection, twenty-first step)
    history_windows: int | None = None
    # (the agent file's default: off, but HOST_SPEED_HISTORY_WINDOWS where its latencies are judged at the host's
    # speed, MonitorConfig.from_spec)
    # with history_windows: a calm window joins that history only while the server's wait for a CPU (over the
    # wait memory) is within wait_error of its baseline's usual share, so a busy host's history holds the windows
    # its baseline was learnt at, not every contention the wait law corrects for (experiments/detection)
    history_usual_wait: bool = True
    # the inputs' scales learnt again, every learn_windows windows after their baseline, from up to this many of
    # their windows since it, their centres kept (a slow drift still adds up to an alarm): a 20-window baseline's
    # spread is known only to within its chi-square bound (its upper 90 % one, x1.28), which a longer history
    # tightens (x1.18 at 40 windows, x1.09 at 160), so a doubling of the rate is more of its scales. Off (None: the
    # first baseline's kept): at 160 it found a rate x2 no sooner in the median, and the bound's margin was what
    # held the busy host's rate, whose windows have a heavier tail than the CUSUM's design, to its budget
    # (stationary_a over 1200 h: 0.78 -> 1.16 false alarms a day; experiments/detection, eleventh step)
    input_history_windows: int | None = None
    # a baseline on which the ITL mean's test would take more than 12 windows to find the slowdown to find
    # (Monitor.slowdown_windows: a turbulent learning stretch) is not kept while learning may go on (up to
    # warmup_max_factor x learn_windows): learning goes on by half of learn_windows, the baseline then from the
    # latest learn_windows. Off: the cost is a choice of the calmer stretch, whose spread understates the
    # host's (experiments/detection, twelfth step)
    learn_until_sensitive: bool = False
    # the same case met without stopping to judge: while the ITL mean's baseline would find the slowdown to
    # find late, the latencies' baselines are learnt again from the latest learn_windows calm judged windows,
    # every half of learn_windows of them, at most warmup_max_factor times; the inputs and the GPU are judged
    # all along (Monitor._relearn_insensitive). Off: a slowdown that comes while it relearns is partly learnt
    relearn_insensitive: bool = False
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

    def __post_init__(self) -> None:
        for name, share in self.host_speed_signals:
            if host_speed_signal_problem(name, share) is not None:
                raise ValueError(f"MonitorConfig.host_speed_signals: ({name!r}, {share!r}): each a latency of "
                                 f"{', '.join(LATENCIES)} and its share of the elasticity, above 0 and at most 2")

    @property
    def host_speed_names(self) -> tuple[str, ...]:
        """The latencies judged at the host's speed (host_speed_signals)."""
        return tuple(self._host_speed_shares)

    def host_speed_share(self, name: str) -> float:
        """Latency `name`'s share of host_speed_elasticity (0: not judged at the host's speed)."""
        return self._host_speed_shares.get(name, 0.0)

    @cached_property
    def _host_speed_shares(self) -> dict[str, float]:
        """host_speed_signals as latency -> share, made once (read for each latency of every window)."""
        return dict(self.host_speed_signals)

    def clip_for(self, h: float, k: float) -> float:
        """The residuals' clip for a CUSUM of threshold h and allowance k (z_clip where set)."""
        return self.z_clip if self.z_clip is not None else h / 2 + k + 0.25

    @classmethod
    def from_spec(cls, spec: MonitorSpec, interval_s: float) -> MonitorConfig:
        """The agent file's `watch.monitor` at the watch's scrape interval."""
        return cls(interval_s=interval_s, false_alarms_per_day=spec.false_alarms_per_day,
                   learn_windows=spec.learn_windows, settle_windows=spec.settle_windows,
                   recovery_windows=spec.recovery_windows, reopen_gap_s=spec.reopen_gap_s,
                   slowdown_to_find_frac=spec.slowdown_to_find_frac,
                   drift_to_find_frac=spec.drift_to_find_frac,
                   history_windows=history_windows_of(spec),
                   autocorrelation_baselines=spec.autocorrelation_baselines,
                   autocorrelation_horizon=autocorrelation_horizon_of(spec), kv_full_frac=spec.kv_full_frac,
                   dram_limit_frac=spec.dram_limit_frac, host_speed_elasticity=spec.host_speed_elasticity)


# the latencies' history where they are judged at the host's speed (host_speed_elasticity) and the agent file names
# none: the wander that kept it off (a host's speed filling the longer normal's scale) is then read out of the
# latencies first, and a baseline of more windows is a tighter bound on the server's own spread. On the probed
# streams of experiments/detection (thirty-fifth step) it took vllm23h's false alarms in blocks of 8 from 1.32 to
# 0.04 episodes a day and found vllm24h's slowdowns a window sooner, nothing worse by more than 0.02 a day
HOST_SPEED_HISTORY_WINDOWS = 160


def history_windows_of(spec: MonitorSpec) -> int | None:
    """The latencies' history the agent file's monitor asks for: its own `history_windows` where it names one (null
    included: off), else HOST_SPEED_HISTORY_WINDOWS (at least its learn_windows) where the latencies are judged at
    the host's speed, else none."""
    if "history_windows" in spec.model_fields_set or spec.host_speed_elasticity is None:
        return spec.history_windows
    return max(HOST_SPEED_HISTORY_WINDOWS, spec.learn_windows)


# the autocorrelation's horizon where the latencies are judged at the speed of the server's own CPU (the probe
# follows the processes the CPU wait's source names) and the agent file names none: what is left of the host's
# wander after that correction is short-ranged, and the long-run AR(1) widening (at a lag-1 of 0.47 from 20
# windows, x1.67) held a +30 % slowdown a window past two. On the streams probed on the engine's CPU
# (experiments/detection, thirty-sixth step) it took vllm23h's model and life slowdowns from 3 windows to 2 (its
# false alarms in blocks of 8 0.06 -> 0.20 a day) and left the others' delays and false alarms as they were; on
# vllm27h and vllm28h, recorded after it was chosen and judged blind (the thirty-seventh), no delay grew (vllm28h's
# slowdown 97 -> 100 of 100 found, in 5 -> 4); vllm27h's false alarms stayed within 0.06 a day, but on vllm28h, an
# open loop at 6 req/s whose own reading explains its latencies less than the unpinned one, every start 37.40 ->
# 42.75 a day (that goal not met either way) and blocks of 8 0.36 -> 0.56. Where the probe is unpinned the wander
# left is long-ranged and the horizon raised false alarms (vllm20h from every start 2.38 -> 4.76 a day): no horizon
# there
OWN_PROBE_AUTOCORRELATION_HORIZON = 3


def autocorrelation_horizon_of(spec: MonitorSpec) -> int | None:
    """The autocorrelation's horizon the agent file's monitor asks for: its own `autocorrelation_horizon` where it
    names one (null included: the long-run scale), else OWN_PROBE_AUTOCORRELATION_HORIZON where the latencies are
    judged at the host's speed read on the server's own CPU (host_speed_elasticity, and a cpu_wait_source naming its
    processes: tuner.monitor.hostspeed.shared follows them), else none."""
    if "autocorrelation_horizon" in spec.model_fields_set or spec.host_speed_elasticity is None:
        return spec.autocorrelation_horizon
    return OWN_PROBE_AUTOCORRELATION_HORIZON if spec.waits_of_processes else None
