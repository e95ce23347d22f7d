"""A Prometheus server's HTTP API over a window: the same series as /metrics, replicas summed by PromQL.

Instant queries at the window's end (`/api/v1/query`): `sum by (le) (increase(vllm:request_prompt_tokens_bucket
{sel}[W]))` with its `_sum` and `_count` (and the same for vllm:request_generation_tokens), the prefix-cache
counters (Prometheus' increase() handles counter resets and extrapolates to the window's edges: the counts may
be fractional, their ratios are not skewed). Range queries (`/api/v1/query_range`, one point per `step_s`):
`sum(vllm:num_requests_running{sel})`, `sum(vllm:num_requests_waiting{sel})`, and the raw
`vllm:request_success_total{sel}` of every series, differenced step to step as /metrics windows are (a value
that falls is a restart; a series first seen inside the window began at 0) and summed over the series: the
finished requests, exactly, and per step for the burstiness. An empty result is an ObservationError naming the
query's series and selector.
"""

from __future__ import annotations

import re
import time
from typing import Any

import httpx

from tuner.base.redact import redact_text, redact_url
from tuner.errors import ObservationError
from tuner.observe.fit import from_counts
from tuner.observe.model import LengthHist, ObservedWorkload, WindowCounts

_MATCHER = r'\s*[A-Za-z_][A-Za-z0-9_]*\s*(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*'
_SELECTOR = re.compile(rf"^(?:{_MATCHER}(?:,{_MATCHER})*,?)?$")


def check_selector(selector: str) -> str:
    """Label matchers (`job="vllm",model_name=~"m.*"`, braces optional) as the inside of `{...}`."""
    inner = selector.strip()
    if inner.startswith("{") and inner.endswith("}"):
        inner = inner[1:-1]
    if not _SELECTOR.match(inner):
        raise ObservationError(f"selector {selector!r}: expected label matchers such as "
                               'job="vllm",model_name=~"m.*" (label, one of = != =~ !~, a quoted value)')
    return inner.strip().rstrip(",")


class Prometheus:
    """A thin client of the HTTP API: `vector(query)` and `matrix(query, ...)` return (labels, value(s))."""

    def __init__(self, url: str, *, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.where = redact_url(self.url)
        self.client = httpx.Client(timeout=timeout_s)

    def close(self) -> None:
        self.client.close()

    def _get(self, path: str, params: dict[str, Any]) -> Any:
        try:
            r = self.client.get(self.url + path, params=params)
        except httpx.HTTPError as exc:
            raise ObservationError(f"cannot reach Prometheus at {self.where}: {redact_text(str(exc))} (is it "
                                   "running, and is this its base URL, e.g. http://127.0.0.1:9090?)") from None
        try:
            body = r.json()
        except ValueError:
            raise ObservationError(f"Prometheus at {self.where}{path} answered {r.status_code} with no JSON: "
                                   "is this a Prometheus server's base URL?") from None
        if r.status_code != 200 or body.get("status") != "success":
            raise ObservationError(f"Prometheus at {self.where} refused {params.get('query')!r}: "
                                   f"{body.get('errorType', r.status_code)}: {body.get('error', '')}")
        return body["data"]

    def vector(self, query: str, at_s: float) -> list[tuple[dict[str, str], float]]:
        data = self._get("/api/v1/query", {"query": query, "time": f"{at_s:.3f}"})
        return [(d["metric"], float(d["value"][1])) for d in data.get("result", [])]

    def matrix(self, query: str, start_s: float, end_s: float, step_s: float) -> list[dict[float, float]]:
        """One {timestamp: value} per series of the range query."""
        data = self._get("/api/v1/query_range", {"query": query, "start": f"{start_s:.3f}",
                                                 "end": f"{end_s:.3f}", "step": f"{step_s:g}"})
        return [{round(float(t), 3): float(v) for t, v in d["values"]} for d in data.get("result", [])]


def step_increases(series: list[dict[float, float]], start_s: float) -> list[tuple[float, float]]:
    """(seconds, increase) per step of the range-query grid, summed over the series (reset-aware)."""
    t0 = round(start_s, 3)
    grid = sorted({t0} | {t for s in series for t in s})
    inc = dict.fromkeys(grid[1:], 0.0)
    for s in series:
        ts = sorted(s)
        if ts and ts[0] > t0:  # first seen inside the window: it began at 0
            inc[ts[0]] += s[ts[0]]
        for a, b in zip(ts[:-1], ts[1:], strict=True):
            inc[b] += s[b] - s[a] if s[b] >= s[a] else s[b]
    return [(b - a, inc[b]) for a, b in zip(grid[:-1], grid[1:], strict=True)]


def _window(seconds: float) -> str:
    return f"{max(1, round(seconds))}s"


def observe_prometheus(url: str, window_s: float, *, selector: str = "", end_s: float | None = None,
                       step_s: float | None = None, arrival: str = "auto", num_requests: int | None = None,
                       timeout_s: float = 10.0) -> ObservedWorkload:
    """The workload of the `window_s` seconds before `end_s` (default: now) from the Prometheus at `url`.

    `selector`: label matchers picking the servers (all replicas matching are summed); `step_s`: the
    resolution of the gauge samples and burstiness intervals (default: window/60, at least 2 s, so that each
    interval holds two scrapes at a 1 s scrape interval)."""
    if not window_s > 0:
        raise ObservationError(f"window_s ({window_s}) must be > 0")
    sel = check_selector(selector)
    braces = "{" + sel + "}"
    end = time.time() if end_s is None else end_s
    start = end - window_s
    step = step_s or max(2.0, window_s / 60)
    w = _window(window_s)
    prom = Prometheus(url, timeout_s=timeout_s)
    src = f"prometheus {prom.where}" + (f" {braces}" if sel else "")

    def missing(series: str) -> ObservationError:
        return ObservationError(
            f"Prometheus at {prom.where} has no samples of {series}{braces} in the {w} window before "
            f"{end:.0f}: check that the server is a scrape target (its /targets page), that the selector "
            "matches its labels, and that the server exports vLLM's names")

    def scalar(series: str, required: bool = True) -> float | None:
        res = prom.vector(f"sum(increase({series}{braces}[{w}]))", end)
        if not res:
            if required:
                raise missing(series)
            return None
        return res[0][1]

    def hist(name: str) -> LengthHist:
        res = prom.vector(f"sum by (le) (increase({name}_bucket{braces}[{w}]))", end)
        if not res:
            raise missing(name + "_bucket")
        try:
            pairs = sorted((float(lab["le"]), v) for lab, v in res)
        except (KeyError, ValueError):
            raise ObservationError(f"{name}_bucket at {prom.where} has a series without a numeric `le` label: "
                                   "not a Prometheus histogram") from None
        if pairs[-1][0] != float("inf"):
            raise ObservationError(f'{name}_bucket at {prom.where} has no le="+Inf" bucket: not a histogram')
        total = scalar(name + "_count")
        s = scalar(name + "_sum")
        assert total is not None and s is not None
        return LengthHist(bounds=[b for b, _ in pairs], cum=[c for _, c in pairs], sum=s, count=total)

    def gauge(series: str) -> list[float]:
        res = prom.matrix(f"sum({series}{braces})", start, end, step)
        if not res:
            raise missing(series)
        return [v for _, v in sorted(res[0].items())]

    try:
        finished = prom.matrix(f"vllm:request_success_total{braces}", start, end, step)
        if not finished:
            raise missing("vllm:request_success_total")
        steps = step_increases(finished, start)
        counts = WindowCounts(
            start_s=start, end_s=end, requests=sum(c for _, c in steps),
            prompt=hist("vllm:request_prompt_tokens"), output=hist("vllm:request_generation_tokens"),
            running=gauge("vllm:num_requests_running"), waiting=gauge("vllm:num_requests_waiting"),
            interval_counts=steps,
            prefix_queries=scalar("vllm:prefix_cache_queries_total", required=False),
            prefix_hits=scalar("vllm:prefix_cache_hits_total", required=False))
    finally:
        prom.close()
    obs = from_counts(counts, src, arrival=arrival, num_requests=num_requests)
    obs.notes.append("Prometheus' increase() extrapolates to the window's edges: counts may be fractional")
    return obs
