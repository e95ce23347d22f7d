"""A closed loop at its server's capacity (tuner.monitor.config.MonitorConfig.queued_load): more users than the
server runs at once wait in its queue, so the rate stays and every request's TTFT and end-to-end time grow by the
wait while the server's speed per token does not: a drift (the load moved), and their leaving another; a slower
server, or one that runs fewer requests at once, stays an anomaly."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Iterator
from dataclasses import replace

from tuner.monitor.classify import Event, Monitor
from tuner.monitor.config import MonitorConfig

WINDOW_S = 15.0
OUT_TOKENS = 16.0
PREFILL_S = 0.02
CONFIG = MonitorConfig(interval_s=WINDOW_S)
CLOSED_SD = 0.005  # a closed loop's requests in the server, the spread of their log (vllm10-12: 0.001-0.009)


def window(rng: random.Random, *, offered: float, running: float, waiting: float, itl_s: float,
           arrivals: float | None = None, inside_sd: float | None = None) -> dict[str, float]:
    """One window of a server that runs `running` requests at once, each of OUT_TOKENS tokens `itl_s` apart, with
    `waiting` more in its queue (all `offered` requests in it: Little's law gives the time each waits there):
    the finished rate running / service time, a few percent of noise on every signal; `arrivals` the users'
    rate where it differs from the finished one (an open loop whose queue grows); `inside_sd` the spread of an open
    loop's requests in the server's log beyond what its finished count's chance gives them (0.1-0.8 over 20 windows
    on the recorded streams); None and no `arrivals`: a closed loop, whose requests in the server are its users
    (Little's law), with the recorded vLLM closed loops' spread."""
    service_s = PREFILL_S + OUT_TOKENS * itl_s
    done = max(1, round(rng.gauss(running / service_s * WINDOW_S, math.sqrt(running / service_s * WINDOW_S) / 2)))
    finished = done / WINDOW_S
    wait_s = max(0.0, offered - running) / (running / service_s)  # the queue's wait: Little's law on it
    e2e = (service_s + wait_s) * rng.gauss(1, 0.02)
    itl = itl_s * rng.gauss(1, 0.02)
    return {"rate_per_s": finished if arrivals is None else arrivals, "finished_per_s": finished,
            "prompt_tokens_mean": rng.gauss(100, 3), "output_tokens_mean": rng.gauss(OUT_TOKENS, 0.5),
            "itl_ms_mean": 1000 * itl, "itl_ms_p90": 1150 * itl * rng.gauss(1, 0.02),
            "ttft_ms_p50": 1000 * (PREFILL_S + wait_s) * rng.gauss(1, 0.03),
            "ttft_ms_p90": 1300 * (PREFILL_S + wait_s) * rng.gauss(1, 0.03),
            "e2el_ms_p50": 1000 * e2e, "e2el_ms_p90": 1200 * e2e * rng.gauss(1, 0.02),
            "running": running, "waiting": max(0.0, round(waiting + rng.gauss(0, 0.3))),
            "in_server_mean": (offered * math.exp(rng.gauss(0, CLOSED_SD)) if inside_sd is None and arrivals is None
                               else finished * e2e * math.exp(rng.gauss(0, inside_sd or 0.0)))}


def watch(windows: Iterable[dict[str, float]], config: MonitorConfig = CONFIG) -> list[tuple[int, Event]]:
    m = Monitor(config)
    return [(i, e) for i, w in enumerate(windows) for e in m.observe(WINDOW_S * (i + 1), w)]


def closed_loop(users: list[int], capacity: list[int], itl_s: list[float], seed: int,
                config: MonitorConfig = CONFIG) -> list[tuple[int, Event]]:
    """Window i: `users[i]` requests in flight (each sent as the last is answered), the server running at most
    `capacity[i]` of them at once, the rest waiting."""
    rng = random.Random(seed)
    return watch((window(rng, offered=n, running=min(n, c), waiting=max(0, n - c), itl_s=s)
                  for n, c, s in zip(users, capacity, itl_s, strict=True)), config)


def first_after(events: list[tuple[int, Event]], at: int) -> tuple[int, Event]:
    return next((i, e) for i, e in events if i >= at and e.kind != "recovery")


def open_loop_losing_capacity(seed: int, at: int) -> Iterator[dict[str, float]]:
    """Poisson arrivals at 80 % of a server that runs 8 at once, which from window `at` runs 4: its queue grows."""
    rng = random.Random(seed)
    service_s = PREFILL_S + OUT_TOKENS * 0.01
    rate = 0.8 * 8 / service_s
    queue = 0.0
    for j in range(70):
        cap = 8 if j < at else 4
        busy = min(cap, rate * service_s)  # Little's law in the server's batch
        queue = max(0.0, queue + (rate - busy / service_s) * WINDOW_S)
        yield window(rng, offered=busy + queue, running=busy, waiting=queue, itl_s=0.01,
                     arrivals=rng.gauss(rate, math.sqrt(rate / WINDOW_S)))


def test_users_grown_at_capacity_are_a_drift_and_their_leaving_another() -> None:
    up, down = 40, 80
    for seed in range(6):
        users = [8] * up + [16] * (down - up) + [8] * 40  # twice the users of a server that runs 8 at once, back
        events = closed_loop(users, [8] * 120, [0.01] * 120, seed)
        assert all(i >= up for i, _ in events), events  # nothing before the change
        i, e = first_after(events, up)
        assert e.kind == "drift" and i - up < 4, (seed, i, e.kind, e.detail)
        assert e.signals["in_server_mean"]["direction"] == "up" and "users grew at its capacity" in e.detail
        assert e.observed["in_server_mean"] > 12, e.observed  # what the next cycle tunes for: 16 in flight
        i, e = first_after(events, down)
        assert e.kind == "drift" and i - down < 4, (seed, i, e.kind, e.detail)
        assert e.signals["in_server_mean"]["direction"] == "down" and "left" in e.detail, e.detail
        assert not any(e.kind == "anomaly" for _, e in events), [(i, e.kind, e.detail) for i, e in events]
        # the rule off: the queue's wait is taken for a server slower at an unchanged load
        i, e = first_after(closed_loop(users, [8] * 120, [0.01] * 120, seed, replace(CONFIG, queued_load=False)),
                           up)
        assert e.kind == "anomaly" and "in_server_mean" not in e.signals, (seed, e.kind, e.detail)


def test_a_slower_server_with_a_queue_stays_an_anomaly() -> None:
    at = 40
    for seed in range(6):  # 16 users, 8 run at once; then every token takes 1.3 times as long
        events = closed_loop([16] * 70, [8] * 70, [0.01] * at + [0.013] * 30, seed)
        i, e = first_after(events, at)
        assert e.kind == "anomaly" and i - at < 4 and "itl_ms_mean" in e.signals, (seed, i, e.kind, e.detail)
        assert not any(e.kind == "drift" for _, e in events), [(i, e.kind, e.detail) for i, e in events]


def test_a_server_that_runs_fewer_requests_at_once_stays_an_anomaly() -> None:
    """Its capacity halved (a smaller KV cache, a lower batch limit deployed) at the same speed per token: a closed
    loop's queue grows at a lower finished rate; an open loop's arrivals, no longer all served, queue up."""
    at = 40
    for seed in range(6):
        events = closed_loop([12] * 70, [8] * at + [4] * 30, [0.01] * 70, seed)
        i, e = first_after(events, at)
        assert e.kind == "anomaly" and i - at < 4, (seed, i, e.kind, e.detail)
        assert not any(e.kind == "drift" for _, e in events), [(i, e.kind, e.detail) for i, e in events]

        events = watch(open_loop_losing_capacity(seed, at))
        i, e = first_after(events, at)
        assert e.kind in ("anomaly", "saturation") and i - at < 4, (seed, i, e.kind, e.detail)
        assert not any(e.kind == "drift" for _, e in events), [(i, e.kind, e.detail) for i, e in events]


def test_an_open_loops_queue_that_drains_at_the_same_rate_is_no_drift() -> None:
    """An open loop on a busy host keeps a queue while its neighbours hold the CPU, and it drains when they let
    the server run (the latencies corrected for that wait unchanged, the rate the same): no users came or left,
    whatever the queue did (experiments/detection's busy3 before the closed-loop condition: two windows of half the
    requests in the server, called users leaving)."""
    at = 40
    for seed in range(6):
        rng = random.Random(seed)
        windows = [window(rng, offered=8 + (8 if i < at else 0), running=8, waiting=8 if i < at else 0, itl_s=0.01,
                          inside_sd=0.3) for i in range(70)]
        events = watch(windows)
        assert not any(e.kind == "drift" for _, e in events), [(i, e.kind, e.detail) for i, e in events]
        # the same queue's draining in a closed loop (its requests in the server steady): its users left
        rng = random.Random(seed)
        steady = [window(rng, offered=8 + (8 if i < at else 0), running=8, waiting=8 if i < at else 0,
                         itl_s=0.01) for i in range(70)]
        i, e = first_after(watch(steady), at)
        assert e.kind == "drift" and e.signals["in_server_mean"]["direction"] == "down", (seed, i, e.detail)


def test_an_anomaly_the_joining_users_opened_becomes_their_drift() -> None:
    """The users join while something else slows the server for two windows (on a small host, the new clients'
    own start): the first windows look like a slower server, an anomaly; once the queue settles at the server's
    speed, the load it was is a drift (the anomaly closed with it, the baseline learnt again)."""
    at = 40
    for seed in range(6):
        users = [8] * at + [16] * 30
        itl = [0.01] * at + [0.016, 0.016] + [0.01] * 28  # the first two windows of the users' load slower
        events = closed_loop(users, [8] * 70, itl, seed)
        kinds = [(i, e.kind) for i, e in events if i >= at and e.kind != "recovery"]
        drift = next((i for i, e in events if e.kind == "drift"), None)
        assert drift is not None and drift - at < 6, (seed, kinds)
        assert [k for i, k in kinds if i < drift] == ["anomaly"], (seed, kinds)  # the slower windows' anomaly
        e = next(e for i, e in events if i == drift and e.kind == "drift")
        assert e.signals["in_server_mean"]["direction"] == "up", e.detail
        assert all(k != "anomaly" for i, k in kinds if i > drift), kinds  # nothing open after it


def test_users_whose_queue_fills_the_batch_are_a_drift_though_more_finish() -> None:
    """Each user sends its next request only once its answer is back, so at capacity the server's batch has a gap
    between them (here 12 % of its slots idle); twice the users keep a queue that fills it, and the server
    finishes more at the same speed per token (vllm11's finished rate x1.13): the load moved, not the server. The
    same queue at a lower finished rate stays the anomaly of a server that runs fewer at once (above)."""
    up, gap = 40, 0.88
    for seed in range(6):
        rng = random.Random(seed)
        users = [8] * up + [16] * 30
        windows = [window(rng, offered=n, running=min(gap * n, 8), waiting=max(0, n - 8), itl_s=0.01)
                   for n in users]
        events = watch(windows)
        assert all(i >= up for i, _ in events), events
        i, e = first_after(events, up)
        assert e.kind == "drift" and i - up < 4, (seed, i, e.kind, e.detail)
        assert e.signals["in_server_mean"]["direction"] == "up", e.detail
        assert not any(e.kind == "anomaly" for _, e in events), [(i, e.kind, e.detail) for i, e in events]


def test_a_closed_loop_whose_learning_began_with_its_start_is_still_one() -> None:
    """The monitor began watching as the users started: its first window held them a fifth of its length (the
    requests in the server a fifth of the users, as few finished). That window is the traffic's start, not an
    open loop's wander: twice the users later are still a drift (the first form, the spread of all the learning
    windows at most 0.1, took the loop for an open one: an anomaly, as on the live test's busy host)."""
    up = 40
    for seed in range(6):
        rng = random.Random(seed)
        users = [8] * up + [16] * 30
        windows = [window(rng, offered=n, running=min(n, 8), waiting=max(0, n - 8), itl_s=0.01) for n in users]
        for k in ("in_server_mean", "finished_per_s", "rate_per_s"):
            windows[0][k] *= 0.2
        events = watch(windows)
        i, e = first_after(events, up)
        assert e.kind == "drift" and i - up < 4, (seed, i, e.kind, e.detail)
        assert e.signals["in_server_mean"]["direction"] == "up" and "users grew at its capacity" in e.detail


def test_users_who_join_while_the_server_waits_beyond_what_is_judged_are_a_drift() -> None:
    """A busy host: the server waits for a CPU about half of every window, beyond max_wait_judged once the users
    joined, so no latency is judged there. The requests in a closed loop's server are its users whatever the
    server's speed: their rise with a queue at the same finished rate is still a drift, found as soon as the
    queue stayed (the first form waited for a latency's alarm: none, as on the busy probe for 30 windows)."""
    up = 40
    for seed in range(6):
        rng = random.Random(seed)
        users = [8] * up + [16] * 30
        windows = [{**window(rng, offered=n, running=min(n, 8), waiting=max(0, n - 8), itl_s=0.01),
                    "cpu_wait_frac": (0.45 if i < up else 0.55) + rng.gauss(0, 0.01)} for i, n in enumerate(users)]
        events = watch(windows)
        assert all(i >= up for i, _ in events), events
        i, e = first_after(events, up)
        assert e.kind == "drift" and i - up < 4, (seed, i, e.kind, e.detail)
        assert "users grew at its capacity" in e.detail and "anomaly" not in e.detail, e.detail
