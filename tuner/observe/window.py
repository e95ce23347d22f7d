"""A live server's /metrics over a window: successive scrapes (tuner.measure.scrape's Snapshots) differenced.

Series (vLLM's names; the reference engine exports the same): the histograms vllm:request_prompt_tokens and
vllm:request_generation_tokens, the counters vllm:request_success_total, vllm:prefix_cache_queries_total and
vllm:prefix_cache_hits_total, the gauges vllm:num_requests_running and vllm:num_requests_waiting; label sets
(finished reasons, engines) are summed by the parser. Increases are taken scrape to scrape, as Prometheus'
increase() does: a value that falls is a restarted server, whose counters began again at 0, so the increase of
that interval is the new value (never negative). A series that first appears during the window began at 0.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from tuner.base.redact import redact_text, redact_url
from tuner.errors import ObservationError
from tuner.measure.scrape import Hist, Snapshot, fetch
from tuner.observe.fit import from_counts
from tuner.observe.model import LengthHist, ObservedWorkload, WindowCounts

COUNTERS = {"request_success": "vllm:request_success_total",
            "prefix_cache_queries": "vllm:prefix_cache_queries_total",
            "prefix_cache_hits": "vllm:prefix_cache_hits_total"}
HISTS = {"request_prompt_tokens": "vllm:request_prompt_tokens",
         "request_generation_tokens": "vllm:request_generation_tokens"}
log = logging.getLogger(__name__)

GAUGES = {"num_requests_running": "vllm:num_requests_running", "num_requests_waiting": "vllm:num_requests_waiting"}


def _missing(series: str, source: str) -> ObservationError:
    return ObservationError(
        f"{source} has no series {series} in any scrape of the window: check that the URL is the server's "
        "/metrics and that it exports vLLM's names (vLLM >= 0.7 or `tuner serve-engine`; a server that has "
        "not finished a request yet exports no labelled counters: send traffic first)")


class MetricsWindow:
    """Scrapes of one /metrics endpoint, oldest first; `max_age_s` keeps a rolling window (the newest scrape
    and those at most that much older, plus the last one before them as the window's start)."""

    def __init__(self, source: str = "metrics", *, max_age_s: float | None = None) -> None:
        self.source = source
        self.max_age_s = max_age_s
        self.scrapes: list[tuple[float, Snapshot]] = []

    def add(self, snap: Snapshot, t_s: float) -> bool:
        """One scrape taken at unix time `t_s`; one not after the last (a clock set back) is left out: False."""
        if self.scrapes and t_s <= self.scrapes[-1][0]:
            log.debug("%s: scrape at %.3f is not after the last one (%.3f): left out", self.source, t_s,
                      self.scrapes[-1][0])
            return False
        self.scrapes.append((t_s, snap))
        if self.max_age_s is not None:
            keep = [i for i, (t, _) in enumerate(self.scrapes) if t >= t_s - self.max_age_s]
            first = max(0, keep[0] - 1) if keep else len(self.scrapes) - 1
            del self.scrapes[:first]
        return True

    @property
    def start_s(self) -> float:
        return self.scrapes[0][0] if self.scrapes else 0.0

    @property
    def end_s(self) -> float:
        return self.scrapes[-1][0] if self.scrapes else 0.0

    def _values(self, key: str) -> list[float | None]:
        return [s.counters.get(key) for _, s in self.scrapes]

    def counter_steps(self, key: str) -> list[float]:
        """The increase of counter `key` over each scrape interval (reset-aware); ObservationError when no
        scrape has it."""
        vals = self._values(key)
        if all(v is None for v in vals):
            raise _missing(COUNTERS.get(key, key), self.source)
        prev = vals[0] if vals[0] is not None else 0.0
        steps = []
        for v in vals[1:]:
            if v is None:  # a scrape without it: the interval counts with the next one
                steps.append(0.0)
                continue
            steps.append(v - prev if v >= prev else v)
            prev = v
        return steps

    def counter_increase(self, key: str) -> float:
        return sum(self.counter_steps(key))

    def hist_increase(self, key: str) -> LengthHist:
        """Bucket, sum and count increases of histogram `key` over the window (reset-aware)."""
        hs = [s.hists.get(key) for _, s in self.scrapes]
        if all(h is None for h in hs):
            raise _missing(HISTS.get(key, key) + "_bucket", self.source)
        prev = hs[0] or Hist()
        acc = Hist()
        for h in hs[1:]:
            if h is None:
                continue
            restarted = h.count < prev.count
            base = Hist() if restarted else prev
            for le, c in h.buckets.items():
                acc.buckets[le] = acc.buckets.get(le, 0.0) + max(0.0, c - base.buckets.get(le, 0.0))
            acc.sum += max(0.0, h.sum - base.sum)
            acc.count += h.count - base.count
            prev = h
        bounds = sorted(acc.buckets)
        if bounds and bounds[-1] != float("inf"):
            raise ObservationError(f"{HISTS.get(key, key)}_bucket in {self.source} has no le=\"+Inf\" bucket: "
                                   "not a Prometheus histogram")
        return LengthHist(bounds=bounds, cum=[acc.buckets[b] for b in bounds], sum=acc.sum, count=acc.count)

    def gauge_samples(self, key: str) -> list[float]:
        vals = [s.gauges[key] for _, s in self.scrapes if key in s.gauges]
        if not vals:
            raise _missing(GAUGES.get(key, key), self.source)
        return vals

    def counts(self) -> WindowCounts:
        """What the window adds up to; ObservationError naming the series that is missing."""
        if len(self.scrapes) < 2:
            raise ObservationError(f"{self.source}: a window needs at least two scrapes, got {len(self.scrapes)}")
        steps = self.counter_steps("request_success")
        times = [t for t, _ in self.scrapes]
        intervals = [(b - a, c) for a, b, c in zip(times[:-1], times[1:], steps, strict=True)]
        has_prefix = any("prefix_cache_queries" in s.counters for _, s in self.scrapes)
        return WindowCounts(
            start_s=self.start_s, end_s=self.end_s, requests=sum(steps),
            prompt=self.hist_increase("request_prompt_tokens"),
            output=self.hist_increase("request_generation_tokens"),
            running=self.gauge_samples("num_requests_running"),
            waiting=self.gauge_samples("num_requests_waiting"),
            interval_counts=intervals,
            prefix_queries=self.counter_increase("prefix_cache_queries") if has_prefix else None,
            prefix_hits=self.counter_increase("prefix_cache_hits") if has_prefix else None)

    def observe(self, *, arrival: str = "auto", num_requests: int | None = None) -> ObservedWorkload:
        return from_counts(self.counts(), self.source, arrival=arrival, num_requests=num_requests)


def observe_metrics(url: str, window_s: float, *, interval_s: float = 1.0, arrival: str = "auto",
                    num_requests: int | None = None, timeout_s: float = 5.0,
                    stop: threading.Event | None = None,
                    on_scrape: Callable[[int, float], None] | None = None) -> ObservedWorkload:
    """Scrape `url` every `interval_s` for `window_s` seconds and fit the window (ObservationError when the
    endpoint cannot be read or lacks a series). `stop` ends the window early; `on_scrape(n, elapsed_s)`."""
    if not window_s > 0 or not interval_s > 0:
        raise ObservationError(f"window_s ({window_s}) and interval_s ({interval_s}) must be > 0")
    where = redact_url(url)
    win = MetricsWindow(f"metrics {where}")
    stop = stop or threading.Event()
    t0 = time.monotonic()
    n = 0
    while True:
        asked = time.time()
        try:
            snap = fetch(url, timeout_s)
        except (OSError, ValueError) as exc:
            raise ObservationError(f"cannot read {where}: {redact_text(str(exc))} (is the server up and is "
                                   "this its /metrics URL?)") from None
        win.add(snap, (asked + time.time()) / 2)  # a slow answer's counts are of its middle, not its end
        n += 1
        elapsed = time.monotonic() - t0
        if on_scrape is not None:
            on_scrape(n, elapsed)
        if elapsed >= window_s or stop.is_set():
            break
        next_at = n * interval_s
        stop.wait(max(0.0, min(next_at, window_s) - elapsed))
    return win.observe(arrival=arrival, num_requests=num_requests)
