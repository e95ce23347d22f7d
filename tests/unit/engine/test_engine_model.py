"""The engine's Llama model against Hugging Face transformers, and its INT8 layers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support.gpu_doubles import ReferenceVarlen
from tuner.engine.config import ATTENTION, EngineConfig, EngineConfigError, ModelConfig
from tuner.engine.kv_pool import KVPool
from tuner.engine.model import (
    MASK_ALIGN,
    FlashSeqs,
    QLinear,
    build_model,
    decode_attention,
    decode_mask,
    flash_decode_attention,
    hf_model_config,
)
from tuner.engine.varlen import VarlenAttention

transformers = pytest.importorskip("transformers")


def _save_hf(tmp: Path, *, tie: bool, rope_scaling: dict | None = None) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, tie_word_embeddings=tie,
        rope_theta=10000.0, rope_scaling=rope_scaling, eos_token_id=2, bos_token_id=1,
    )
    hf = transformers.LlamaForCausalLM(cfg).eval()
    hf.save_pretrained(tmp, safe_serialization=True)
    assert list(tmp.glob("*.safetensors"))
    return hf


def _ours(tmp: Path):
    mc = hf_model_config(tmp)
    model = build_model(mc, dtype="float32", device="cpu", weights=str(tmp))
    pool = KVPool(mc, dtype=torch.float32, device="cpu", pool_mb=16, pre_allocate=True)
    return mc, model, pool


@pytest.mark.parametrize("tie", [False, True])
def test_logits_agree_with_transformers(tmp_path: Path, tie: bool) -> None:
    hf = _save_hf(tmp_path, tie=tie)
    mc, model, pool = _ours(tmp_path)
    assert mc.num_kv_heads == 2 and mc.tie_word_embeddings == tie
    ids = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0].float()  # [T, vocab]
        # whole prompt in one prefill
        last = model.prefill(ids, 0, 0, pool.k, pool.v)
        torch.testing.assert_close(last, ref[-1], rtol=1e-4, atol=1e-4)
        # chunked prefill (masked attention over earlier chunks) into another slot
        for start in range(0, 40, 16):
            last = model.prefill(ids[start:start + 16], start, 1, pool.k, pool.v)
        torch.testing.assert_close(last, ref[-1], rtol=1e-4, atol=1e-4)
        # decode path, with each attention implementation: one token at a time from position 30, two
        # rows (slots 0 and 1); the attention length (37) is not a multiple of the mask alignment. flash runs
        # the varlen kernel's contract on the CPU (the kernel itself is CUDA only)
        model.varlen = ReferenceVarlen()
        for how in ATTENTION:
            model.attention = how
            for pos in range(30, 37):
                toks = torch.tensor([ids[pos], ids[pos]])
                positions = torch.tensor([pos, pos])
                logits = model.decode(toks, positions, pool.k, pool.v, attn_len=37)
                torch.testing.assert_close(logits[0], ref[pos], rtol=1e-4, atol=1e-4, msg=how)
                torch.testing.assert_close(logits[1], ref[pos], rtol=1e-4, atol=1e-4, msg=how)


def test_decode_mask_hides_later_positions_and_has_an_aligned_row_stride() -> None:
    positions = torch.tensor([0, 5, 36, 40])
    mask = decode_mask(positions, 37, torch.bfloat16)
    assert mask.shape == (4, 1, 1, 37) and mask.dtype == torch.bfloat16
    assert mask.stride(0) % MASK_ALIGN == 0 and mask.stride(-1) == 1
    for row, pos in enumerate(positions.tolist()):
        visible = (mask[row, 0, 0] == 0).nonzero().flatten().tolist()
        assert visible == list(range(min(pos, 36) + 1))
        assert torch.isinf(mask[row, 0, 0, min(pos, 36) + 1:]).all()


def test_matmul_attention_equals_sdpa_for_rows_of_different_lengths() -> None:
    gen = torch.Generator().manual_seed(0)
    b, hkv, g, length, hd = 3, 2, 4, 45, 16
    q = torch.randn(b, hkv, g, hd, generator=gen)
    keys = torch.randn(b, hkv, length, hd, generator=gen)
    vals = torch.randn(b, hkv, length, hd, generator=gen)
    mask = decode_mask(torch.tensor([3, 20, 44]), length, torch.float32)
    ref = decode_attention(q, keys, vals, mask, "sdpa")
    out = decode_attention(q, keys, vals, mask, "matmul")
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # in bfloat16 (scores and probabilities kept in bf16) within bf16 rounding of the float32 result
    bf = torch.bfloat16
    out16 = decode_attention(q.to(bf), keys.to(bf), vals.to(bf), decode_mask(torch.tensor([3, 20, 44]), length, bf),
                             "matmul")
    assert out16.dtype == bf
    torch.testing.assert_close(out16.float(), ref, rtol=0.05, atol=0.05)
    # a row does not see keys past its own position: changing them leaves its output alone
    keys2 = keys.clone()
    keys2[0, :, 4:] = 100.0
    out2 = decode_attention(q, keys2, vals, mask, "matmul")
    torch.testing.assert_close(out2[0], out[0])
    keys2[0, :, 3] = 100.0  # its own last position does count
    assert not torch.allclose(decode_attention(q, keys2, vals, mask, "matmul")[0], out[0])


def test_unknown_attention_is_rejected() -> None:
    mc = ModelConfig(vocab_size=300, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                     intermediate_size=64, max_model_len=32)
    with pytest.raises(ValueError, match="unknown attention 'paged'"):
        build_model(mc, dtype="float32", device="cpu", attention="paged")


def test_flash_attention_reads_each_rows_own_keys_in_the_pool() -> None:
    """The varlen form over the pool as it lies (one sequence per slot and KV head) equals the masked SDPA
    step, for rows of different lengths; a padded row at the scratch column reads a single key."""
    gen = torch.Generator().manual_seed(0)
    slots, hkv, g, positions, hd, attn_len = 5, 2, 4, 50, 16, 45
    k_layer = torch.randn(slots, hkv, positions, hd, generator=gen)
    v_layer = torch.randn(slots, hkv, positions, hd, generator=gen)
    pos = torch.tensor([3, 20, 44, positions - 1])  # row 3: a padded row (scratch column): reads one key
    b = pos.shape[0]
    q = torch.randn(b, hkv, g, hd, generator=gen)
    kernel = ReferenceVarlen()
    seqs = FlashSeqs.of(pos, hkv, positions, attn_len)
    assert seqs.used.tolist() == [4, 4, 21, 21, 45, 45, 1, 1] and seqs.max_k == attn_len
    out = flash_decode_attention(kernel, q, k_layer, v_layer, seqs)
    ref = decode_attention(q, k_layer[:b, :, :attn_len], v_layer[:b, :, :attn_len],
                           decode_mask(pos, attn_len, torch.float32), "sdpa")
    torch.testing.assert_close(out[:3], ref[:3], rtol=1e-5, atol=1e-5)  # the padded row's output is discarded
    assert kernel.calls == 1
    # a row reads nothing past its own position, nor another slot's keys
    k2 = k_layer.clone()
    k2[0, :, 4:] = 100.0
    k2[4:] = 100.0
    torch.testing.assert_close(flash_decode_attention(kernel, q, k2, v_layer, seqs)[:3], out[:3])
    with pytest.raises(ValueError, match="overflow the flash kernel's int32 key offsets"):
        FlashSeqs.of(torch.zeros(2**16, dtype=torch.long), 8, 2**12 + 1, 256)


def test_flash_attention_is_refused_where_the_kernel_cannot_run() -> None:
    cfg = EngineConfig(device="cpu", dtype="bfloat16", attention="flash")
    with pytest.raises(EngineConfigError, match="attention='flash' cannot apply on device 'cpu' in bfloat16: "
                                                "torch's flash kernel needs a CUDA GPU; use attention=sdpa or matmul"):
        cfg.validate("cpu")
    f32 = EngineConfig(device="cpu", dtype="float32", attention="flash")
    with pytest.raises(EngineConfigError, match="runs in bfloat16 or float16 only"):
        f32.validate("cpu")
    assert VarlenAttention().unavailable("cuda", "float32") == "the flash kernel runs in bfloat16 or float16 only"
    assert "multiple of 8 and at most 256 (not 12)" in str(VarlenAttention().unavailable("cuda", "bfloat16", 12))
    # a kernel that runs here (the CPU reference) is accepted in any dtype
    f32.validate("cpu", varlen=ReferenceVarlen())


def test_llama3_rope_scaling_agrees(tmp_path: Path) -> None:
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}
    hf = _save_hf(tmp_path, tie=False, rope_scaling=scaling)
    mc, model, pool = _ours(tmp_path)
    assert mc.rope_scaling is not None
    ids = torch.arange(3, 100)
    with torch.no_grad():
        ref = hf(ids[None]).logits[0, -1].float()
        torch.testing.assert_close(model.prefill(ids, 0, 0, pool.k, pool.v), ref, rtol=1e-4, atol=1e-4)


def test_int8_linear_is_close_to_float() -> None:
    torch.manual_seed(0)
    lin = QLinear(128, 64)
    lin.weight.data.normal_(0, 0.02)
    x = torch.randn(5, 128)
    ref = lin(x)
    lin.quantize_int8()
    assert lin.weight.dtype == torch.int8
    out = lin(x)
    err = (out - ref).abs().max() / ref.abs().max()
    assert err < 0.02


def test_random_weights_are_seeded() -> None:
    mc = ModelConfig(vocab_size=300, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                     intermediate_size=64, max_model_len=32)
    a = build_model(mc, dtype="float32", device="cpu", seed=3)
    b = build_model(mc, dtype="float32", device="cpu", seed=3)
    c = build_model(mc, dtype="float32", device="cpu", seed=4)
    assert torch.equal(a.layers[0].qkv.weight, b.layers[0].qkv.weight)
    assert not torch.equal(a.layers[0].qkv.weight, c.layers[0].qkv.weight)
