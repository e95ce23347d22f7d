"""A closed loop's request rate is the server's answer to its users (tuner.monitor.config.MonitorConfig.paced_rate):
a slower server answers fewer requests a second while the requests in it (Little's law) stay, an anomaly; fewer
users, or an open loop's fewer arrivals, take the requests in the server down with the rate, a drift."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterable, Iterator
from dataclasses import replace

from tuner.monitor.classify import Event, Monitor
from tuner.monitor.config import MonitorConfig

WINDOW_S = 15.0
OUT_TOKENS = 16.0
CONFIG = MonitorConfig(interval_s=WINDOW_S)


def window(rng: random.Random, *, rate: float, time_s: float, users: int | None = None) -> dict[str, float]:
    """One window of a server whose requests take `time_s` each (end to end, with ITL and TTFT in proportion) at
    `rate` requests a second: the rate counted over the window, the latencies a few percent around their level,
    the requests in the server by Little's law (what vLLM's end-to-end histogram's sum gives over the window):
    a closed loop's `users`, with the recorded vLLM closed loops' spread (0.001-0.009 of their log)."""
    done = max(1, round(rng.gauss(rate * WINDOW_S, math.sqrt(rate * WINDOW_S) / 2)))  # a loop is steadier than Poisson
    e2e = time_s * rng.gauss(1, 0.02)
    itl = (time_s - 0.02) / OUT_TOKENS * rng.gauss(1, 0.02)
    return {"rate_per_s": done / WINDOW_S, "finished_per_s": done / WINDOW_S,
            "prompt_tokens_mean": rng.gauss(100, 3), "output_tokens_mean": rng.gauss(OUT_TOKENS, 0.5),
            "itl_ms_mean": 1000 * itl, "itl_ms_p90": 1150 * itl * rng.gauss(1, 0.02),
            "ttft_ms_p50": 1000 * 0.02 * rng.gauss(1, 0.03) * time_s / 0.2, "e2el_ms_p50": 1000 * e2e,
            "e2el_ms_p90": 1200 * e2e * rng.gauss(1, 0.02),
            "in_server_mean": done * e2e / WINDOW_S if users is None else users * math.exp(rng.gauss(0, 0.005))}


def watch(windows: Iterable[dict[str, float]], config: MonitorConfig = CONFIG) -> list[tuple[int, Event]]:
    """The monitor's events over `windows`, each with its window's index."""
    m = Monitor(config)
    return [(i, e) for i, w in enumerate(windows) for e in m.observe(WINDOW_S * (i + 1), w)]


def closed_loop(users: list[int], time_s: list[float], seed: int,
                config: MonitorConfig = CONFIG) -> list[tuple[int, Event]]:
    """Window i: `users[i]` requests in flight, each sent as the last is answered (no think time), each taking
    `time_s[i]`: the rate is users / time."""
    rng = random.Random(seed)
    return watch((window(rng, rate=n / w, time_s=w, users=n) for n, w in zip(users, time_s, strict=True)), config)


def open_loop(rates: list[float], time_s: list[float], seed: int) -> list[tuple[int, Event]]:
    rng = random.Random(seed)

    def arrivals() -> Iterator[dict[str, float]]:
        for r, w in zip(rates, time_s, strict=True):
            x = window(rng, rate=r, time_s=w)
            x["rate_per_s"] = max(1, rng.gauss(r * WINDOW_S, math.sqrt(r * WINDOW_S))) / WINDOW_S  # Poisson arrivals
            x["in_server_mean"] = x["rate_per_s"] * x["e2el_ms_p50"] / 1000
            yield x

    return watch(arrivals())


def first_after(events: list[tuple[int, Event]], at: int) -> tuple[int, Event]:
    return next((i, e) for i, e in events if i >= at and e.kind != "recovery")


def test_a_closed_loop_slowed_is_an_anomaly_not_fewer_users() -> None:
    at = 40
    for seed in range(6):
        slower = [0.2] * at + [0.26] * 30  # +30 %: 2 users' rate 10 -> 7.7 a second
        events = closed_loop([2] * 70, slower, seed)
        assert all(i >= at for i, _ in events), events  # nothing before the change
        i, e = first_after(events, at)
        assert e.kind == "anomaly" and i - at < 4, (seed, i, e.detail)
        assert "closed loop answered more slowly" in e.detail, e.detail
        assert re.search(r"request rate x0\.[678]\d", e.detail), e.detail  # 1 / 1.3, give or take the noise
        assert not any(e.kind == "drift" for _, e in events), [(i, e.kind, e.detail) for i, e in events]
        # the rate taken as an input whatever paces it (the option off): the same slowdown is a drift
        i, e = first_after(closed_loop([2] * 70, slower, seed, replace(CONFIG, paced_rate=False)), at)
        assert e.kind == "drift" and "rate_per_s" in e.signals, (seed, e.kind, e.detail)


def test_fewer_users_of_a_closed_loop_are_a_drift() -> None:
    at = 40
    for seed in range(6):
        events = closed_loop([4] * at + [2] * 30, [0.3] * at + [0.2] * 30, seed)  # half the users: a shorter queue
        i, e = first_after(events, at)
        assert e.kind == "drift" and e.signals["rate_per_s"]["direction"] == "down" and i - at < 3, (seed, i, e.detail)


def test_a_closed_loop_served_faster_is_no_drift_and_more_users_are_one() -> None:
    """The mirror: a faster server (its warm-up, a neighbour that left) answers a closed loop's users more often,
    the requests in it the same: no drift (the next cycle would tune the traffic it had); more users below the
    server's capacity raise both, a drift."""
    at = 40
    for seed in range(6):
        faster = [0.3] * at + [0.2] * 30  # 2 users' rate 6.7 -> 10 a second
        events = closed_loop([2] * 70, faster, seed)
        assert not any(e.kind == "drift" for _, e in events), [(i, e.kind, e.detail) for i, e in events]
        # the mirror off (the rate an input whatever paces it): the faster server is a drift
        i, e = first_after(closed_loop([2] * 70, faster, seed, replace(CONFIG, paced_rate=False)), at)
        assert e.kind == "drift" and e.signals["rate_per_s"]["direction"] == "up", (seed, e.kind, e.detail)
        i, e = first_after(closed_loop([2] * at + [4] * 30, [0.2] * 70, seed), at)  # twice the users
        assert e.kind == "drift" and e.signals["rate_per_s"]["direction"] == "up" and i - at < 3, (seed, i, e.detail)


def test_fewer_arrivals_of_an_open_loop_are_a_drift_and_more_of_them_too() -> None:
    at = 40
    for seed in range(6):
        for rates, times in (([8.0] * at + [4.0] * 30, [0.25] * at + [0.22] * 30),  # half the arrivals, less queueing
                             ([8.0] * at + [4.0] * 30, [0.25] * 70),  # the same time per request
                             ([4.0] * at + [8.0] * 30, [0.22] * at + [0.25] * 30)):  # twice as many
            i, e = first_after(open_loop(rates, times, seed), at)
            assert e.kind == "drift" and "rate_per_s" in e.signals and i - at < 3, (seed, rates[-1], i, e.detail)


def test_a_slower_open_loop_server_is_an_anomaly_as_before() -> None:
    at = 40
    for seed in range(4):
        i, e = first_after(open_loop([8.0] * 70, [0.2] * at + [0.26] * 30, seed), at)
        assert e.kind == "anomaly" and "closed loop" not in e.detail, (seed, i, e.detail)
