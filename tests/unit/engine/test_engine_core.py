"""Engine knobs and flags, the KV pool, the byte tokenizer."""

from __future__ import annotations

import argparse

import pytest
import torch

from tuner.engine.config import (
    PRESETS,
    EngineConfig,
    EngineConfigError,
    ModelConfig,
    add_engine_arguments,
    config_from_namespace,
    knob_names,
    to_argv,
)
from tuner.engine.kv_pool import KVPool
from tuner.engine.tokenizer import ByteTokenizer

MC = ModelConfig(vocab_size=300, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                 intermediate_size=64, max_model_len=63)  # 64 positions per slot: 2*2*2*64*8*4 B = 16 KiB


def _parse(argv: list[str]) -> EngineConfig:
    p = argparse.ArgumentParser()
    add_engine_arguments(p)
    return config_from_namespace(p.parse_args(argv))


def test_flags_round_trip() -> None:
    values = {"batching": "continuous", "max_batch_size": 12, "batch_timeout_ms": 7.5, "pre_allocate": True,
              "cuda_graphs": False, "dtype": "bfloat16", "scheduling_policy": "shortest-prompt-first"}
    argv = to_argv(values)
    assert "--no-cuda-graphs" in argv and "--pre-allocate" in argv and "--max-batch-size" in argv
    cfg = _parse(argv)
    for k, v in values.items():
        assert getattr(cfg, k) == v
    assert _parse([]) == EngineConfig()
    with pytest.raises(EngineConfigError, match="unknown engine option 'nope'"):
        to_argv({"nope": 1})


def test_presets_have_the_documented_shapes() -> None:
    assert 2e6 < PRESETS["tiny"].param_count() < 6e6
    assert 80e6 < PRESETS["small"].param_count() < 140e6
    one = PRESETS["1b"]
    assert (one.hidden_size, one.num_layers, one.num_heads, one.num_kv_heads, one.intermediate_size,
            one.vocab_size) == (2048, 16, 32, 8, 8192, 32000)
    assert 1.05e9 < one.param_count() < 1.15e9
    assert 7.9e9 < PRESETS["8b"].param_count() < 8.1e9


@pytest.mark.parametrize("knob", ["cuda_graphs", "async_output"])
def test_gpu_only_knobs_are_rejected_on_cpu(knob: str) -> None:
    cfg = EngineConfig(**{knob: True, "pre_allocate": True})
    with pytest.raises(EngineConfigError, match=f"{knob}=True cannot apply on device 'cpu'") as exc:
        cfg.validate("cpu")
    assert exc.value.field == knob
    with pytest.raises(EngineConfigError, match="stream_priority"):
        EngineConfig(stream_priority="high").validate("cpu")


def test_invalid_values_are_rejected() -> None:
    with pytest.raises(EngineConfigError, match="batching='dynamic' is not one of"):
        EngineConfig(batching="dynamic").validate("cpu")
    with pytest.raises(EngineConfigError, match="max_batch_size=0 must be >= 1"):
        EngineConfig(max_batch_size=0).validate("cpu")
    with pytest.raises(EngineConfigError, match="kv_pool_mb=1 cannot hold one sequence"):
        EngineConfig(kv_pool_mb=1).validate("cpu")
    EngineConfig(batching="continuous", compile=True).validate("cpu")  # compile works on a CPU too
    assert "cuda_graphs" in knob_names() and "preset" not in knob_names()


def test_pool_full_returns_none_and_release_frees() -> None:
    pool = KVPool(MC, dtype=torch.float32, device="cpu", pool_mb=1, pre_allocate=True)
    assert pool.slot_bytes == 2 * 2 * 2 * 64 * 8 * 4
    assert pool.capacity == 2**20 // pool.slot_bytes == 64
    slots = [pool.acquire() for _ in range(64)]
    assert sorted(slots) == list(range(64))  # type: ignore[type-var]
    assert pool.acquire() is None and pool.usage() == 1.0
    pool.release(5)
    assert pool.acquire() == 5


def test_pool_grows_on_demand_and_keeps_contents() -> None:
    pool = KVPool(MC, dtype=torch.float32, device="cpu", pool_mb=1, pre_allocate=False)
    assert pool.allocated == 0
    a = pool.acquire()
    assert a == 0 and pool.allocated == 1
    pool.k[1][0, :, :3] = 7.0
    b = pool.acquire()
    c = pool.acquire()
    assert (b, c) == (1, 2) and pool.allocated == 4 and pool.grow_count == 2
    assert torch.all(pool.k[1][0, :, :3] == 7.0)
    pool.move(0, 3, upto=3)
    assert torch.all(pool.k[1][3, :, :3] == 7.0)
    assert pool.acquire() == 0  # the source became free


def test_pool_swap_exchanges_two_slots() -> None:
    pool = KVPool(MC, dtype=torch.float32, device="cpu", pool_mb=1, pre_allocate=True)
    pool.v[0][2, :, :4] = 1.0
    pool.v[0][5, :, :4] = 2.0
    pool.swap(2, 5, upto=4)
    assert torch.all(pool.v[0][2, :, :4] == 2.0) and torch.all(pool.v[0][5, :, :4] == 1.0)


def test_byte_tokenizer() -> None:
    tok = ByteTokenizer(512, eos_token_id=256)
    ids = tok.encode("héllo")
    assert ids == list("héllo".encode())
    assert tok.decode(list(b"plain ascii")) == "plain ascii"
    assert tok.token_text(300) == "<|300|>"
    assert all(tok.token_text(t) for t in range(512))  # a streamed token is never empty text
    with pytest.raises(ValueError):
        ByteTokenizer(100, None)


def test_attention_buckets_cover_every_length_with_little_overshoot() -> None:
    from tuner.engine.runner import attn_buckets

    for max_model_len in (512, 2048, 8192):
        sizes = attn_buckets(max_model_len)
        assert sizes == sorted(sizes) and sizes[-1] == max_model_len + 1
        for live in range(1, max_model_len + 1):
            a = next(s for s in sizes if s >= live)
            assert a >= live
            if live > 256:
                assert a <= 1.5 * live + 1  # a replay reads at most ~1.5x the live context
