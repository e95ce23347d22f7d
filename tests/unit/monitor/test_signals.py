"""Window signals from two scrapes of vLLM-named series (written by prometheus_client, parsed by the scraper)."""

from __future__ import annotations

import logging

import pytest

from tests.support.vllm_series import VllmSeries as Server
from tuner.measure.scrape import parse
from tuner.monitor.signals import MissingSeries, bucket_keys, window_signals


def test_window_signals_from_two_scrapes() -> None:
    s = Server()
    s.finish(10, 100, 20)
    a = parse(s.text())
    s.finish(30, 200, 10)
    s.finish(10, 200, 10, reason="abort")
    s.running.set(4)
    s.waiting.set(2)
    s.kv.set(0.5)
    b = parse(s.text())
    sig = window_signals(a, b, 10.0)
    assert sig is not None
    assert sig["rate_per_s"] == pytest.approx((40 + 6) / 10)  # 40 finished, 6 more inside the server
    assert sig["prompt_tokens_mean"] == pytest.approx(200)
    assert sig["output_tokens_mean"] == pytest.approx(10)
    assert sig["token_throughput_per_s"] == pytest.approx(40)
    assert sig["error_frac"] == pytest.approx(10 / 40)
    assert sig["itl_ms_mean"] == pytest.approx(8.0)
    assert 5.0 < sig["itl_ms_p90"] <= 10.0 and 10.0 < sig["ttft_ms_p50"] <= 50.0
    lo, hi = (sig[k] for k in bucket_keys("ttft_ms_p50"))  # the bucket it was interpolated in
    assert lo < sig["ttft_ms_p50"] <= hi and 10.0 <= lo and hi <= 50.0
    assert all(k in sig for n in ("ttft_ms_p90", "itl_ms_p90") for k in bucket_keys(n))
    assert (sig["running"], sig["waiting"], sig["kv_cache_usage_frac"]) == (4, 2, 0.5)
    assert sig["preemptions_per_s"] == 0


def test_the_requests_in_the_server_by_littles_law() -> None:
    s = Server(e2e=True)
    s.finish(10, 100, 20)
    a = parse(s.text())
    s.finish(40, 100, 21, ttft_s=0.1, itl_s=0.02)  # 0.5 s each, 40 of them in 10 s: 2 in the server on average
    sig = window_signals(a, parse(s.text()), 10.0)
    assert sig is not None and sig["in_server_mean"] == pytest.approx(2.0)
    assert "in_server_mean" not in (window_signals(a, a, 10.0) or {"in_server_mean": 1})  # nothing finished
    assert "in_server_mean" not in (window_signals(*(parse(Server().text()),) * 2, 10.0) or {})  # no histogram


def test_the_lengths_are_of_the_requests_finished_in_the_window() -> None:
    # vLLM counts a prompt's tokens at its prefill: 10 long prompts started in the window and not finished move its
    # counter, not the mean of the 20 requests that finished (their per-request histogram)
    for histograms, prompt_mean, output_mean in ((True, 100, 20), (False, (20 * 100 + 10 * 1000) / 20, 24)):
        s = Server(histograms=histograms)
        s.finish(5, 100, 20)
        a = parse(s.text())
        s.finish(20, 100, 20)
        s.start(10, 1000, 8)
        sig = window_signals(a, parse(s.text()), 10.0)
        assert sig is not None
        # without the histograms (a server that has none) the counters are all there is: the mixed mean
        assert sig["prompt_tokens_mean"] == pytest.approx(prompt_mean), histograms
        assert sig["output_tokens_mean"] == pytest.approx(output_mean), histograms
        assert sig["token_throughput_per_s"] == pytest.approx((20 * 20 + 10 * 8) / 10)  # every token made
    s = Server()
    a = parse(s.text())
    s.start(3, 100, 2)  # nothing finished: no length is known
    sig = window_signals(a, parse(s.text()), 10.0)
    assert sig is not None and "prompt_tokens_mean" not in sig and "output_tokens_mean" not in sig


def test_a_counter_reset_skips_the_window() -> None:
    s = Server()
    s.finish(10, 100, 20)
    before = parse(s.text())
    after = parse(Server().text())
    assert window_signals(before, after, 10.0) is None
    with pytest.raises(ValueError):
        window_signals(before, before, 0.0)


def test_missing_series_are_named_once_and_left_out(caplog: pytest.LogCaptureFixture) -> None:
    s = Server(histograms=False)
    missing = MissingSeries()
    a = parse(s.text())
    s.finish(5, 100, 20)
    with caplog.at_level(logging.WARNING, logger="tuner.monitor.signals"):
        first = window_signals(a, parse(s.text()), 10.0, missing)
        window_signals(a, parse(s.text()), 10.0, missing)
    assert first is not None and "ttft_ms_p50" not in first and "rate_per_s" in first
    lines = [r.getMessage() for r in caplog.records]
    assert sum("ttft_ms" in m for m in lines) == 1  # named once, not every window
    assert any("ttft_ms" in m for m in missing.named)
