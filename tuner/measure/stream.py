"""Reading one OpenAI-style SSE stream (completions or chat) the way servers really send it.

- A stream ends on `data: [DONE]`, or on the end of the body after a chunk that carried a `finish_reason`
  or `usage` (some servers never send `[DONE]`); anything else that ends is a broken stream.
- Every chunk with a choice is a token chunk, its text empty or not (vLLM streams one chunk per token and a
  token whose bytes do not yet decode to text comes with empty text), as `vllm bench serve` counts them:
  the first one stops the TTFT clock. A chat chunk that carries just the role is not; a last chunk with
  empty text and a finish_reason is one only when `usage` counts a token more than the chunks before it.
- A chunk may carry several tokens. Its token count comes from a `usage` delta when the server sends usage
  on every chunk, else from the tokenizer when one was given (`count_text`), else 1; the request's total
  comes from the final `usage.completion_tokens` when reported. `token_times` turns chunk arrivals into
  per-token arrival times: a k-token chunk's gap since the previous chunk is split into k equal gaps (the
  first chunk's tokens all arrive with it), and the record says how many chunks were split.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

STREAM_END_DONE = "done"  # data: [DONE]
STREAM_END_EOF = "eof_after_finish"  # end of body after a finish_reason or usage chunk (no [DONE])


@dataclass
class StreamReader:
    """Fed one SSE `data:` payload at a time; collects what the request's record needs."""

    chat: bool
    count_text: Callable[[str], int] | None = None  # tokens of a chunk's text (None: 1 per chunk)
    keep_text: bool = False  # keep the generated text (vLLM's generated_texts)
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int | None] = field(default_factory=list)  # None: unknown (1 unless usage says more)
    texts: list[str] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    done: bool = False
    finished: bool = False  # a chunk carried a finish_reason
    error: str | None = None
    detail: str = ""
    _usage_tokens: int | None = None  # completion_tokens of the last usage seen on a content chunk
    _finish_s: float | None = None  # arrival of an empty-text chunk with a finish_reason (a token or not)

    @property
    def full_parse(self) -> bool:
        return self.keep_text or self.count_text is not None

    def feed(self, payload: bytes, now: float) -> None:
        if payload == b"[DONE]":
            self.done = True
            return
        if not self.full_parse and self._fast(payload, now):
            return
        d = json.loads(payload)
        if not isinstance(d, dict):
            raise ValueError(f"a stream event is not a JSON object: {payload[:80]!r}")
        choices = d.get("choices")
        u = d.get("usage")
        text = None
        token_chunk = False
        if choices:
            c = choices[0]
            if self.chat:
                delta = c.get("delta") or {}
                text = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
                token_chunk = bool(text) or "role" not in delta  # a role-only chunk carries no token
            else:
                text = c.get("text")
                token_chunk = True
            if c.get("finish_reason") is not None:
                self.finished = True
                if not text and token_chunk:  # decided at the end, from usage
                    self._finish_s, token_chunk = now, False
        if token_chunk:
            n: int | None = None
            if u and u.get("completion_tokens") is not None:  # usage on every chunk: a delta
                total = int(u["completion_tokens"])
                n = max(1, total - (self._usage_tokens or 0))
                self._usage_tokens = total
            elif self.count_text is not None and text:
                n = max(1, self.count_text(text))
            self.chunk_times.append(now)
            self.chunk_tokens.append(n)
            if self.keep_text and text:
                self.texts.append(text)
        if u:
            self.usage = u
        if "error" in d and not choices:
            self.error = "stream_broken"
            self.detail = str(d["error"])[:300]

    def _fast(self, payload: bytes, now: float) -> bool:
        """A plain token chunk (no usage, error, role or finish_reason) without parsing the JSON."""
        key = b'"content":' if self.chat else b'"text":'
        if (payload.find(key) < 0 or b'"usage"' in payload or b'"error"' in payload or b"reasoning" in payload
                or (self.chat and b'"role"' in payload)):
            return False
        if b'"finish_reason"' in payload and not (b'"finish_reason":null' in payload
                                                 or b'"finish_reason": null' in payload):
            return False
        self.chunk_times.append(now)
        self.chunk_tokens.append(None)
        return True

    def end(self) -> str:
        """At the end of the body: how the stream ended (sets error when it broke)."""
        if self._finish_s is not None and self.usage is not None and self.usage.get("completion_tokens") is not None:
            if int(self.usage["completion_tokens"]) > sum(n or 1 for n in self.chunk_tokens):
                self.chunk_times.append(self._finish_s)  # the last token's text was empty
                self.chunk_tokens.append(None)
            self._finish_s = None
        if self.done:
            return STREAM_END_DONE
        if self.error is None and (self.finished or self.usage is not None):
            return STREAM_END_EOF
        if self.error is None:
            self.error = "stream_broken"
            self.detail = "stream ended without [DONE] and without a chunk carrying finish_reason or usage"
        return ""

    def output_tokens(self) -> int:
        if self.usage is not None and self.usage.get("completion_tokens") is not None:
            return int(self.usage["completion_tokens"])
        return sum(n or 1 for n in self.chunk_tokens)

    def text(self) -> str:
        return "".join(self.texts)


def spread(counts: list[int | None], total: int) -> list[int]:
    """Tokens per chunk: known counts as given, unknown ones sharing what is left of `total` (>= 1 each).

    When the known counts disagree with `total`, all chunks are rescaled to sum to it (largest remainder)."""
    n = len(counts)
    if n == 0:
        return []
    known = sum(c for c in counts if c is not None)
    unknown = [i for i, c in enumerate(counts) if c is None]
    out = [c if c is not None else 1 for c in counts]
    if unknown and total - known >= len(unknown):
        share, extra = divmod(total - known, len(unknown))
        for k, i in enumerate(unknown):
            out[i] = share + (1 if k < extra else 0)
    if sum(out) != total and total >= n:
        raw = [c * total / sum(out) for c in out]
        base = [max(1, int(x)) for x in raw]
        order = sorted(range(n), key=lambda i: raw[i] - int(raw[i]), reverse=True)
        left = total - sum(base)
        for i in order:  # too few: the largest remainders get one more
            if left <= 0:
                break
            base[i] += 1
            left -= 1
        for i in reversed(order):  # too many (chunks raised to 1): the smallest remainders give one back
            if left >= 0:
                break
            if base[i] > 1:
                base[i] -= 1
                left += 1
        out = base
    return out


def token_times(chunk_times: list[float], tokens: list[int]) -> tuple[tuple[float, ...], int]:
    """Per-token arrival times from chunk arrivals and tokens per chunk; and how many chunks held several.

    The first chunk's tokens all arrive with it; a later k-token chunk's gap is split into k equal gaps."""
    out: list[float] = []
    multi = 0
    prev = None
    for t, k in zip(chunk_times, tokens, strict=True):
        if k > 1:
            multi += 1
        if prev is None or k <= 1:
            out.extend([t] * max(1, k))
        else:
            step = (t - prev) / k
            out.extend(prev + step * (j + 1) for j in range(k))
        prev = t
    return tuple(out), multi
