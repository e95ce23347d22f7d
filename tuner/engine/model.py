"""A Llama-architecture decoder in plain torch: RMSNorm, RoPE, GQA attention, SwiGLU.

QKV and gate/up projections are fused into one matmul each. Linear layers can hold INT8 weights
(weight-only, per-output-channel scales). The KV cache lives outside the model (tuner.engine.kv_pool)
and is passed to `prefill` and `decode`.

Cache layout, per layer: k and v of shape [slots, kv_heads, max_model_len + 1, head_dim]; the last
position of every slot is a scratch column that padded decode rows write into and nobody reads.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any, NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import nn

from tuner.engine.config import ATTENTION, ModelConfig
from tuner.engine.varlen import VarlenAttention

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class QLinear(nn.Module):
    """y = x @ W.T, W held in the model dtype or as INT8 with per-output-channel scales."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.register_buffer("scale", None)
        self.int8_kernel = False

    def quantize_int8(self) -> None:
        w = self.weight.data.float()
        scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-8)
        q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
        dtype = self.weight.dtype
        self.weight = nn.Parameter(q, requires_grad=False)
        self.scale = scale.to(dtype)
        # torch's fused weight-only INT8 matmul where it exists for this device; else dequantise.
        self.int8_kernel = False
        try:
            x = torch.zeros(2, self.in_features, dtype=dtype, device=q.device)
            torch._weight_int8pack_mm(x, q, self.scale)
            self.int8_kernel = True
        except (RuntimeError, AttributeError, NotImplementedError):
            self.int8_kernel = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.scale is None:
            return F.linear(x, self.weight)
        if self.int8_kernel:
            shape = x.shape
            y = torch._weight_int8pack_mm(x.reshape(-1, shape[-1]), self.weight, self.scale)
            return y.reshape(*shape[:-1], self.out_features)
        return F.linear(x, self.weight.to(x.dtype)) * self.scale


def rope_tables(cfg: ModelConfig, length: int, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape [length, head_dim] (halves repeated, as Hugging Face's rotate_half wants)."""
    hd = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    if cfg.rope_scaling:
        s = cfg.rope_scaling
        factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
        old = s["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        lo_wl, hi_wl = old / lo, old / hi
        scaled = torch.where(wavelen > lo_wl, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wavelen <= lo_wl) & (wavelen >= hi_wl)
        inv = torch.where(is_mid, mid, scaled)
    t = torch.arange(length, dtype=torch.float64)
    freqs = torch.outer(t, inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().float().to(device), emb.sin().float().to(device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [..., heads, head_dim]; cos/sin broadcastable as [..., 1, head_dim]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rot = torch.cat([-x2, x1], dim=-1)
    return x * cos + rot * sin


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        hd = cfg.head_dim
        self.n_heads, self.n_kv, self.hd = cfg.num_heads, cfg.num_kv_heads, hd
        self.q_size, self.kv_size = cfg.num_heads * hd, cfg.num_kv_heads * hd
        self.ln1 = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.ln2 = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.qkv = QLinear(cfg.hidden_size, self.q_size + 2 * self.kv_size)
        self.o = QLinear(self.q_size, cfg.hidden_size)
        self.gate_up = QLinear(cfg.hidden_size, 2 * cfg.intermediate_size)
        self.down = QLinear(cfg.intermediate_size, cfg.hidden_size)
        self.ffn = cfg.intermediate_size

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        gu = self.gate_up(x)
        g, u = gu[..., : self.ffn], gu[..., self.ffn:]
        return self.down(F.silu(g) * u)

    def qkv_split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        qkv = self.qkv(x)
        q = qkv[..., : self.q_size].unflatten(-1, (self.n_heads, self.hd))
        k = qkv[..., self.q_size: self.q_size + self.kv_size].unflatten(-1, (self.n_kv, self.hd))
        v = qkv[..., self.q_size + self.kv_size:].unflatten(-1, (self.n_kv, self.hd))
        return q, k, v


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = QLinear(cfg.hidden_size, cfg.vocab_size)
        self.rope_len = cfg.max_model_len + 1
        self.register_buffer("cos", torch.empty(0), persistent=False)
        self.register_buffer("sin", torch.empty(0), persistent=False)
        # how a decode step computes attention: "sdpa" or "matmul" (see `decode_attention`), or "flash"
        # (`flash_decode_attention`, through `varlen`: the CUDA kernel, or a stand-in passed to build_model)
        self.attention = "sdpa"
        self.varlen = VarlenAttention()

    @property
    def blocks(self) -> list[Block]:
        return cast(list[Block], list(self.layers))

    def init_rope(self) -> None:
        cos, sin = rope_tables(self.cfg, self.rope_len, self.embed.weight.device)
        dtype = self.embed.weight.dtype
        self.cos, self.sin = cos.to(dtype), sin.to(dtype)

    # ------------------------------------------------------------------ prefill
    def prefill(self, tokens: torch.Tensor, start: int, slot: int, k_cache: list[torch.Tensor],
                v_cache: list[torch.Tensor]) -> torch.Tensor:
        """One chunk of one sequence: tokens [C] at positions start..start+C-1, written to `slot`.

        Returns the logits of the chunk's last token, float32 [vocab].
        """
        c = tokens.shape[0]
        end = start + c
        x = self.embed(tokens)  # [C, d]
        cos = self.cos[start:end, None, :]
        sin = self.sin[start:end, None, :]
        group = self.cfg.num_heads // self.cfg.num_kv_heads
        mask = None
        if start > 0:
            qpos = torch.arange(start, end, device=tokens.device)[:, None]
            mask = torch.arange(end, device=tokens.device)[None, :] <= qpos
        for i, layer in enumerate(self.blocks):
            h = layer.ln1(x)
            q, k, v = layer.qkv_split(h)  # [C, H, hd], [C, Hkv, hd]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            k_cache[i][slot, :, start:end] = k.transpose(0, 1)
            v_cache[i][slot, :, start:end] = v.transpose(0, 1)
            keys = k_cache[i][slot, :, :end]  # [Hkv, end, hd]
            vals = v_cache[i][slot, :, :end]
            if group > 1:
                keys = keys.repeat_interleave(group, dim=0)
                vals = vals.repeat_interleave(group, dim=0)
            att = F.scaled_dot_product_attention(q.transpose(0, 1), keys, vals, attn_mask=mask,
                                                 is_causal=mask is None)  # [H, C, hd]
            x = x + layer.o(att.transpose(0, 1).reshape(c, -1))
            x = x + layer.mlp(layer.ln2(x))
        last = self.norm(x[-1:])
        return self.lm_head(last)[0].float()

    # ------------------------------------------------------------------ decode
    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, k_cache: list[torch.Tensor],
               v_cache: list[torch.Tensor], attn_len: int) -> torch.Tensor:
        """One token for each of the first b slots (row i is slot i). Returns float32 logits [b, vocab].

        tokens, positions: [b]. Attention reads positions [0, attn_len) of each slot, masked to the
        row's own length, so a row's result does not depend on the other rows.
        """
        b = tokens.shape[0]
        cfg = self.cfg
        group = cfg.num_heads // cfg.num_kv_heads
        x = self.embed(tokens)  # [b, d]
        cos = self.cos[positions][:, None, :]
        sin = self.sin[positions][:, None, :]
        hkv, hd = cfg.num_kv_heads, cfg.head_dim
        # where each row's new k/v goes: slot = row, position = positions[row] (one scatter per tensor)
        where = positions.view(b, 1, 1, 1).expand(b, hkv, 1, hd)
        flash = self.attention == "flash"
        if flash:
            seqs = FlashSeqs.of(positions, hkv, k_cache[0].shape[2], attn_len)
        else:
            mask = decode_mask(positions, attn_len, x.dtype)
        nq = cfg.num_heads
        for i, layer in enumerate(self.blocks):
            h = layer.ln1(x)
            qkv = layer.qkv(h)
            # q and k are adjacent in the fused projection: one RoPE for both
            qk = apply_rope(qkv[:, : layer.q_size + layer.kv_size].unflatten(-1, (nq + hkv, hd)), cos, sin)
            q, k = qk[:, :nq], qk[:, nq:]
            v = qkv[:, layer.q_size + layer.kv_size:].unflatten(-1, (hkv, hd))
            kc, vc = k_cache[i], v_cache[i]
            kc[:b].scatter_(2, where, k.unsqueeze(2))
            vc[:b].scatter_(2, where, v.unsqueeze(2))
            qg = q.reshape(b, hkv, group, hd)  # query heads grouped by their KV head
            if flash:
                att = flash_decode_attention(self.varlen, qg, kc, vc, seqs)
            else:
                keys = kc[:b, :, :attn_len]  # [b, Hkv, L, hd]
                vals = vc[:b, :, :attn_len]
                att = decode_attention(qg, keys, vals, mask, self.attention)  # [b, Hkv, G, hd]
            x = x + layer.o(att.reshape(b, -1))
            x = x + layer.mlp(layer.ln2(x))
        return self.lm_head(self.norm(x)).float()


MASK_ALIGN = 16  # elements: the row stride SDPA's memory-efficient kernel wants for an attention bias


def decode_mask(positions: torch.Tensor, attn_len: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask [b, 1, 1, attn_len]: 0 where key position <= the row's position, -inf elsewhere.

    One per step, not per layer (SDPA would convert a boolean mask in every layer). Its rows are laid
    out with a stride rounded up to MASK_ALIGN elements, so SDPA's memory-efficient kernel reads it as
    it is instead of padding a copy in every layer.
    """
    b = positions.shape[0]
    stride = -(-attn_len // MASK_ALIGN) * MASK_ALIGN
    keys = torch.arange(stride, device=positions.device)[None, :]
    full = torch.zeros(b, stride, dtype=dtype, device=positions.device)
    full.masked_fill_(keys > positions[:, None], float("-inf"))
    return full[:, None, None, :attn_len]


def decode_attention(q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor, mask: torch.Tensor,
                     how: str) -> torch.Tensor:
    """Attention of a decode step: q [b, Hkv, G, hd] (query heads grouped by KV head), keys and vals
    [b, Hkv, L, hd] (views into the KV pool), mask [b, 1, 1, L] additive. Returns [b, Hkv, G, hd].

    "sdpa": torch's scaled_dot_product_attention, which picks its own kernel for a masked query.
    "matmul": two batched matmuls around a softmax: K and V are read once each by cuBLAS whatever the
    query length, at the cost of the [b, Hkv, G, L] scores, kept in the model's dtype (6 passes of 2 bytes
    per score in bf16, about a fifth of the K and V bytes; torch's softmax accumulates in float32).
    """
    if how == "matmul":
        scale = 1.0 / math.sqrt(q.shape[-1])
        scores = torch.matmul(q * scale, keys.transpose(-1, -2))  # [b, Hkv, G, L]
        return torch.matmul(torch.softmax(scores + mask, dim=-1), vals)
    return F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask)


class FlashSeqs(NamedTuple):
    """The varlen kernel's view of one decode step: sequence i = (row i // Hkv, KV head i % Hkv)."""

    cu_q: torch.Tensor  # [n + 1] int32: one query token per sequence
    cu_k: torch.Tensor  # [n + 1] int32: sequence i's keys start at i x positions in the layer's flat k
    used: torch.Tensor  # [n] int32: keys each sequence reads (its row's position + 1)
    max_k: int

    @staticmethod
    def of(positions: torch.Tensor, kv_heads: int, slot_positions: int, attn_len: int) -> FlashSeqs:
        """For rows at `positions` [b] attending over at most `attn_len` keys of slots of `slot_positions`.

        No host synchronisation (graph-capturable). A padded row's position is the scratch column (the
        slot's last): it reads one key, since its output is discarded. No length exceeds attn_len: the
        kernel would not read keys past max_k."""
        b = positions.shape[0]
        n = b * kv_heads
        if n * slot_positions >= 2**31:
            raise ValueError(f"{b} rows x {kv_heads} KV heads x {slot_positions} positions overflow the flash "
                             "kernel's int32 key offsets")
        cu_q = torch.arange(n + 1, dtype=torch.int32, device=positions.device)
        lengths = torch.where(positions >= slot_positions - 1, 1, (positions + 1).clamp(max=attn_len))
        used = lengths.to(torch.int32)[:, None].expand(b, kv_heads).reshape(n)
        return FlashSeqs(cu_q, cu_q * slot_positions, used, attn_len)


def flash_decode_attention(varlen: VarlenAttention, q: torch.Tensor, k_layer: torch.Tensor,
                           v_layer: torch.Tensor, seqs: FlashSeqs) -> torch.Tensor:
    """Attention of a decode step through the varlen kernel (see tuner.engine.varlen): q [b, Hkv, G, hd];
    k_layer and v_layer one layer's whole pool [slots, Hkv, positions, hd], read in place (rows are slots
    0..b-1). Returns [b, Hkv, G, hd]."""
    b, hkv, g, hd = q.shape
    n = b * hkv
    flat = n * k_layer.shape[2]
    out = varlen(q.reshape(n, g, hd).contiguous(), k_layer[:b].view(flat, 1, hd), v_layer[:b].view(flat, 1, hd),
                 seqs.cu_q, seqs.cu_k, 1, seqs.max_k, seqs.used, 1.0 / math.sqrt(hd))
    return out.view(b, hkv, g, hd)


# ---------------------------------------------------------------------------- construction
def build_model(cfg: ModelConfig, *, dtype: str, device: str, seed: int = 0,
                weights: str | None = None, quantization: str = "none", attention: str = "sdpa",
                varlen: VarlenAttention | None = None) -> LlamaModel:
    """Random weights or a checkpoint's.

    Random weights are seeded. On a CPU they are drawn on the CPU; on a GPU they are drawn on the GPU by
    its own generator (a CPU draw of the `1b` preset's 1.1 B values takes 10-15 s, which every trial's cold
    start would pay; on the GPU it takes milliseconds). The same seed gives the same weights on the same
    kind of device, which is what comparisons between configurations need.
    """
    torch_dtype = DTYPES[dtype]
    build_on = "cpu" if weights or not str(device).startswith("cuda") else device
    with torch.device(build_on):
        model = LlamaModel(cfg)
    if weights:
        load_hf_weights(model, Path(weights))
    else:
        init_random(model, seed)
    model = model.to(device=device, dtype=torch_dtype)
    model.init_rope()
    if attention not in ATTENTION:
        raise ValueError(f"unknown attention {attention!r}; valid: {', '.join(ATTENTION)}")
    model.attention = attention
    if varlen is not None:
        model.varlen = varlen
    if quantization == "int8":
        for layer in model.blocks:
            for lin in (layer.qkv, layer.o, layer.gate_up, layer.down):
                lin.quantize_int8()
    elif quantization != "none":
        raise ValueError(f"unknown quantization {quantization!r}")
    model.eval()
    return model


def init_random(model: LlamaModel, seed: int) -> None:
    gen = torch.Generator(device=model.embed.weight.device).manual_seed(seed)
    cfg = model.cfg
    std = 0.02
    with torch.no_grad():
        model.embed.weight.normal_(0.0, 1.0, generator=gen)
        for layer in model.blocks:
            for lin in (layer.qkv, layer.o, layer.gate_up, layer.down):
                lin.weight.normal_(0.0, std, generator=gen)
        # A larger output scale spreads the logits so greedy choices are not near-ties.
        model.lm_head.weight.normal_(0.0, 1.0 / math.sqrt(cfg.hidden_size), generator=gen)


def hf_model_config(config_dir: Path) -> ModelConfig:
    """ModelConfig from a Hugging Face LlamaConfig (config.json)."""
    raw: dict[str, Any] = json.loads((config_dir / "config.json").read_text())
    rope = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or (rope if rope.get("rope_type") == "llama3" else None)
    rope_theta = float(rope.get("rope_theta", raw.get("rope_theta", 10000.0)))
    eos = raw.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    rs = None
    if scaling and (scaling.get("rope_type") or scaling.get("type")) == "llama3":
        rs = {k: float(scaling[k]) for k in ("factor", "low_freq_factor", "high_freq_factor",
                                               "original_max_position_embeddings")}
    elif scaling and (scaling.get("rope_type") or scaling.get("type")) not in (None, "default"):
        raise ValueError(f"unsupported rope scaling {scaling!r}")
    n_heads = int(raw["num_attention_heads"])
    hidden = int(raw["hidden_size"])
    head_dim = raw.get("head_dim")
    return ModelConfig(
        vocab_size=int(raw["vocab_size"]), hidden_size=hidden, num_layers=int(raw["num_hidden_layers"]),
        num_heads=n_heads, num_kv_heads=int(raw.get("num_key_value_heads") or n_heads),
        intermediate_size=int(raw["intermediate_size"]),
        max_model_len=int(raw.get("max_position_embeddings", 2048)), rope_theta=rope_theta,
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)), eos_token_id=eos,
        head_dim_override=int(head_dim) if head_dim and int(head_dim) != hidden // n_heads else None,
        rope_scaling=rs,
    )


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors file in {path}")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


def load_hf_weights(model: LlamaModel, path: Path) -> None:
    """Copy a Hugging Face Llama checkpoint's tensors into the fused layout."""
    sd = _read_safetensors(path)
    sd = {k.removeprefix("model."): v for k, v in sd.items()}
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        if name not in sd:
            raise KeyError(f"checkpoint {path} lacks tensor {name!r}")
        used.add(name)
        return sd[name].float()

    with torch.no_grad():
        model.embed.weight.copy_(take("embed_tokens.weight"))
        for i, layer in enumerate(model.blocks):
            p = f"layers.{i}."
            layer.qkv.weight.copy_(torch.cat([take(p + "self_attn.q_proj.weight"),
                                              take(p + "self_attn.k_proj.weight"),
                                              take(p + "self_attn.v_proj.weight")]))
            layer.o.weight.copy_(take(p + "self_attn.o_proj.weight"))
            layer.gate_up.weight.copy_(torch.cat([take(p + "mlp.gate_proj.weight"),
                                                  take(p + "mlp.up_proj.weight")]))
            layer.down.weight.copy_(take(p + "mlp.down_proj.weight"))
            layer.ln1.weight.copy_(take(p + "input_layernorm.weight"))
            layer.ln2.weight.copy_(take(p + "post_attention_layernorm.weight"))
        model.norm.weight.copy_(take("norm.weight"))
        if "lm_head.weight" in sd:
            model.lm_head.weight.copy_(take("lm_head.weight"))
        else:
            model.lm_head.weight.copy_(take("embed_tokens.weight"))
    extra = sorted(k for k in sd if k not in used and "rotary_emb" not in k)
    if extra:
        log.warning("checkpoint tensors not used: %s", ", ".join(extra[:8]))


def weight_bytes(model: LlamaModel) -> int:
    """Bytes of parameters a decode step reads (the embedding gathers only b rows)."""
    total = 0
    for name, p in model.named_parameters():
        if name.startswith("embed"):
            continue
        total += p.numel() * p.element_size()
    for name, b in model.named_buffers():
        if name.endswith("scale") and b is not None:
            total += b.numel() * b.element_size()
    return total
