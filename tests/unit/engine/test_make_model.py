"""`tuner make-model`: a Hugging Face checkpoint of a preset, loadable by transformers and the reference
engine, whose weights are the engine's own random weights and whose tokenizer is the engine's byte-level one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tuner.cli.main import app
from tuner.engine.checkpoint import EOS_TOKEN, write_checkpoint
from tuner.engine.config import PRESETS
from tuner.engine.kv_pool import KVPool
from tuner.engine.model import build_model, hf_model_config
from tuner.errors import ConfigError


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ckpt") / "tiny"
    res = CliRunner().invoke(app, ["make-model", "--preset", "tiny", str(out)])
    assert res.exit_code == 0, res.output
    return out


def test_files_and_config(tiny: Path) -> None:
    names = {p.name for p in tiny.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json"} <= names
    cfg = json.loads((tiny / "config.json").read_text())
    mc = PRESETS["tiny"]
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"], cfg["num_key_value_heads"]) == (
        mc.hidden_size, mc.num_layers, mc.vocab_size, mc.num_kv_heads)
    assert cfg["max_position_embeddings"] == mc.max_model_len


def test_engine_loads_the_same_weights_it_draws(tiny: Path) -> None:
    mc = PRESETS["tiny"]
    drawn = build_model(mc, dtype="float32", device="cpu", seed=0)
    loaded = build_model(mc, dtype="float32", device="cpu", weights=str(tiny))
    a, b = drawn.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_transformers_computes_what_the_engine_computes(tiny: Path) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(tiny), local_files_only=True, torch_dtype=torch.float32).eval()
    ids = torch.tensor([list(b"hello world, a prompt")])
    with torch.no_grad():
        logits = hf(ids).logits[0, -1]
    mc = hf_model_config(tiny)
    assert mc == PRESETS["tiny"]
    engine = build_model(mc, dtype="float32", device="cpu", weights=str(tiny))
    pool = KVPool(mc, dtype=torch.float32, device="cpu", pool_mb=16, pre_allocate=True)
    with torch.no_grad():
        mine = engine.prefill(ids[0], 0, 0, pool.k, pool.v)
    torch.testing.assert_close(mine, logits, rtol=1e-4, atol=1e-4)
    # a random model is not a constant one: the next-token distribution depends on the prompt
    with torch.no_grad():
        other = hf(torch.tensor([list(b"another prompt entirely")])).logits[0, -1]
    assert not torch.allclose(logits, other)


def test_tokenizer_is_byte_level_with_a_chat_template(tiny: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny), local_files_only=True)
    text = "héllo, wörld\n\t!"
    assert tok.encode(text, add_special_tokens=False) == list(text.encode())
    assert tok.decode(list(text.encode())) == text
    assert tok.eos_token == EOS_TOKEN and tok.eos_token_id == PRESETS["tiny"].eos_token_id
    assert tok.decode([300, 511]) == "<|300|><|511|>"  # every id the model can sample decodes
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                     add_generation_prompt=True)
    assert prompt == "<|user|>hi\n<|assistant|>"


def test_bad_input_is_a_located_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown preset 'huge'"):
        write_checkpoint(tmp_path / "a", "huge")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x").write_text("x")
    with pytest.raises(ConfigError, match="not empty"):
        write_checkpoint(tmp_path / "b", "tiny")
    res = CliRunner().invoke(app, ["make-model", "--preset", "huge", str(tmp_path / "c")])
    assert res.exit_code == 2 and "unknown preset" in res.output
