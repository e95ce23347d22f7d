"""Tokenizers for building prompts of known length and counting prompt tokens.

- `byte`: the reference engine's tokenizer, 1 token per UTF-8 byte, ids 0..255 (exact).
- a local Hugging Face tokenizer directory (exact; loaded with local_files_only). Synthesised text prompts
  are words that are one token each, checked with the tokenizer, so the text has exactly the asked count; a
  vocabulary without such words (byte-level, as `tuner make-model` writes) gets text cut to the count
  (tuner.measure.promptfit, searched with the tokenizer).
- none: an approximation (~1 token per common English word, 4 bytes per token for counting) that says so
  (`exact` is False; the records carry prompt_tokens_exact=False unless the server reports usage).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tuner.errors import ConfigError
from tuner.measure.words import COMMON_WORDS

log = logging.getLogger(__name__)


class Tokenizer(Protocol):
    name: str

    @property
    def exact(self) -> bool:
        """Prompts it builds have exactly the asked count."""
        ...

    def count(self, text: str) -> int: ...

    def synth(self, n_tokens: int, key: int) -> str:
        """A text prompt of `n_tokens` tokens (exactly, when `exact`), different for each `key` (defeats
        prefix caching)."""
        ...

    def synth_text(self, n_tokens: int, key: int) -> str:
        """The same as synth."""
        ...

    def synth_ids(self, n_tokens: int, key: int) -> list[int]:
        """A prompt of `n_tokens` token ids (ConfigError when the tokenizer has no ids)."""
        ...


class ByteTokenizer:
    """1 token per UTF-8 byte (the reference engine). Synthesised prompts are ASCII letters: exact."""

    name = "byte"
    exact = True

    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz    ", dtype=np.uint8)
        self._base = bytes(rng.choice(letters, size=1 << 17)).decode()

    def count(self, text: str) -> int:
        return len(text.encode())

    def synth_text(self, n_tokens: int, key: int) -> str:
        head = f"{key} "
        if len(head) >= n_tokens:
            return "x" * n_tokens
        n = n_tokens - len(head)
        off = (key * 7919) % (len(self._base) - 1)
        body = (self._base[off:] + self._base) * (1 + n // len(self._base))
        return head + body[:n]

    def synth(self, n_tokens: int, key: int) -> str:
        return self.synth_text(n_tokens, key)

    def synth_ids(self, n_tokens: int, key: int) -> list[int]:
        return list(self.synth_text(n_tokens, key).encode())


class ApproxTokenizer:
    """No tokenizer: prompts of common words (~1 token each), counts ~4 bytes per token. Not exact."""

    name = "approx"
    exact = False

    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self._base = [str(w) for w in rng.choice(COMMON_WORDS, size=1 << 15)]

    def count(self, text: str) -> int:
        return max(1, round(len(text.encode()) / 4))

    def synth_text(self, n_tokens: int, key: int) -> str:
        n = max(1, n_tokens - 1)
        off = (key * 7919) % len(self._base)
        words = (self._base[off:] + self._base) * (1 + n // len(self._base))
        return f"{key} " + " ".join(words[:n])

    def synth(self, n_tokens: int, key: int) -> str:
        return self.synth_text(n_tokens, key)

    def synth_ids(self, n_tokens: int, key: int) -> list[int]:
        raise ConfigError("prompts as token ids need a tokenizer (--tokenizer DIR, or tokenizer: in the target)")


class HFTokenizer:
    """A local Hugging Face tokenizer directory (exact). Text prompts are words of one token each, their
    count checked with the tokenizer; token-id prompts are random ids (no special tokens)."""

    exact = True
    max_tries = 12

    def __init__(self, path: str, seed: int = 0) -> None:
        try:
            from transformers import AutoTokenizer
        except ImportError as exc:  # pragma: no cover - transformers is in the test extra
            raise ConfigError(f"tokenizer {path!r}: transformers is not installed") from exc
        try:
            self._tok: Any = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"tokenizer {path!r} could not be loaded: {exc}") from None
        self.name = str(path)
        special = set(getattr(self._tok, "all_special_ids", []) or [])
        vocab = int(getattr(self._tok, "vocab_size", 0) or len(self._tok))
        rng = np.random.default_rng(seed)
        ids = rng.integers(0, vocab, size=1 << 16)
        if special:
            ids = ids[~np.isin(ids, list(special))]
        self._base = ids.tolist()
        self._cache: dict[tuple[int, int], str] = {}
        self._words = self._one_token_words(vocab, rng)
        self._cut: Any = None  # FittedPrompts when the vocabulary has no plain one-token words
        if not self._words:
            from tuner.measure.promptfit import FittedPrompts

            self._cut = FittedPrompts(self.count, "tokenizer", seed=seed, fit_missing=True)

    def _one_token_words(self, vocab: int, rng: np.random.Generator) -> list[str]:
        """Lower-case ASCII words that are one token after a space (a sample of the vocabulary; may be none)."""
        words: set[str] = set()
        for i in rng.permutation(vocab)[:20000].tolist():
            w = str(self._tok.decode([i])).strip()
            if 2 <= len(w) <= 12 and w.isascii() and w.isalpha() and w.islower() and w not in words:
                if self.count(" " + w) == 1:  # one token wherever it stands after a space
                    words.add(w)
            if len(words) >= 4096:
                break
        out = sorted(words)
        rng.shuffle(out)
        return out

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False))

    def _ids(self, n_tokens: int, key: int) -> list[int]:
        off = (key * 7919) % len(self._base)
        ids = (self._base[off:] + self._base) * (1 + n_tokens // len(self._base))
        return ids[:n_tokens]

    def synth_ids(self, n_tokens: int, key: int) -> list[int]:
        return self._ids(n_tokens, key)

    def synth_text(self, n_tokens: int, key: int) -> str:
        if self._cut is not None:
            return str(self._cut.synth_text(n_tokens, key))
        off = (key * 7919) % len(self._words)
        hit = self._cache.get((n_tokens, off))
        if hit is not None:
            return hit
        text = ""
        for shift in range(8):  # the first word may be several tokens without its space: start elsewhere
            text = self._words_text(n_tokens, (off + shift) % len(self._words))
            if self.count(text) == n_tokens:
                break
        if len(self._cache) < 65536:
            self._cache[(n_tokens, off)] = text
        return text

    def _words_text(self, n_tokens: int, off: int) -> str:
        words = (self._words[off:] + self._words[:off]) * (1 + n_tokens // len(self._words))
        k = n_tokens
        text = ""
        for _ in range(self.max_tries):
            text = " ".join(words[:max(1, k)])
            c = self.count(text)
            if c == n_tokens:
                break
            k += n_tokens - c
        return text

    def synth(self, n_tokens: int, key: int) -> str:
        return self.synth_text(n_tokens, key)


def load_tokenizer(spec: str | None, *, base_dir: Path | None = None, seed: int = 0) -> Tokenizer:
    """`None` or "approx": approximate; "byte": byte-level; otherwise a local Hugging Face tokenizer dir."""
    if spec is None or spec == "approx":
        return ApproxTokenizer(seed)
    if spec == "byte":
        return ByteTokenizer(seed)
    p = Path(spec)
    if not p.is_absolute() and base_dir is not None and (base_dir / p).exists():
        p = base_dir / p
    if not p.exists():
        raise ConfigError(f"tokenizer {spec!r}: not 'byte', 'approx' or an existing local directory")
    return HFTokenizer(str(p), seed)
