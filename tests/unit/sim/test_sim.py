"""The simulator's physics, determinism, noise, errors and records (tuner.sim, tuner.targets.sim)."""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from tuner.errors import DeployError, InfeasibleConfig, OutOfMemoryError
from tuner.measure.measurement import Measurement
from tuner.measure.metrics import summarise
from tuner.measure.workload import build_plans
from tuner.sim.config import capture_sizes, resolve_config
from tuner.sim.cost import StepCost
from tuner.sim.engine import simulate
from tuner.sim.profiles import HARDWARE, MODELS, HardwareProfile
from tuner.spec import WorkloadSpec
from tuner.targets.base import TrialContext
from tuner.targets.sim import SimTarget

A100 = HARDWARE["a100-80gb-sxm"]
LLAMA8B = MODELS["llama-3-8b"]


def target(**options: Any) -> SimTarget:
    return SimTarget(SimTarget.Options(**options), agent_dir=Path("."))


def ctx(tmp_path: Path) -> TrialContext:
    return TrialContext(trial_number=0, state_dir=tmp_path)


def workload(concurrency: int | None = 8, n: int = 64, prompt: int = 256, output: int = 64,
             rate: float | None = None, **kw: Any) -> WorkloadSpec:
    arrival: dict[str, Any] = ({"kind": "closed", "concurrency": concurrency} if rate is None
                               else {"kind": "poisson", "rate_per_s": rate})
    return WorkloadSpec.model_validate({
        "arrival": arrival, "prompt_tokens": {"dist": "fixed", "value": prompt},
        "output_tokens": {"dist": "fixed", "value": output}, "num_requests": n, **kw})


def run(params: dict[str, Any], wl: WorkloadSpec, tmp_path: Path, seed: int = 0, **options: Any) -> Measurement:
    with target(**options).deploy(params, ctx(tmp_path)) as dep:
        return dep.measure(wl, goodput_ms={"ttft": 1000.0}, seed=seed)


# ---------------------------------------------------------------- physics
@pytest.mark.parametrize("model", ["llama-1.1b", "llama-3-8b"])
def test_more_bandwidth_never_slows_a_decode_step(model: str) -> None:
    for mode in ("NONE", "FULL_AND_PIECEWISE"):
        prev: list[float] | None = None
        for scale in (0.5, 1.0, 1.5, 2.0, 4.0):
            hw = dataclasses.replace(A100, hbm_bytes_per_s=A100.hbm_bytes_per_s * scale)
            cost = StepCost(resolve_config({"cudagraph_mode": mode}, hardware=hw, model=MODELS[model],
                                           num_gpus=1, max_model_len=4096))
            times = [cost.seconds(b, b * c)[0] for b in (1, 8, 64, 256) for c in (128, 2048)]
            if prev is not None:
                assert all(t <= p for t, p in zip(times, prev, strict=True))
            prev = times
    # and where decode is memory-bound, more bandwidth is strictly faster
    slow = StepCost(resolve_config({}, hardware=A100, model=LLAMA8B, num_gpus=1, max_model_len=4096))
    fast_hw = dataclasses.replace(A100, hbm_bytes_per_s=A100.hbm_bytes_per_s * 2)
    fast = StepCost(resolve_config({}, hardware=fast_hw, model=LLAMA8B, num_gpus=1, max_model_len=4096))
    assert fast.seconds(64, 64 * 2048)[0] < 0.6 * slow.seconds(64, 64 * 2048)[0]


def test_more_bandwidth_never_lowers_decode_throughput_end_to_end() -> None:
    plans = build_plans(workload(concurrency=32, n=96, prompt=128, output=128))
    out = []
    for scale in (1.0, 1.5, 3.0):
        hw: HardwareProfile = dataclasses.replace(A100, hbm_bytes_per_s=A100.hbm_bytes_per_s * scale)
        cfg = resolve_config({}, hardware=hw, model=LLAMA8B, num_gpus=1, max_model_len=4096)
        res = simulate(cfg, plans, concurrency=32, timeout_s=600)
        out.append(summarise(res.records)["output_throughput"])
    assert out[0] < out[1] < out[2]


def test_cuda_graphs_help_small_batches_most(tmp_path: Path) -> None:
    for model, least in (("llama-1.1b", 2.0), ("llama-3-8b", 1.0)):
        kw: dict[str, Any] = {"hardware": A100, "model": MODELS[model], "num_gpus": 1, "max_model_len": 4096}
        graph = StepCost(resolve_config({}, **kw))
        eager = StepCost(resolve_config({"enforce_eager": True}, **kw))
        gain = {b: eager.seconds(b, b * 1024)[0] / graph.seconds(b, b * 1024)[0] for b in (1, 256)}
        assert gain[1] > gain[256] >= 1.0
        assert gain[1] > least
    # the same through whole runs: eager costs a lone user far more than a crowd
    rel = {}
    for conc in (1, 256):
        wl = workload(concurrency=conc, n=max(4, conc), prompt=64, output=128)
        with_graphs = run({}, wl, tmp_path, model="llama-1.1b").summary["output_throughput"]
        without = run({"enforce_eager": True}, wl, tmp_path, model="llama-1.1b").summary["output_throughput"]
        rel[conc] = with_graphs / without
    assert rel[1] > rel[256]
    assert rel[1] > 2.0


def test_step_graph_kind_follows_cudagraph_mode_and_capture_size() -> None:
    def kind(mode: str, tokens: int, decode_only: bool, cap: int = 64) -> str:
        cfg = resolve_config({"cudagraph_mode": mode, "max_cudagraph_capture_size": cap}, hardware=A100,
                             model=LLAMA8B, num_gpus=1, max_model_len=4096)
        return StepCost(cfg).graph_kind(tokens, decode_only)

    assert kind("FULL_AND_PIECEWISE", 32, True) == "full"
    assert kind("FULL_AND_PIECEWISE", 32, False) == "piecewise"
    assert kind("FULL_AND_PIECEWISE", 100, True) == "eager"  # above the capture size
    assert kind("FULL_DECODE_ONLY", 32, False) == "eager"
    assert kind("FULL", 32, False) == "full"
    assert kind("PIECEWISE", 32, True) == "piecewise"
    assert kind("NONE", 1, True) == "eager"
    assert capture_sizes(512, 8192)[:5] == [1, 2, 4, 8, 16] and capture_sizes(512, 8192)[-1] == 512
    assert capture_sizes(512, 100)[-1] == 100


def test_kv_capacity_limits_concurrency(tmp_path: Path) -> None:
    wl = workload(concurrency=256, n=256, prompt=2000, output=400, timeout_s=3600)
    roomy = run({}, wl, tmp_path)
    tight = run({"gpu_memory_utilization": 0.3}, wl, tmp_path)
    assert tight.telemetry["sim_kv_capacity_tokens"] < roomy.telemetry["sim_kv_capacity_tokens"] / 4
    assert tight.telemetry["sim_mean_running"] < roomy.telemetry["sim_mean_running"] / 2
    assert tight.summary["median_ttft_ms"] > roomy.summary["median_ttft_ms"]
    assert tight.summary["output_throughput"] < roomy.summary["output_throughput"]
    # nothing is lost: every request still completes with all its tokens
    for m in (roomy, tight):
        assert m.summary["completed"] == 256 and m.summary["failed"] == 0
        assert all(len(r.token_times_s) == r.output_tokens == 400 for r in m.records)


def test_preemption_recomputes_and_keeps_every_token() -> None:
    cfg = resolve_config({"gpu_memory_utilization": 0.26}, hardware=A100, model=LLAMA8B, num_gpus=1,
                         max_model_len=4096)
    plans = build_plans(workload(concurrency=64, n=64, prompt=1500, output=600))
    res = simulate(cfg, plans, concurrency=64, timeout_s=3600)
    assert res.stats.preemptions > 0
    assert res.leftover == (0, 0, 0)  # every KV token, decoder and running slot was given back
    for r in res.records:
        assert r.ok and r.output_tokens == 600 and len(r.token_times_s) == 600
        assert all(b > a for a, b in zip(r.token_times_s, r.token_times_s[1:], strict=False))
        assert r.first_token_s == r.token_times_s[0] and r.done_s == r.token_times_s[-1]


def test_fp8_kv_cache_roughly_doubles_capacity() -> None:
    auto = resolve_config({}, hardware=A100, model=LLAMA8B, num_gpus=1, max_model_len=8192)
    fp8 = resolve_config({"kv_cache_dtype": "fp8"}, hardware=A100, model=LLAMA8B, num_gpus=1, max_model_len=8192)
    ratio = fp8.memory.kv_capacity_tokens / auto.memory.kv_capacity_tokens
    assert 1.95 < ratio < 2.05


def test_data_parallel_replicas_share_the_load(tmp_path: Path) -> None:
    wl = workload(concurrency=128, n=256, prompt=256, output=128)
    one = run({}, wl, tmp_path)
    two = run({"data_parallel_size": 2}, wl, tmp_path)
    assert two.telemetry["sim_gpus"] == 2
    assert two.summary["output_throughput"] > 1.3 * one.summary["output_throughput"]
    assert two.telemetry["sim_mean_running"] < one.telemetry["sim_mean_running"]


def test_tensor_parallel_fits_70b_where_one_gpu_cannot(tmp_path: Path) -> None:
    t = target(model="llama-3-70b")
    with pytest.raises(OutOfMemoryError) as exc, t.deploy({"tensor_parallel_size": 1}, ctx(tmp_path)):
        pass
    assert exc.value.cause == "out_of_memory"
    with t.deploy({"tensor_parallel_size": 8}, ctx(tmp_path)) as dep:
        m = dep.measure(workload(concurrency=4, n=8), goodput_ms={}, seed=0)
    assert m.summary["completed"] == 8
    assert m.telemetry["sim_weights_gib_per_gpu"] * 8 > 120


def test_static_batching_with_long_timeout_hurts_ttft_at_low_load(tmp_path: Path) -> None:
    wl = workload(concurrency=None, rate=0.5, n=20, prompt=256, output=32)
    cont = run({}, wl, tmp_path)
    static = run({"batching": "static", "batch_timeout_ms": 2000}, wl, tmp_path)
    assert cont.summary["completed"] == static.summary["completed"] == 20
    assert cont.summary["median_ttft_ms"] < 200
    assert static.summary["median_ttft_ms"] > cont.summary["median_ttft_ms"] + 500
    # a short timeout costs little at low load
    short = run({"batching": "static", "batch_timeout_ms": 1}, wl, tmp_path)
    assert short.summary["median_ttft_ms"] < static.summary["median_ttft_ms"] / 5


def test_static_batching_fills_batches_under_load(tmp_path: Path) -> None:
    wl = workload(concurrency=64, n=128, prompt=128, output=32)
    m = run({"batching": "static", "batch_timeout_ms": 10000, "max_num_seqs": 32,
             "max_num_batched_tokens": 2048}, wl, tmp_path)
    assert m.summary["completed"] == 128
    assert m.telemetry["sim_mean_running"] == pytest.approx(32)


# ---------------------------------------------------------------- determinism and noise
def test_same_params_and_seed_give_identical_records(tmp_path: Path) -> None:
    wl = workload(concurrency=16, n=48, output=32)
    a = run({}, wl, tmp_path, seed=3, noise_cv=0.05)
    b = run({}, wl, tmp_path, seed=3, noise_cv=0.05)
    assert a.records == b.records and a.summary == b.summary
    c = run({}, wl, tmp_path, seed=4, noise_cv=0.05)
    assert c.records != a.records
    # without noise the seed changes nothing
    assert run({}, wl, tmp_path, seed=1).records == run({}, wl, tmp_path, seed=2).records


def test_noise_has_the_requested_coefficient_of_variation(tmp_path: Path) -> None:
    wl = workload(concurrency=8, n=24, prompt=128, output=16, warmup_requests=2)
    t = target(model="llama-1.1b", noise_cv=0.05)
    with t.deploy({}, ctx(tmp_path)) as dep:
        thr = [dep.measure(wl, goodput_ms={}, seed=s).summary["output_throughput"] for s in range(60)]
    cv = statistics.pstdev(thr) / statistics.fmean(thr)
    assert 0.035 < cv < 0.065
    # the option seed shifts the noise stream too
    t2 = target(model="llama-1.1b", noise_cv=0.05, seed=1)
    with t2.deploy({}, ctx(tmp_path)) as dep:
        assert dep.measure(wl, goodput_ms={}, seed=0).summary["output_throughput"] != thr[0]


# ---------------------------------------------------------------- records and summaries
def test_records_pass_through_summarise_with_sane_latencies(tmp_path: Path) -> None:
    wl = workload(concurrency=8, n=40, prompt=512, output=64, warmup_requests=8)
    m = run({}, wl, tmp_path)
    assert len(m.records) == 48
    s = m.summary
    assert s == summarise(m.records, goodput_ms={"ttft": 1000.0})
    assert s["completed"] == 40 and s["failed"] == 0 and s["error_rate"] == 0
    assert s["total_output_tokens"] == 40 * 64
    # one decode step of an 8B model on an A100 at batch 8: ~9 ms of weights at ~1.7 TB/s
    assert 6 < s["median_itl_ms"] < 20
    assert s["mean_tpot_ms"] == pytest.approx(s["mean_itl_ms"], rel=0.1)
    # TTFT: the prefill of 512 tokens (~30 ms) plus waiting for a step to end
    assert 10 < s["median_ttft_ms"] < 300
    assert s["p99_ttft_ms"] >= s["median_ttft_ms"]
    assert s["request_goodput"] > 0 and s["goodput_fraction"] == 1.0
    for r in m.records:
        assert r.ok and r.status == 200 and r.first_token_s is not None
        assert r.scheduled_s <= r.sent_s < r.first_token_s <= r.done_s
        assert r.token_times_s[0] == r.first_token_s and r.token_times_s[-1] == r.done_s
        assert len(r.token_times_s) == r.output_tokens == 64
    assert [r.warmup for r in m.records] == [True] * 8 + [False] * 40
    assert m.cold_start_s > 10


def test_open_loop_keeps_the_plan_arrival_times(tmp_path: Path) -> None:
    wl = workload(concurrency=None, rate=4.0, n=30, prompt=128, output=16)
    m = run({}, wl, tmp_path)
    plans = build_plans(wl)
    assert [r.scheduled_s for r in m.records] == [p.arrival_s for p in plans]
    assert all(r.sent_s == r.scheduled_s for r in m.records)
    assert m.summary["request_throughput"] == pytest.approx(4.0, rel=0.5)


def test_traces_and_datasets_replay_through_the_simulator(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(f'{{"timestamp": {0.5 * i}, "prompt_tokens": {100 + i}, "output_tokens": 8}}\n'
                             for i in range(10)))
    wl = WorkloadSpec.model_validate({"arrival": {"kind": "trace", "trace": str(trace)}, "num_requests": 10})
    m = run({}, wl, tmp_path)
    assert [r.scheduled_s for r in m.records] == [0.5 * i for i in range(10)]
    assert [r.prompt_tokens for r in m.records] == [100 + i for i in range(10)]
    assert m.summary["completed"] == 10
    data = tmp_path / "data.jsonl"
    data.write_text("".join(f'{{"prompt": "{"word " * (20 * (i + 1))}", "output_tokens": {4 + i}}}\n'
                            for i in range(5)))
    wl = WorkloadSpec.model_validate({"arrival": {"kind": "closed", "concurrency": 2}, "dataset": "data.jsonl",
                                      "num_requests": 10})
    with SimTarget(SimTarget.Options(), agent_dir=tmp_path).deploy({}, ctx(tmp_path)) as dep:
        m = dep.measure(wl, goodput_ms={}, seed=0)
    assert m.summary["completed"] == 10
    assert {r.output_tokens for r in m.records} <= {4, 5, 6, 7, 8}
    assert m.notes  # approximate prompt lengths are said so


def test_too_long_requests_are_rejected_and_slow_ones_time_out(tmp_path: Path) -> None:
    m = run({}, workload(concurrency=2, n=4, prompt=5000, output=64), tmp_path, max_model_len=4096)
    assert m.summary["errors_http_4xx"] == 4 and m.summary["completed"] == 0
    assert all(r.status == 400 for r in m.records)
    slow = run({}, workload(concurrency=64, n=64, prompt=1024, output=512, timeout_s=2.0), tmp_path)
    assert slow.summary["errors_timeout"] > 0
    assert slow.telemetry["sim_timeouts"] == slow.summary["errors_timeout"]
    for r in slow.records:
        if not r.ok:
            assert r.error == "timeout" and r.done_s - r.sent_s == pytest.approx(2.0)
    # aborted requests give their KV back
    cfg = resolve_config({}, hardware=A100, model=LLAMA8B, num_gpus=1, max_model_len=4096)
    res = simulate(cfg, build_plans(workload(concurrency=64, n=64, prompt=1024, output=512)), concurrency=64,
                   timeout_s=2.0)
    assert res.stats.timeouts > 0 and res.leftover == (0, 0, 0)


def test_duration_bound_closed_loop_stops_sending(tmp_path: Path) -> None:
    wl = WorkloadSpec.model_validate({"arrival": {"kind": "closed", "concurrency": 4}, "duration_s": 2.0,
                                      "prompt_tokens": {"value": 64}, "output_tokens": {"value": 16}})
    with target(model="llama-1.1b").deploy({}, ctx(tmp_path)) as dep:
        m = dep.measure(wl, goodput_ms={}, seed=0)
    assert m.records and max(r.sent_s for r in m.records) < 2.0
    assert m.summary["completed"] == len(m.records)


# ---------------------------------------------------------------- defaults, errors, target API
def test_defaults_are_vllm_033_on_a100_and_h100() -> None:
    a = resolve_config({}, hardware=A100, model=LLAMA8B, num_gpus=8, max_model_len=8192)
    assert (a.max_num_seqs, a.max_num_batched_tokens, a.gpu_memory_utilization) == (256, 2048, 0.92)
    assert a.cudagraph_mode == "FULL_AND_PIECEWISE" and a.max_cudagraph_capture_size == 512 and a.compiled
    assert a.enable_chunked_prefill and a.tensor_parallel_size == a.data_parallel_size == 1
    h = resolve_config({}, hardware=HARDWARE["h100-sxm"], model=LLAMA8B, num_gpus=8, max_model_len=8192)
    assert (h.max_num_seqs, h.max_num_batched_tokens) == (1024, 8192)
    small = resolve_config({"max_num_seqs": 64}, hardware=A100, model=LLAMA8B, num_gpus=1, max_model_len=8192)
    assert small.max_cudagraph_capture_size == 128
    nochunk = resolve_config({"enable_chunked_prefill": False}, hardware=A100, model=LLAMA8B, num_gpus=1,
                             max_model_len=8192)
    assert nochunk.max_num_batched_tokens == 8192
    eager = resolve_config({"enforce_eager": True}, hardware=A100, model=LLAMA8B, num_gpus=1, max_model_len=8192)
    assert eager.cudagraph_mode == "NONE" and not eager.compiled and eager.cold_start_s < a.cold_start_s
    o1 = resolve_config({"optimization_level": 1}, hardware=A100, model=LLAMA8B, num_gpus=1, max_model_len=8192)
    assert o1.cudagraph_mode == "PIECEWISE"


@pytest.mark.parametrize(("params", "error", "cause", "words"), [
    ({"tensor_parallel_size": 4, "data_parallel_size": 4}, InfeasibleConfig, "infeasible_config", "16 GPUs"),
    ({"enable_chunked_prefill": False, "max_num_batched_tokens": 4096}, DeployError, "invalid_config",
     "max_model_len"),
    ({"max_num_seqs": 512, "max_num_batched_tokens": 256}, DeployError, "invalid_config", "max_num_seqs"),
    ({"gpu_memory_utilization": 0.2}, OutOfMemoryError, "out_of_memory", "no available memory for the cache"),
    ({"gpu_memory_utilization": 0.215}, OutOfMemoryError, "out_of_memory", "max seq len"),
    ({"gpu_memory_utilization": 1.5}, DeployError, "invalid_config", "gpu_memory_utilization"),
    ({"tensor_parallel_size": 3}, DeployError, "invalid_config", "divisible"),
    ({"kv_cache_dtype": "int4"}, DeployError, "invalid_config", "kv_cache_dtype"),
    ({"cudagraph_mode": "SOMETIMES"}, DeployError, "invalid_config", "cudagraph_mode"),
    ({"batching": "dynamic"}, DeployError, "invalid_config", "batching"),
    ({"swap_space": 4}, DeployError, "invalid_config", "unrecognized"),
])
def test_infeasible_and_failing_configs_raise_classified_errors(
        tmp_path: Path, params: dict[str, Any], error: type[Exception], cause: str, words: str) -> None:
    with pytest.raises(error) as exc, target().deploy(params, ctx(tmp_path)):
        pytest.fail("deploy() must raise before yielding")
    assert getattr(exc.value, "cause", None) == cause
    assert words.lower() in str(exc.value).lower()


def test_options_validate_names_and_list_the_valid_ones() -> None:
    with pytest.raises(ValidationError, match="a100-80gb-sxm, h100-sxm, h200"):
        SimTarget.Options(hardware="tpu-v5")
    with pytest.raises(ValidationError, match="llama-1.1b, llama-3-70b, llama-3-8b"):
        SimTarget.Options(model="gpt-5")
    with pytest.raises(ValidationError):
        SimTarget.Options(gpus=8)  # type: ignore[call-arg]


def test_describe_and_gpus_needed() -> None:
    t = target(hardware="h200", model="llama-1.1b", num_gpus=4)
    d = t.describe()
    assert d["kind"] == "sim" and d["engine"].startswith("sim-") and d["hardware"] == "h200"
    assert d["model"] == "llama-1.1b" and d["gpus"] == "4"
    assert t.gpus_needed({}) == 1
    assert t.gpus_needed({"tensor_parallel_size": 2, "data_parallel_size": 4}) == 8


def test_stop_event_interrupts_measure(tmp_path: Path) -> None:
    from tuner.errors import Interrupted

    c = ctx(tmp_path)
    with target().deploy({}, c) as dep:
        c.stop_event.set()
        with pytest.raises(Interrupted):
            dep.measure(workload(), goodput_ms={}, seed=0)


def test_configs_measured_with_one_seed_see_independent_noise(tmp_path: Path) -> None:
    wl = workload(concurrency=4, n=8, output=8)
    factors = {run(p, wl, tmp_path, seed=7, noise_cv=0.05).telemetry["sim_noise_factor"]
               for p in ({}, {"max_num_seqs": 128}, {"gpu_memory_utilization": 0.9})}
    assert len(factors) == 3
    assert run({}, wl, tmp_path, seed=7, noise_cv=0.05).telemetry["sim_noise_factor"] in factors


def test_rng_draws_are_independent_of_global_numpy_state(tmp_path: Path) -> None:
    wl = workload(concurrency=4, n=8, output=8)
    np.random.seed(1)
    a = run({}, wl, tmp_path, seed=5, noise_cv=0.1)
    np.random.seed(2)
    b = run({}, wl, tmp_path, seed=5, noise_cv=0.1)
    assert a.records == b.records
