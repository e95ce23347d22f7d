"""A tiny Hugging Face Llama checkpoint made on the spot (random weights, a byte-level BPE tokenizer trained
here on generated text, a chat template): nothing is downloaded. Third-party servers load it from the
directory (`transformers serve`, vLLM's CPU build).

    python tests/support/tiny_model.py DIR        # or make_tiny_model(DIR) from a test
"""

from __future__ import annotations

import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
_WORDS = (
    "the of and to in is was for on that with as by at from his her an be this are or which had not but it "
    "have one all were they new more has two first its also after who been time their year up other into "
    "she when would can out him over there about only some we so most these three many may use no then part "
    "city such made them game four five six like any each make model token serve batch cache queue prompt"
).split()


def make_tiny_model(out: Path, *, vocab_size: int = 1024, hidden: int = 64, layers: int = 2,
                    max_len: int = 2048, seed: int = 0) -> Path:
    """Write a loadable tiny Llama (safetensors) with its tokenizer to `out`; returns `out`."""
    import random

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    rnd = random.Random(seed)
    corpus = [" ".join(rnd.choice(_WORDS) for _ in range(40)) for _ in range(400)]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="</s>",
                                   model_max_length=max_len)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=hidden, intermediate_size=hidden * 2,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=max_len, bos_token_id=fast.bos_token_id,
                      eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id, torch_dtype="float32")
    model = LlamaForCausalLM(cfg)
    model.generation_config.max_length = max_len
    model.save_pretrained(str(out), safe_serialization=True)
    return out


if __name__ == "__main__":
    print(make_tiny_model(Path(sys.argv[1])))
