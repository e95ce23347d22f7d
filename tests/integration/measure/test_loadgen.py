"""The load generator against real local servers with known latencies (tests/support/fake_openai_server.py).

Tolerances are loose enough for a loaded 2-core machine; what they check is that the client measures what
the server does (TTFT, ITL, token counts, rates), counts every error by kind, and keeps open-loop arrivals
on the clock when the server is slow.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.support.fake_openai_server import free_port, spawn_fake_server, start_fake_server
from tuner.measure.capacity import measure_capacity
from tuner.measure.loadgen import RunConfig, measure_endpoint, run_sync
from tuner.measure.records import RequestPlan
from tuner.measure.tokenize import ByteTokenizer
from tuner.spec import Arrival, LengthDist, WorkloadSpec


def wl(**kw: object) -> WorkloadSpec:
    base: dict[str, object] = {"arrival": Arrival(kind="closed", concurrency=4), "num_requests": 20,
                               "prompt_tokens": LengthDist(value=64), "output_tokens": LengthDist(value=8)}
    base.update(kw)
    return WorkloadSpec.model_validate(base)


@pytest.fixture(scope="module")
def timed_server():  # type: ignore[no-untyped-def]
    """A server in its own process: TTFT 40 ms, then one token every 10 ms."""
    with spawn_fake_server(ttft_ms=40, itl_ms=10) as srv:
        yield srv


def test_measured_latencies_match_the_server(timed_server) -> None:  # type: ignore[no-untyped-def]
    m = measure_endpoint(timed_server.url, model="fake", seed=0, goodput_ms={"ttft": 200.0}, tokenizer="byte",
                         workload=wl(num_requests=40, output_tokens=LengthDist(value=16), warmup_requests=4),
                         metrics_url=timed_server.url + "/metrics")
    s = m.summary
    assert s["completed"] == 40 and s["failed"] == 0
    assert len(m.records) == 44 and sum(r.warmup for r in m.records) == 4
    assert 40.0 <= s["median_ttft_ms"] <= 55.0
    assert 9.0 <= s["median_itl_ms"] <= 14.0
    assert 9.5 <= s["mean_tpot_ms"] <= 13.0
    e2e_ms = 40.0 + 15 * 10.0
    assert e2e_ms <= s["median_e2el_ms"] <= e2e_ms + 30.0
    assert s["total_output_tokens"] == 40 * 16 and s["total_input_tokens"] == 40 * 64
    assert s["prompt_tokens_exact"] == 1.0
    # 4 in flight, ~190 ms each: ~21 req/s
    assert 4 / (e2e_ms + 30.0) * 1000 <= s["request_throughput"] <= 4 / e2e_ms * 1000 * 1.05
    assert s["request_goodput"] == pytest.approx(s["request_throughput"])
    assert s["max_concurrent_requests"] == 4
    rec = next(r for r in m.records if not r.warmup)
    assert len(rec.token_times_s) == 16 and rec.status == 200
    # the server's own view, scraped from /metrics
    assert m.telemetry["server_generation_tokens"] == 44 * 16
    assert m.telemetry["server_ttft_ms_mean"] == pytest.approx(40.0, abs=8.0)


def test_chat_and_non_streaming(timed_server) -> None:  # type: ignore[no-untyped-def]
    m = measure_endpoint(timed_server.url, model="fake", seed=0, goodput_ms={}, tokenizer="byte",
                         workload=wl(endpoint="chat", num_requests=8))
    assert m.summary["completed"] == 8 and m.summary["total_output_tokens"] == 64
    assert m.summary["median_ttft_ms"] >= 40.0
    m = measure_endpoint(timed_server.url, model="fake", seed=0, goodput_ms={}, tokenizer="byte",
                         workload=wl(stream=False, num_requests=8))
    s = m.summary
    assert s["completed"] == 8 and s["total_output_tokens"] == 64
    assert s["median_e2el_ms"] >= 40.0 + 7 * 10.0  # answered at once after the whole generation
    # approximate tokenizer, but the server reports usage: counts are exact
    m = measure_endpoint(timed_server.url, model="fake", seed=0, goodput_ms={}, workload=wl(num_requests=4))
    assert m.summary["prompt_tokens_exact"] == 1.0
    # ... and they are not what was asked (this server counts bytes): said, not hidden
    assert len(m.notes) == 1 and "asked for 64 prompt tokens" in m.notes[0] and "--tokenizer" in m.notes[0]


def errors_of(url: str, n: int = 12, **kw: object) -> dict[str, float]:
    m = measure_endpoint(url, model="fake", seed=0, goodput_ms={}, tokenizer="byte", workload=wl(num_requests=n,
                         **kw))
    s = m.summary
    assert s["completed"] + s["failed"] == n  # nothing dropped
    assert len([r for r in m.records if not r.warmup]) == n
    return {k[len("errors_"):]: v for k, v in s.items() if k.startswith("errors_") and v > 0}


def test_every_error_kind_is_counted() -> None:
    port = free_port()  # nothing listens there
    assert errors_of(f"http://127.0.0.1:{port}", n=5) == {"connect": 5}
    with start_fake_server(ttft_ms=1, itl_ms=1, error_status=422, error_every=3) as srv:
        assert errors_of(srv.url) == {"http_4xx": 4}
    with start_fake_server(ttft_ms=1, itl_ms=1, error_status=500, error_every=4) as srv:
        assert errors_of(srv.url) == {"http_5xx": 3}
    with start_fake_server(ttft_ms=1, itl_ms=1, error_status=503, error_every=1) as srv:
        assert errors_of(srv.url) == {"overload_503": 12}
    with start_fake_server(ttft_ms=1, itl_ms=1, break_every=2) as srv:
        assert errors_of(srv.url) == {"stream_broken": 6}
    with start_fake_server(ttft_ms=50, itl_ms=10, max_concurrency=1) as srv:
        e = errors_of(srv.url, n=8)
        assert set(e) == {"overload_503"} and e["overload_503"] >= 1
    with start_fake_server(ttft_ms=2000, itl_ms=1) as srv:
        assert errors_of(srv.url, n=4, timeout_s=0.3) == {"timeout": 4}


def test_wrong_model_is_a_4xx(timed_server) -> None:  # type: ignore[no-untyped-def]
    m = measure_endpoint(timed_server.url, model="nope", seed=0, goodput_ms={}, workload=wl(num_requests=3))
    assert m.summary["errors_http_4xx"] == 3 and "not found" in m.records[0].error_detail


def test_open_loop_keeps_the_clock_when_the_server_is_slow() -> None:
    # capacity: 2 in flight x 1 / 50 ms = 40 req/s; offered 100 req/s
    with spawn_fake_server(ttft_ms=50, itl_ms=0, max_concurrency=2, queue=True) as srv:
        w = wl(arrival=Arrival(kind="constant", rate_per_s=100.0), num_requests=60,
               output_tokens=LengthDist(value=1))
        m = measure_endpoint(srv.url, model="fake", seed=0, goodput_ms={}, tokenizer="byte", workload=w)
    s = m.summary
    assert s["completed"] == 60
    assert s["offered_rate_per_s"] == pytest.approx(100.0, rel=0.1)  # sends stay on schedule
    # the client did not wait for answers before sending (a closed loop would hold at most the server's 2): on a
    # busy host it sends late, so its send lag (client_queue_ms) is a measurement, not asserted here
    assert s["max_concurrent_requests"] > 10
    assert s["request_throughput"] < 50.0  # the server's rate
    assert s["p99_ttft_ms"] > 500.0  # ... and its slowness shows as latency


def test_poisson_arrivals_have_the_rate_and_dispersion() -> None:
    # The statistics are the schedule's (what the generator draws), not the send times': on a busy host the client
    # sends late and in bunches, and how well it keeps the clock is a measurement (experiments/loadgen-capacity),
    # not a test. The tolerances are the statistics' own, at a 1-in-10,000 level for a seeded draw.
    from scipy import stats

    n, rate = 1000, 250.0
    with spawn_fake_server(ttft_ms=2, itl_ms=1) as srv:
        w = wl(arrival=Arrival(kind="poisson", rate_per_s=rate), num_requests=n, output_tokens=LengthDist(value=2))
        m = measure_endpoint(srv.url, model="fake", seed=3, goodput_ms={}, tokenizer="byte", workload=w)
    assert m.summary["completed"] == n
    # never sent before its time (up to the event loop's timer slack, about a millisecond)
    assert all(r.sent_s >= r.scheduled_s - 0.01 for r in m.records), "a request was sent before its time"
    sched = np.sort([r.scheduled_s for r in m.records])
    # n-1 exponential gaps: their sum is Gamma(n-1, 1/rate)
    lo, hi = stats.gamma.ppf([5e-5, 1 - 5e-5], n - 1, scale=1 / rate)
    assert lo <= sched[-1] - sched[0] <= hi
    # counts in equal bins are Poisson: (k-1) var/mean is chi-square with k-1 degrees of freedom
    counts = np.bincount(((sched - sched[0]) // 0.2).astype(int))[:-1]
    k = len(counts)
    statistic = (k - 1) * counts.var(ddof=1) / counts.mean()
    assert stats.chi2.ppf(5e-5, k - 1) <= statistic <= stats.chi2.ppf(1 - 5e-5, k - 1)


def test_duration_warmup_and_cooldown(timed_server) -> None:  # type: ignore[no-untyped-def]
    w = wl(arrival=Arrival(kind="constant", rate_per_s=40.0), num_requests=None, duration_s=1.0,
           warmup_s=0.25, cooldown_s=300.0, output_tokens=LengthDist(value=4))
    seen: list[tuple[int, int]] = []
    m = measure_endpoint(timed_server.url, model="fake", seed=0, goodput_ms={}, tokenizer="byte", workload=w,
                         progress=lambda d, t: seen.append((d, t)))
    meas = [r for r in m.records if not r.warmup]
    assert 38 <= len(meas) <= 42 and m.summary["completed"] == len(meas)
    assert min(r.scheduled_s for r in meas) >= 0.25 and max(r.scheduled_s for r in meas) < 1.25
    assert any(r.warmup and r.scheduled_s < 0.25 for r in m.records)
    # the load was kept up after the window until the measured requests finished (then those were cancelled)
    assert m.summary["cooldown_requests"] >= 1
    assert max(r.done_s for r in m.records) < 60.0  # ... not for the whole 300 s cool-down allowance
    assert seen and seen[-1][1] == 1


def test_trace_replay(tmp_path: Path, timed_server) -> None:  # type: ignore[no-untyped-def]
    lines: list[dict[str, object]] = [
        {"timestamp": 10.0 + 0.05 * i, "prompt_tokens": 20 + i, "output_tokens": 2} for i in range(10)]
    lines.append({"timestamp": 11.0, "prompt": "hello", "output_tokens": 3})
    (tmp_path / "trace.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    w = wl(arrival=Arrival(kind="trace", trace="trace.jsonl"), num_requests=100)
    m = measure_endpoint(timed_server.url, model="fake", seed=0, goodput_ms={}, tokenizer="byte", workload=w,
                         base_dir=tmp_path)
    assert m.summary["completed"] == 11
    assert [r.prompt_tokens for r in m.records] == [20 + i for i in range(10)] + [5]
    sent = [r.sent_s for r in m.records]
    assert sent[-1] - sent[0] == pytest.approx(1.0, abs=0.05)


def test_safe_from_threads_and_running_loops(timed_server) -> None:  # type: ignore[no-untyped-def]
    out: list[float] = []

    def work() -> None:
        m = measure_endpoint(timed_server.url, model="fake", seed=1, goodput_ms={}, workload=wl(num_requests=6))
        out.append(m.summary["completed"])

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == [6.0, 6.0, 6.0]

    async def inside_a_loop() -> float:
        cfg = RunConfig(base_url=timed_server.url, model="fake", num_requests=3, concurrency=1)
        plans = [RequestPlan(index=i, arrival_s=0.0, prompt_tokens=8, output_tokens=2) for i in range(3)]
        return float(len(run_sync(cfg, plans, tok=ByteTokenizer()).records))

    assert asyncio.run(inside_a_loop()) == 3.0


def test_capacity_search_finds_a_known_capacity() -> None:
    # 4 slots x 1 request / 50 ms = 80 req/s; above it the queue (and TTFT) grows without bound. The service time
    # is the server's sleep, far above what a request costs the CPUs (at 200 req/s a busy host's client and
    # server could not keep up, and the search found the machine's capacity instead of the server's)
    with spawn_fake_server(ttft_ms=50, itl_ms=0, max_concurrency=4, queue=True) as srv:
        w = wl(arrival=Arrival(kind="constant", rate_per_s=1.0), output_tokens=LengthDist(value=1))
        res = measure_capacity(srv.url, model="fake", workload=w, slos={"ttft_ms.p99": 150.0}, seed=0,
                               start_rate_per_s=24.0, run_s=2.0, warmup_s=0.2, rel_tol=0.1, tokenizer="byte")
    assert res.converged
    assert 48.0 <= res.rate_per_s <= 84.0
    assert res.upper_rate_per_s is not None and res.upper_rate_per_s <= 260.0
    assert any(not s.ok for s in res.steps)


def sse_server(body: bytes):  # type: ignore[no-untyped-def]
    """A plain HTTP server that answers every POST with `body` as an event stream."""
    import http.server

    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_stream_formats_other_servers_send(endpoint: str) -> None:
    """Chunks with empty text are token chunks (as vllm bench serve counts them), a role-only chunk is not, nor an
    empty last chunk with a finish_reason that usage does not count; spaced JSON, keep-alive comments and
    usage are understood."""
    if endpoint == "chat":
        events = ['{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}',
                  '{"choices": [{"index": 0, "delta": {"content": "He"}}]}',
                  '{"choices":[{"index":0,"delta":{"content":null},"finish_reason":null}]}',
                  '{"choices": [{"index": 0, "delta": {"content": "llo \\"text\\": \\"\\""}}]}',
                  '{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}',
                  '{"choices":[{"index":0,"delta":{"reasoning_content":"hmm","content":null}}]}']
    else:
        events = ['{"choices": [{"index": 0, "text": "He", "finish_reason": null}]}',
                  '{"choices":[{"index":0,"text":""}]}',
                  '{"choices":[{"index":0,"text":"llo \\"content\\":\\"\\"","finish_reason":"length"}]}']
    events.append('{"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}}')
    body = ": keep-alive\n\n" + "".join(f"data: {e}\n\n" for e in events) + "data: [DONE]\n\n"
    srv = sse_server(body.encode())
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        m = measure_endpoint(url, model="m", seed=0, goodput_ms={}, workload=wl(num_requests=3, endpoint=endpoint))
    finally:
        srv.shutdown()
    assert m.summary["completed"] == 3
    for r in m.records:
        assert len(r.token_times_s) == (4 if endpoint == "chat" else 3)  # reasoning chunks count, as vllm's
        assert r.output_tokens == 2 and r.prompt_tokens == 7  # usage wins
    srv = sse_server(b'data: {"choices":[{"index":0,"text":"a"}]}\n\ndata: {"error": {"message": "boom"}}\n\n'
                     b"data: [DONE]\n\n")
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        m = measure_endpoint(url, model="m", seed=0, goodput_ms={}, workload=wl(num_requests=2))
    finally:
        srv.shutdown()
    assert m.summary["errors_stream_broken"] == 2 and "boom" in m.records[0].error_detail


def test_long_prompts_and_approximate_counts(timed_server) -> None:  # type: ignore[no-untyped-def]
    w = wl(num_requests=4, prompt_tokens=LengthDist(dist="uniform", low=256, high=16384), output_tokens=LengthDist(
        value=2))
    m = measure_endpoint(timed_server.url, model="fake", seed=5, goodput_ms={}, tokenizer="byte", workload=w)
    from tuner.measure.workload import build_plans

    planned = [p.prompt_tokens for p in build_plans(w, seed=5)]
    assert [r.prompt_tokens for r in m.records] == planned  # the server's byte count = the planned length
    assert max(planned) > 1024
    # a server that reports no usage, no tokenizer: counts are estimates, and the measurement says so
    srv = sse_server(b'data: {"choices":[{"index":0,"text":"a"}]}\n\ndata: [DONE]\n\n')
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        m = measure_endpoint(url, model="m", seed=0, goodput_ms={}, workload=wl(num_requests=2))
    finally:
        srv.shutdown()
    assert m.summary["completed"] == 2 and m.summary["prompt_tokens_exact"] == 0.0
    assert any("approximate" in n for n in m.notes)
    assert all(r.output_tokens == 1 for r in m.records)  # counted from the stream


def test_backlog_limit_stops_a_saturated_run() -> None:
    with start_fake_server(ttft_ms=200, itl_ms=0, max_concurrency=1, queue=True) as srv:
        w = wl(arrival=Arrival(kind="constant", rate_per_s=200.0), num_requests=400,
               output_tokens=LengthDist(value=1), timeout_s=30.0)
        m = measure_endpoint(srv.url, model="fake", seed=0, goodput_ms={}, tokenizer="byte", workload=w,
                             max_in_flight=5)
    s = m.summary
    assert s["saturated"] == 1.0 and any("saturated" in n for n in m.notes)
    assert s["completed"] + s["failed"] < 400 and s["max_concurrent_requests"] <= 5


@pytest.mark.parametrize("arrival", [Arrival(kind="closed", concurrency=4), Arrival(kind="poisson", rate_per_s=50)])
def test_stop_event_ends_a_run_early(arrival: Arrival) -> None:
    stop = threading.Event()
    with start_fake_server(ttft_ms=30_000, itl_ms=0) as srv:  # no answer comes before the stop, however busy
        timer = threading.Timer(0.3, stop.set)
        timer.start()
        t0 = time.monotonic()
        m = measure_endpoint(srv.url, model="fake", seed=0, goodput_ms={}, tokenizer="byte", stop_event=stop,
                             workload=wl(arrival=arrival, num_requests=100, output_tokens=LengthDist(value=1)))
        took_s = time.monotonic() - t0
        timer.cancel()
    assert took_s < 30.0  # well before the first answer (30 s)
    assert m.summary["interrupted"] == 1.0 and any("interrupted" in n for n in m.notes)
    assert m.summary["completed"] == 0  # every request takes 30 s; none finished before the stop
    m = measure_endpoint("http://127.0.0.1:9", model="fake", seed=0, goodput_ms={},
                         workload=wl(num_requests=2), stop_event=threading.Event())
    assert m.summary["interrupted"] == 0.0 and m.summary["errors_connect"] == 2
