"""The DCGM and Prometheus paths against a real Prometheus (2.42): a small exporter (prometheus_client) serves
DCGM exporter series for two GPUs and vLLM's series; Prometheus scrapes it; the monitor reads the GPU signals
and the server's Snapshot back through Prometheus' HTTP API."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from tests.support.prometheus import running_prometheus
from tuner.measure.scrape import parse
from tuner.monitor.telemetry import SW_POWER_CAP, DcgmTelemetry, prometheus_snapshot

pytestmark = pytest.mark.process


def serve(registry: CollectorRegistry) -> ThreadingHTTPServer:
    """/metrics in the text format 0.0.4, as vLLM and the engine serve it (prometheus_client's own server
    answers Prometheus in OpenMetrics, which writes vLLM's colons as underscores)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None: ...

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def exporter() -> tuple[CollectorRegistry, int, ThreadingHTTPServer]:
    r = CollectorRegistry()
    lab = ["gpu", "UUID", "modelName", "Hostname"]
    values = {"DCGM_FI_DEV_GPU_UTIL": (90, 70), "DCGM_FI_DEV_POWER_USAGE": (600.5, 300.0),
              "DCGM_FI_DEV_SM_CLOCK": (1980, 1200), "DCGM_FI_PROF_DRAM_ACTIVE": (0.9, 0.7),
              "DCGM_FI_DEV_FB_USED": (70000, 10000), "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": (0, SW_POWER_CAP)}
    for name, (a, b) in values.items():
        g = Gauge(name, name, lab, registry=r)
        g.labels("0", "GPU-a", "NVIDIA H200", "node-1").set(a)
        g.labels("1", "GPU-b", "NVIDIA H200", "node-1").set(b)
    ok = Counter("vllm:request_success", "", ["model_name", "finished_reason"], registry=r)
    ok.labels("m", "length").inc(40)
    ok.labels("m", "abort").inc(2)
    Counter("vllm:prompt_tokens", "", ["model_name"], registry=r).labels("m").inc(4200)
    Gauge("vllm:num_requests_running", "", ["model_name"], registry=r).labels("m").set(3)
    server = serve(r)
    return r, server.server_port, server


def test_dcgm_series_and_vllm_series_through_a_real_prometheus(tmp_path: Path) -> None:
    reg, port, server = exporter()
    try:
        with running_prometheus(tmp_path / "prom", [f"127.0.0.1:{port}"], scrape_interval_s=1.0) as prom:
            prom.wait_scraped(series="DCGM_FI_DEV_GPU_UTIL")
            gpu = DcgmTelemetry(prom.url).read()
            assert gpu["gpu_util_pct"] == pytest.approx(80.0)
            assert gpu["gpu_power_w"] == pytest.approx(900.5)
            assert gpu["gpu_sm_clock_mhz"] == pytest.approx(1590.0)
            assert gpu["gpu_dram_active_frac"] == pytest.approx(0.8)
            assert gpu["gpu_fb_used_mb"] == pytest.approx(80000.0)
            assert gpu["gpu_throttled"] == pytest.approx(0.5)
            one = DcgmTelemetry(prom.url, selector='gpu="1"').read()
            assert one["gpu_throttled"] == 1.0 and one["gpu_sm_clock_mhz"] == 1200.0

            snap = prometheus_snapshot(prom.url)
            direct = parse(generate_latest(reg).decode())
            assert snap is not None
            assert snap.counters == direct.counters  # the same Snapshot as a scrape of the server
            assert snap.counters["request_failed"] == 2.0 and snap.gauges["num_requests_running"] == 3.0
    finally:
        server.shutdown()


def test_missing_dcgm_series_are_named_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    reg = CollectorRegistry()
    Gauge("DCGM_FI_DEV_GPU_UTIL", "", ["gpu"], registry=reg).labels("0").set(50)
    server = serve(reg)
    try:
        with running_prometheus(tmp_path / "prom", [f"127.0.0.1:{server.server_port}"]) as prom:
            prom.wait_scraped(series="DCGM_FI_DEV_GPU_UTIL")
            tel = DcgmTelemetry(prom.url)
            with caplog.at_level("WARNING"):
                assert tel.read() == {"gpu_util_pct": 50.0}
                tel.read()
            named = [r.getMessage() for r in caplog.records if "DCGM_FI_PROF_DRAM_ACTIVE" in r.getMessage()]
            assert len(named) == 1
            assert prometheus_snapshot(prom.url) is None  # no vLLM series there
    finally:
        server.shutdown()


def test_dcgm_gauges_are_read_as_their_mean_over_the_monitors_window(tmp_path: Path) -> None:
    """The utilisation held at 20 % for a few scrapes, then 80 %: read over a window that holds both, its mean lies
    between them (the throttle reasons, a bit mask, as they are now); over a window shorter than Prometheus' scrape
    interval, the latest value; without a window, the latest value as before."""
    reg = CollectorRegistry()
    util = Gauge("DCGM_FI_DEV_GPU_UTIL", "", ["gpu"], registry=reg)
    reasons = Gauge("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "", ["gpu"], registry=reg)
    util.labels("0").set(20)
    reasons.labels("0").set(SW_POWER_CAP)
    server = serve(reg)
    try:
        with running_prometheus(tmp_path / "prom", [f"127.0.0.1:{server.server_port}"],
                                scrape_interval_s=1.0) as prom:
            prom.wait_scraped(series="DCGM_FI_DEV_GPU_UTIL")
            time.sleep(3.0)
            util.labels("0").set(80)
            reasons.labels("0").set(0)
            prom.wait_scraped(series="DCGM_FI_DEV_GPU_UTIL >= 80")
            time.sleep(3.0)
            over = DcgmTelemetry(prom.url, window_s=60.0).read()
            assert 20.0 < over["gpu_util_pct"] < 80.0
            assert over["gpu_throttled"] == 0.0  # the mask read now, never averaged
            assert DcgmTelemetry(prom.url, window_s=0.001).read()["gpu_util_pct"] == 80.0
            assert DcgmTelemetry(prom.url).read()["gpu_util_pct"] == 80.0
    finally:
        server.shutdown()
