"""`tuner make-model`: write a Hugging Face Llama checkpoint of a preset, with random weights, made locally.

The directory holds what vLLM, the reference engine (`weights=DIR`) and any Hugging Face-compatible server
load: config.json (LlamaForCausalLM), generation_config.json, model.safetensors, and a tokenizer
(tokenizer.json, tokenizer_config.json with a chat template). Nothing is downloaded.

The weights are the reference engine's own random weights for the same preset and seed (`init_random`),
unfused to the Hugging Face names, so the engine serving the checkpoint and the engine serving the preset
compute the same thing.

The tokenizer is byte-level, like the reference engine's: token id b is the UTF-8 byte b (ids 0..255), id 256
is the end-of-sequence token `<|eos|>`, and the remaining ids up to the vocabulary size decode to `<|id|>`
(what the engine prints for them), so every id the model can sample decodes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tuner.engine.config import PRESETS, ModelConfig
from tuner.errors import ConfigError

EOS_TOKEN = "<|eos|>"
# A plain template: "<|role|>content\n" per message, then "<|assistant|>" when a reply is wanted.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
DTYPES = ("float32", "bfloat16", "float16")


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to printable characters (the ByteLevel alphabet)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    out: dict[int, str] = {}
    extra = 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def hf_config(mc: ModelConfig, dtype: str) -> dict[str, Any]:
    """The config.json of a LlamaForCausalLM with the preset's shapes."""
    cfg: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": mc.vocab_size,
        "hidden_size": mc.hidden_size,
        "intermediate_size": mc.intermediate_size,
        "num_hidden_layers": mc.num_layers,
        "num_attention_heads": mc.num_heads,
        "num_key_value_heads": mc.num_kv_heads,
        "head_dim": mc.head_dim,
        "max_position_embeddings": mc.max_model_len,
        "rms_norm_eps": mc.rms_norm_eps,
        "rope_theta": mc.rope_theta,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": mc.tie_word_embeddings,
        "bos_token_id": None,
        "eos_token_id": mc.eos_token_id,
        "pad_token_id": None,
        "torch_dtype": dtype,
        "initializer_range": 0.02,
    }
    if mc.rope_scaling:
        cfg["rope_scaling"] = {"rope_type": "llama3", **mc.rope_scaling}
    return cfg


def hf_state_dict(mc: ModelConfig, *, seed: int, dtype: str) -> dict[str, Any]:
    """The engine's random weights for (preset, seed), under the Hugging Face Llama tensor names."""
    import torch

    from tuner.engine.model import LlamaModel, init_random

    with torch.device("cpu"):
        model = LlamaModel(mc)
    init_random(model, seed)
    td = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    q, kv = mc.num_heads * mc.head_dim, mc.num_kv_heads * mc.head_dim
    f = mc.intermediate_size
    sd: dict[str, torch.Tensor] = {"model.embed_tokens.weight": model.embed.weight}
    for i, layer in enumerate(model.blocks):
        p = f"model.layers.{i}."
        qkv = layer.qkv.weight
        sd[p + "self_attn.q_proj.weight"] = qkv[:q]
        sd[p + "self_attn.k_proj.weight"] = qkv[q:q + kv]
        sd[p + "self_attn.v_proj.weight"] = qkv[q + kv:]
        sd[p + "self_attn.o_proj.weight"] = layer.o.weight
        sd[p + "mlp.gate_proj.weight"] = layer.gate_up.weight[:f]
        sd[p + "mlp.up_proj.weight"] = layer.gate_up.weight[f:]
        sd[p + "mlp.down_proj.weight"] = layer.down.weight
        sd[p + "input_layernorm.weight"] = layer.ln1.weight
        sd[p + "post_attention_layernorm.weight"] = layer.ln2.weight
    sd["model.norm.weight"] = model.norm.weight
    if not mc.tie_word_embeddings:
        sd["lm_head.weight"] = model.lm_head.weight
    return {k: v.detach().to(td).contiguous().clone() for k, v in sd.items()}


def tokenizer_json(vocab_size: int, eos_id: int) -> str:
    """A byte-level tokenizer (no merges): byte b is token b; `eos_id` is <|eos|>; others decode to <|id|>."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    if eos_id < 256 or eos_id >= vocab_size:
        raise ConfigError(f"the end-of-sequence id {eos_id} must lie in 256..{vocab_size - 1} (ids 0..255 are "
                          "the bytes)", field="preset")
    chars = byte_to_unicode()
    vocab = {chars[b]: b for b in range(256)}
    for i in range(256, vocab_size):
        vocab[EOS_TOKEN if i == eos_id else f"<|{i}|>"] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(EOS_TOKEN, special=True, normalized=False)])
    return str(tok.to_str(pretty=True))


def write_checkpoint(out_dir: Path, preset: str = "tiny", *, seed: int = 0, dtype: str = "float32",
                     max_model_len: int | None = None, force: bool = False) -> Path:
    """Write the checkpoint of `preset` into `out_dir` (created); return the directory."""
    from safetensors.torch import save_file

    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; valid presets: {', '.join(PRESETS)}", field="--preset")
    if dtype not in DTYPES:
        raise ConfigError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}", field="--dtype")
    mc = PRESETS[preset]
    if max_model_len is not None:
        if max_model_len < 8:
            raise ConfigError(f"must be >= 8 (got {max_model_len})", field="--max-model-len")
        mc = ModelConfig(**{**mc.__dict__, "max_model_len": max_model_len})
    if mc.eos_token_id is None:
        raise ConfigError(f"preset {preset!r} has no end-of-sequence id", field="--preset")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError("exists and is not a directory", file=str(out))
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ConfigError("directory is not empty (pass --force to overwrite its files)", file=str(out))
    out.mkdir(parents=True, exist_ok=True)

    save_file(hf_state_dict(mc, seed=seed, dtype=dtype), str(out / "model.safetensors"),
              metadata={"format": "pt", "tuner_preset": preset, "tuner_seed": str(seed)})
    _write_json(out / "config.json", hf_config(mc, dtype))
    _write_json(out / "generation_config.json", {"eos_token_id": mc.eos_token_id, "do_sample": False})
    (out / "tokenizer.json").write_text(tokenizer_json(mc.vocab_size, mc.eos_token_id))
    _write_json(out / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "bos_token": None,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": mc.max_model_len,
        "chat_template": CHAT_TEMPLATE,
    })
    _write_json(out / "special_tokens_map.json", {"eos_token": EOS_TOKEN, "pad_token": EOS_TOKEN})
    return out


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")
