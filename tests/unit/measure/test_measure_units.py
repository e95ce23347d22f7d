"""Unit tests of the measurement helpers: metrics definitions, /metrics parsing, capacity search,
tokenizers, datasets and traces, GPU sampler without a GPU."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tuner.errors import ConfigError
from tuner.measure.capacity import find_capacity
from tuner.measure.datasets import load_dataset, load_trace, plans_for
from tuner.measure.gpu import GpuSampler
from tuner.measure.measurement import Measurement
from tuner.measure.metrics import summarise
from tuner.measure.records import RequestRecord
from tuner.measure.scrape import histogram_bucket, histogram_quantile, parse, telemetry
from tuner.measure.tokenize import ApproxTokenizer, ByteTokenizer, load_tokenizer
from tuner.spec import Arrival, LengthDist, WorkloadSpec


# ------------------------------------------------------------------ metrics (vllm bench serve definitions)
def rec(i: int, sent: float, first: float | None, times: tuple[float, ...], done: float, n_out: int,
        error: str | None = None, warmup: bool = False) -> RequestRecord:
    return RequestRecord(index=i, scheduled_s=sent, sent_s=sent, first_token_s=first, done_s=done,
                         prompt_tokens=10, output_tokens=n_out, token_times_s=times, error=error,
                         status=200 if error is None else 500, warmup=warmup)


def test_summary_follows_vllm_definitions() -> None:
    recs = [
        rec(0, 0.0, 0.1, (0.1, 0.2, 0.4), 0.4, 3),          # ttft 100, tpot (400-100)/2 = 150, itl 100, 200
        rec(1, 0.5, 0.55, (0.55,), 0.55, 1),                 # one token: no tpot, counts as tpot 0 for goodput
        rec(2, 0.6, None, (), 0.7, 0, error="http_5xx"),     # failed: counted apart
        rec(3, 0.0, 0.01, (0.01,), 0.02, 1, warmup=True),    # warm-up: left out
    ]
    s = summarise(recs, goodput_ms={"ttft": 60.0, "tpot": 10.0})
    assert s["completed"] == 2 and s["failed"] == 1
    assert s["errors_http_5xx"] == 1 and s["error_rate"] == pytest.approx(1 / 3)
    assert s["duration"] == pytest.approx(0.7)
    assert s["total_input_tokens"] == 20 and s["total_output_tokens"] == 4
    assert s["request_throughput"] == pytest.approx(2 / 0.7)
    assert s["output_throughput"] == pytest.approx(4 / 0.7)
    assert s["mean_ttft_ms"] == pytest.approx(75.0)
    assert s["mean_tpot_ms"] == pytest.approx(150.0)  # only requests with > 1 output token
    assert s["mean_itl_ms"] == pytest.approx(150.0)
    assert s["median_e2el_ms"] == pytest.approx(225.0)
    # good: request 1 only (ttft 50 <= 60, tpot counts 0); request 0 has ttft 100 > 60
    assert s["request_goodput"] == pytest.approx(1 / 0.7)


# ------------------------------------------------------------------ /metrics
METRICS = """\
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.7
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} %(pre)s
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} %(b1)s
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.2",model_name="m"} %(b2)s
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} %(b2)s
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} %(b2)s
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} %(sum)s
"""


def test_scrape_deltas_and_bucket_percentiles() -> None:
    before = parse(METRICS % {"pre": 2, "b1": 10, "b2": 10, "sum": 0.5})
    after = parse(METRICS % {"pre": 7, "b1": 60, "b2": 110, "sum": 15.5})
    assert before.gauges["kv_cache_usage_frac"] == pytest.approx(0.6)  # averaged over engines
    t = telemetry(before, after)
    assert t["server_preemptions"] == 5
    # 100 new observations: 50 in (0, 0.1], 50 in (0.1, 0.2]; p50 = 0.1 s, p99 = 0.198 s
    assert t["server_ttft_ms_p50"] == pytest.approx(100.0)
    assert t["server_ttft_ms_p99"] == pytest.approx(198.0)
    assert t["server_ttft_ms_mean"] == pytest.approx(150.0)
    assert t["server_num_requests_waiting_max"] == 3
    assert telemetry(None, None) == {}


def test_histogram_quantile_edges() -> None:
    assert math.isnan(histogram_quantile(0.5, {}))
    assert histogram_quantile(0.99, {1.0: 0, 2.0: 0, math.inf: 5}) == 2.0  # all in +Inf: highest finite bound


def test_histogram_bucket_is_the_one_the_quantile_is_interpolated_in() -> None:
    cum = {0.08: 4.0, 0.1: 10.0, 0.25: 20.0, math.inf: 20.0}
    assert histogram_bucket(0.5, cum) == (0.08, 0.1) and 0.08 < histogram_quantile(0.5, cum) <= 0.1
    assert histogram_bucket(0.6, cum) == (0.1, 0.25) and histogram_quantile(0.6, cum) == pytest.approx(0.13)
    assert histogram_bucket(0.1, cum) == (0.0, 0.08)  # the first bucket starts at 0
    assert histogram_bucket(0.99, {1.0: 0, 2.0: 0, math.inf: 5}) == (2.0, math.inf)
    assert histogram_bucket(0.5, {}) is None


# ------------------------------------------------------------------ capacity search
def fake_run(capacity: float):
    """A server whose p99 TTFT is 50 ms below `capacity` req/s and grows fast above it."""
    calls: list[float] = []

    def run(rate: float) -> Measurement:
        calls.append(rate)
        ttft = 50.0 if rate <= capacity else 50.0 + 2000.0 * (rate / capacity - 1.0)
        return Measurement(summary={"p99_ttft_ms": ttft, "error_rate": 0.0, "completed": 10 * rate,
                                    "duration": 10.0, "median_e2el_ms": 0.0, "offered_rate_per_s": rate})

    return run, calls


@pytest.mark.parametrize("capacity", [37.0, 250.0, 1000.0])
def test_capacity_search_converges(capacity: float) -> None:
    run, calls = fake_run(capacity)
    res = find_capacity(run, {"ttft_ms.p99": 100.0, "error_rate": 0.01}, start_rate_per_s=10.0,
                        rel_tol=0.05, max_runs=15)
    threshold = capacity * 1.025  # where p99 TTFT crosses 100 ms
    assert res.converged
    assert 0.95 * threshold <= res.rate_per_s <= threshold
    assert res.upper_rate_per_s is not None and threshold < res.upper_rate_per_s <= threshold * 1.06
    assert len(calls) <= 15 and all(s.ok == (s.rate_per_s <= threshold) for s in res.steps)


def test_capacity_search_fails_when_server_cannot_keep_up() -> None:
    def run(rate: float) -> Measurement:  # latency fine, but only 20 req/s get through
        return Measurement(summary={"p99_ttft_ms": 10.0, "completed": min(rate, 20.0) * 10, "duration": 10.0,
                                    "median_e2el_ms": 0.0, "offered_rate_per_s": rate})

    res = find_capacity(run, {"ttft_ms.p99": 100.0}, start_rate_per_s=5.0, rel_tol=0.1)
    assert 18.0 <= res.rate_per_s <= 22.3


# ------------------------------------------------------------------ tokenizers
def test_byte_tokenizer_prompts_are_exact_and_distinct() -> None:
    tok = ByteTokenizer()
    for n in (1, 3, 256, 16384):
        p = tok.synth(n, key=12345)
        assert tok.count(p) == n and p.isascii()
    assert tok.synth(64, 1) != tok.synth(64, 2)
    assert tok.exact and not ApproxTokenizer().exact
    assert load_tokenizer("byte").name == "byte" and load_tokenizer(None).name == "approx"
    with pytest.raises(ConfigError, match="tokenizer"):
        load_tokenizer("/no/such/tokenizer")


def test_hf_tokenizer_from_a_local_dir(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate("the of and to in is was for on that".split())}}
    t = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    t.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=t, unk_token="[UNK]")
    fast.save_pretrained(str(tmp_path))
    tok = load_tokenizer(str(tmp_path))
    assert tok.exact and tok.count("the of and") == 3
    ids = tok.synth_ids(100, key=7)
    assert isinstance(ids, list) and len(ids) == 100 and 0 not in ids  # no special tokens
    for n in (1, 7, 100, 1000):  # text prompts: exactly n tokens under this tokenizer
        assert tok.count(tok.synth(n, key=n)) == n
    assert tok.synth(50, key=1) != tok.synth(50, key=2)
    with pytest.raises(ConfigError, match="token ids need a tokenizer"):
        ApproxTokenizer().synth_ids(5, 1)


# ------------------------------------------------------------------ datasets and traces
def test_sharegpt_and_jsonl_datasets(tmp_path: Path) -> None:
    tok = ByteTokenizer()
    sg = tmp_path / "sg.json"
    sg.write_text(json.dumps([
        {"conversations": [{"from": "human", "value": "hello"}, {"from": "gpt", "value": "hi there"}]},
        {"conversations": [{"from": "human", "value": "only one turn"}]},
    ]))
    s = load_dataset(sg, tok)
    assert [(x.prompt, x.prompt_tokens, x.output_tokens) for x in s] == [("hello", 5, 8)]
    jl = tmp_path / "d.jsonl"
    jl.write_text('{"prompt": "abc", "output_tokens": 7}\n\n{"prompt": [1, 2, 3, 4], "max_tokens": 2}\n')
    s = load_dataset(jl, tok)
    assert [(x.prompt_tokens, x.output_tokens) for x in s] == [(3, 7), (4, 2)]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{oops\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:2"):
        load_dataset(bad, tok)
    spec = WorkloadSpec(dataset="d.jsonl", num_requests=6, arrival=Arrival(kind="closed", concurrency=2))
    plans, notes = plans_for(spec, seed=0, tok=tok, base_dir=tmp_path)
    assert len(plans) == 6 and {p.prompt_tokens for p in plans} <= {3, 4} and not notes
    plans, notes = plans_for(spec, seed=0, tok=ApproxTokenizer(), base_dir=tmp_path)
    assert notes and "approximate" in notes[0]


def test_trace_replay_plans(tmp_path: Path) -> None:
    tr = tmp_path / "t.jsonl"
    tr.write_text("\n".join(json.dumps(d) for d in [
        {"timestamp": 100.5, "prompt_tokens": 30, "output_tokens": 4},
        {"timestamp": 100.0, "prompt": "abcd", "output_tokens": 2},
        {"timestamp_ms": 101500, "prompt_tokens": 8, "output_tokens": 1},
    ]) + "\n")
    rows = load_trace(tr, ByteTokenizer())
    assert [r[0] for r in rows] == [0.0, 0.5, 1.5] and rows[0][2] == 4
    spec = WorkloadSpec(arrival=Arrival(kind="trace", trace="t.jsonl"), num_requests=10)
    plans, _ = plans_for(spec, seed=0, tok=ByteTokenizer(), base_dir=tmp_path)
    assert [(p.arrival_s, p.prompt_tokens, p.output_tokens) for p in plans] == [
        (0.0, 4, 2), (0.5, 30, 4), (1.5, 8, 1)]
    (tmp_path / "bad.jsonl").write_text('{"prompt_tokens": 3, "output_tokens": 1}\n')
    with pytest.raises(ConfigError, match="timestamp"):
        load_trace(tmp_path / "bad.jsonl", ByteTokenizer())


def test_lengths_span_256_to_16k() -> None:
    from tuner.measure.workload import build_plans

    spec = WorkloadSpec(num_requests=500, prompt_tokens=LengthDist(dist="lognormal", mean=2000, sigma=1.0,
                                                                     min=256, max=16384))
    lens = np.array([p.prompt_tokens for p in build_plans(spec, seed=0)])
    assert lens.min() >= 256 and lens.max() <= 16384 and lens.max() > 8000


# ------------------------------------------------------------------ GPU sampler
def test_gpu_sampler_without_gpu_records_nothing() -> None:
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present")
    except pynvml.NVMLError:
        pass
    with GpuSampler([0], interval_s=0.05) as s:
        pass
    assert s.result() == {}
    assert GpuSampler([]).start().result() == {}


def cuda_matrix() -> Any:
    """A 4096^2 bfloat16 matrix on CUDA GPU 0 to multiply; skip without an NVIDIA driver or CUDA."""
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        pytest.skip("no NVIDIA driver")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    return torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)


@pytest.mark.gpu
def test_gpu_sampler_on_a_gpu() -> None:
    import time

    a = cuda_matrix()
    with GpuSampler([0], interval_s=0.1) as s:
        t = time.monotonic()
        while time.monotonic() - t < 2.0:
            a @ a
        a.cpu()  # waits for the queued products
    r = s.result()
    assert r["gpu_samples"] >= 5 and r["gpu_util_pct_max"] > 50
    assert r["gpu_power_w_mean"] > 0 and r.get("gpu_energy_j", 1.0) > 0


@pytest.mark.gpu
def test_gpu_read_on_a_gpu_is_the_window_not_an_instant() -> None:
    """On a real GPU: a second of matmuls then a second idle, read after each: the busy window's utilisation from
    NVML's buffer (several samples), its power from the energy counter, the idle one's utilisation far lower."""
    import time

    a = cuda_matrix()
    s = GpuSampler([0])
    s.read()
    t = time.monotonic()
    while time.monotonic() - t < 1.5:
        a @ a
    a.cpu()
    busy = s.read()
    busy_samples = dict(s.window_samples)
    time.sleep(1.5)
    idle = s.read()
    assert busy_samples.get("util", 0) >= 2 and busy["gpu_util_pct"] > 50 > idle["gpu_util_pct"]
    assert busy_samples.get("energy") == 1 and busy["gpu_power_w"] > idle["gpu_power_w"] > 0


class FakeNvml:
    """An NVML double: one Hopper-like GPU at 50 % util, 300 W (energy counter at 300 J/s), GPM supported,
    power-capped every other read."""

    NVML_CLOCK_SM = 1
    NVML_SUCCESS = 0
    NVML_GPM_METRICS_GET_VERSION = 1
    nvmlClocksEventReasonSwPowerCap = 0x4
    nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x80
    nvmlClocksEventReasonSwThermalSlowdown = 0x20
    nvmlClocksEventReasonHwThermalSlowdown = 0x40
    nvmlClocksEventReasonHwSlowdown = 0x8

    class _M:
        def __init__(self) -> None:
            self.metricId, self.value, self.nvmlReturn = 0, 0.0, 1

    class c_nvmlGpmMetricsGet_t:  # noqa: N801 - the NVML name
        def __init__(self) -> None:
            self.version = self.numMetrics = 0
            self.sample1 = self.sample2 = None
            self.metrics = [FakeNvml._M() for _ in range(8)]

    def __init__(self, count: int = 1) -> None:
        import time as _t

        self._t, self.count, self.reads, self.alloc, self.freed, self.shutdown = _t.monotonic, count, 0, 0, 0, 0

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None:
        self.shutdown += 1
    def nvmlDeviceGetCount(self) -> int:
        return self.count
    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i
    def nvmlDeviceGetUtilizationRates(self, h: int):  # type: ignore[no-untyped-def]
        from types import SimpleNamespace

        self.reads += 1
        return SimpleNamespace(gpu=50, memory=20)
    def nvmlDeviceGetMemoryInfo(self, h: int):  # type: ignore[no-untyped-def]
        from types import SimpleNamespace

        return SimpleNamespace(used=1024 * 2**20)
    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return 300_000
    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
        return 1980
    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return 0x4 if self.reads % 2 else 0
    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        return int(self._t() * 300_000)  # mJ: 300 W
    def nvmlGpmQueryDeviceSupport(self, h: int):  # type: ignore[no-untyped-def]
        from types import SimpleNamespace

        return SimpleNamespace(isSupportedDevice=1)
    def nvmlGpmSampleAlloc(self) -> object:
        self.alloc += 1
        return object()
    def nvmlGpmSampleFree(self, s: object) -> None:
        self.freed += 1
    def nvmlGpmSampleGet(self, h: int, s: object) -> object:
        return s
    def nvmlGpmMetricsGet(self, req):  # type: ignore[no-untyped-def]
        vals = {10: 75.0, 2: 60.0, 3: 40.0, 5: 30.0}
        for i in range(req.numMetrics):
            req.metrics[i].value, req.metrics[i].nvmlReturn = vals[req.metrics[i].metricId], 0
        return req


def test_gpu_sampler_reads_every_counter_through_nvml() -> None:
    import time

    nv = FakeNvml()
    with GpuSampler([0], interval_s=0.02, nvml=nv) as s:
        time.sleep(0.5)
    r = s.result()
    assert r["gpu_samples"] >= 5 and r["gpu_count"] == 1
    assert r["gpu_util_pct_mean"] == 50 and r["gpu_mem_busy_pct_mean"] == 20
    assert r["gpu_memory_used_mb_max"] == 1024 and r["gpu_power_w_mean"] == 300
    assert r["gpu_energy_j"] == pytest.approx(300 * r["gpu_sampled_s"], rel=0.05)
    assert r["gpu_sm_clock_mhz_min"] == 1980
    assert 0.2 < r["gpu_throttle_power_frac"] < 0.8 and r["gpu_throttle_thermal_frac"] == 0
    assert r["gpu_clocks_event_reasons_mask"] == 4
    assert r["gpu_dram_bw_util_pct_mean"] == 75 and r["gpu_sm_util_pct_mean"] == 60
    assert r["gpu_tensor_util_pct_mean"] == 30 and r["gpu_sm_occupancy_pct_mean"] == 40
    assert nv.alloc == nv.freed and nv.shutdown == 1  # GPM samples freed, NVML shut down
    assert GpuSampler([3], nvml=FakeNvml(count=1)).start().result() == {}  # absent index: nothing, no error


class NvmlError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class BufferedNvml(FakeNvml):
    """FakeNvml with NVML's sample buffers (nvmlDeviceGetSamples): a test appends (time stamp in us, value) pairs
    per GPU and sampling type; the utilisation's buffer can be made unsupported."""

    NVML_TOTAL_POWER_SAMPLES, NVML_GPU_UTILIZATION_SAMPLES, NVML_PROCESSOR_CLK_SAMPLES = 0, 1, 5
    NVML_ERROR_NOT_FOUND, NVML_ERROR_NOT_SUPPORTED = 6, 3

    def __init__(self, count: int = 1, *, util_buffer: bool = True, energy: bool = False) -> None:
        super().__init__(count)
        self.energy = energy
        self.buffers: dict[tuple[int, int], list[tuple[int, int]]] = {}
        self.util_buffer = util_buffer
        self.asked: list[tuple[int, int, int]] = []

    def push(self, h: int, kind: int, *samples: tuple[int, int]) -> None:
        self.buffers.setdefault((h, kind), []).extend(samples)

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        if not self.energy:
            raise NvmlError(self.NVML_ERROR_NOT_SUPPORTED)
        return super().nvmlDeviceGetTotalEnergyConsumption(h)

    def nvmlDeviceGetSamples(self, h: int, kind: int, since: int):  # type: ignore[no-untyped-def]
        from types import SimpleNamespace

        self.asked.append((h, kind, since))
        if kind == self.NVML_GPU_UTILIZATION_SAMPLES and not self.util_buffer:
            raise NvmlError(self.NVML_ERROR_NOT_SUPPORTED)
        new = [(t, v) for t, v in self.buffers.get((h, kind), []) if t > since]
        if not new:
            raise NvmlError(self.NVML_ERROR_NOT_FOUND)
        return 1, [SimpleNamespace(timeStamp=t, sampleValue=SimpleNamespace(uiVal=v)) for t, v in new]


def test_gpu_read_is_the_mean_of_nvml_sample_buffers_since_the_previous_read() -> None:
    nv = BufferedNvml(count=2)
    s = GpuSampler([0, 1], nvml=nv)
    for h in (0, 1):
        nv.push(h, 1, (1, 99))
        nv.push(h, 0, (1, 999_000))
        nv.push(h, 5, (1, 900))
    first = s.read()  # primes: the buffer's older samples belong to no window
    assert first["gpu_util_pct"] == 50 and first["gpu_power_w"] == 600 and first["gpu_sm_clock_mhz"] == 1980
    assert s.window_samples == {}
    nv.push(0, 1, (2, 10), (3, 30), (4, 80))  # GPU 0: mean 40 (its instant read says 50)
    nv.push(1, 1, (2, 20), (5, 40))  # GPU 1: mean 30
    nv.push(0, 0, (2, 100_000), (3, 300_000))  # mW: 200 W
    nv.push(1, 0, (3, 400_000))  # 400 W
    nv.push(0, 5, (2, 1700), (3, 1900))
    nv.push(1, 5, (2, 1800))
    r = s.read()
    assert r["gpu_util_pct"] == pytest.approx(35)  # the mean over the GPUs of each one's window mean
    assert r["gpu_power_w"] == pytest.approx(600)  # totalled over the GPUs
    assert r["gpu_sm_clock_mhz"] == pytest.approx(1800)
    assert s.window_samples == {"util": 5, "power_w": 3, "sm_mhz": 3}
    nv.asked.clear()
    nv.push(0, 1, (6, 60))  # only GPU 0 has a new utilisation sample: the instant reads stand for the window
    r = s.read()
    assert r["gpu_util_pct"] == 50 and r["gpu_power_w"] == 600 and s.window_samples == {}
    assert (0, 1, 4) in nv.asked and (1, 1, 5) in nv.asked  # each GPU asked from its own newest sample
    nv.push(0, 1, (8, 20))
    nv.push(1, 1, (7, 0), (9, 10))
    assert s.read()["gpu_util_pct"] == pytest.approx(12.5)  # GPU 0: 20; GPU 1: 5


def test_gpu_read_says_once_when_nvml_buffer_is_shorter_than_the_window(caplog: pytest.LogCaptureFixture) -> None:
    nv = BufferedNvml()
    s = GpuSampler([0], nvml=nv)
    nv.push(0, 1, (1_000_000, 10))
    s.read()
    nv.push(0, 1, (1_200_000, 30), (1_400_000, 50))  # samples 0.2 s apart from the last read on: the whole window
    with caplog.at_level("INFO", logger="tuner.measure.gpu"):
        assert s.read()["gpu_util_pct"] == 40
        assert "buffer" not in caplog.text
        nv.push(0, 1, (9_000_000, 20), (9_200_000, 40))  # 7.6 s unaccounted for: the buffer overflowed
        assert s.read()["gpu_util_pct"] == 30  # the mean of what it kept
        nv.push(0, 1, (19_000_000, 20), (19_200_000, 40))
        s.read()
    assert caplog.text.count("kept only the last 0.2 s of the 7.8 s") == 1


def test_gpu_read_takes_the_power_over_the_window_from_the_energy_counters() -> None:
    import time

    nv = BufferedNvml(count=2, energy=True)  # energy counters rising at 300 W each
    s = GpuSampler([0, 1], nvml=nv)
    nv.push(0, 0, (1, 50_000))
    nv.push(1, 0, (1, 50_000))
    s.read()  # the first read: the instant value (300 W a GPU), the counters' start
    nv.push(0, 0, (2, 50_000))  # the power buffers say 50 W a GPU: the counters win
    nv.push(1, 0, (2, 50_000))
    time.sleep(0.3)
    r = s.read()
    assert r["gpu_power_w"] == pytest.approx(600, rel=0.05) and s.window_samples["energy"] == 2


def test_gpu_read_falls_back_to_one_instant_where_nvml_keeps_no_buffer() -> None:
    nv = BufferedNvml(util_buffer=False)
    s = GpuSampler([0], nvml=nv)
    nv.push(0, 0, (1, 999_000))
    s.read()
    nv.push(0, 0, (2, 100_000))
    r = s.read()
    assert r["gpu_util_pct"] == 50 and r["gpu_power_w"] == pytest.approx(100)  # power still from its buffer
    asked = sum(1 for a in nv.asked if a[1] == 1)
    s.read()
    assert sum(1 for a in nv.asked if a[1] == 1) == asked == 1  # an unsupported buffer is not asked for again
    nv2 = BufferedNvml()
    off = GpuSampler([0], nvml=nv2, window_mean=False)
    off.read()
    nv2.push(0, 1, (2, 10))
    assert off.read()["gpu_util_pct"] == 50 and nv2.asked == []


def test_a_stream_whose_tokens_all_came_at_once_is_counted_as_one_burst_and_warned_about() -> None:
    from tuner.measure.loadgen import RunResult, client_summary, one_burst_note

    def rec(i: int, span_s: float) -> RequestRecord:
        times = tuple(1.0 + span_s * k / 7 for k in range(8))
        return RequestRecord(index=i, scheduled_s=0.0, sent_s=0.9, first_token_s=times[0], done_s=times[-1],
                             prompt_tokens=8, output_tokens=8, token_times_s=times)

    recs = [rec(i, 0.0005 if i < 3 else 0.05) for i in range(10)]
    s = client_summary(recs, RunResult(records=recs, wall_s=2.0))
    assert s["one_burst_streams"] == 3 and s["one_burst_frac"] == pytest.approx(0.3)
    note = one_burst_note(s)
    assert note is not None and "3 streamed requests (30%)" in note
    streamed = [rec(i, 0.05) for i in range(10)]
    s2 = client_summary(streamed, RunResult(records=streamed, wall_s=2.0))
    assert s2["one_burst_frac"] == 0.0 and one_burst_note(s2) is None
