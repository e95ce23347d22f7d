"""Byte-level tokenizer: a token is one UTF-8 byte of the prompt (ids 0..255).

Output text shows each token as one character so a streamed token never yields an empty chunk:
ids 0..255 as the Latin-1 character of the byte (ASCII round-trips), other ids as `<|id|>`.
"""

from __future__ import annotations


class ByteTokenizer:
    def __init__(self, vocab_size: int, eos_token_id: int | None) -> None:
        if vocab_size < 256:
            raise ValueError(f"a byte tokenizer needs vocab_size >= 256 (got {vocab_size})")
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def token_text(self, token: int) -> str:
        return chr(token) if 0 <= token < 256 else f"<|{token}|>"

    def decode(self, tokens: list[int]) -> str:
        return "".join(self.token_text(t) for t in tokens)
