"""Prompt texts of an exact token count as the server counts them: `tuner bench`'s default.

A synthesised prompt is a head that differs per request (six digits and a space, fewer for prompts under 24
tokens, so no two requests share a prefix-cache block) and a body of plain words common to all requests, cut
at a character. The count then depends on the cut only: one search per asked length finds the cut, counted by
- the server's own tokenizer endpoint (vLLM's `POST /tokenize`): method `server_tokenize`;
- the `usage.prompt_tokens` the server reports for a one-token answer (any OpenAI-compatible server that
  reports usage): method `usage_calibration`, a few probe requests per length before the measured ones;
- a local tokenizer whose vocabulary has no plain one-token words (the byte-level one `tuner make-model`
  writes): searched on demand, exact.
Lengths beyond the fitted ones (more than `max_lengths` distinct) take a cut interpolated between the two
nearest fitted lengths. `residual(records)` says how far the server's counts were from the asked lengths.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from tuner.base.redact import redact_text
from tuner.errors import ConfigError
from tuner.measure.records import RequestRecord
from tuner.measure.words import COMMON_WORDS

log = logging.getLogger(__name__)

Count = Callable[[str], int]  # the token count of a prompt text (raises CountError when it cannot say)
_PROBE_KEY = 987_654_321  # the probes' head, apart from the run's keys


class CountError(RuntimeError):
    """The counter could not count (no such endpoint, no usage in the answer, a failed request)."""


def head(key: int, n_tokens: int) -> str:
    """Digits (and a space) that differ between requests: six, fewer for short prompts; a fixed width for
    a given length, so a fixed token count."""
    digits = 6 if n_tokens >= 24 else n_tokens // 4
    if digits == 0:
        return ""
    return f"{(key * 2654435761) % 10**digits:0{digits}d} "


class FittedPrompts:
    """Synthesised prompts whose length was searched with `count` (a Tokenizer for the load generator)."""

    def __init__(self, count: Count, method: str, *, seed: int = 0, fit_missing: bool = False,
                 max_probes: int = 10) -> None:
        self.name = method
        self.method = method
        self._count = count
        self._fit_missing = fit_missing  # search each new length on demand (a cheap local counter)
        self._max_probes = max_probes
        rng = np.random.default_rng(seed)
        self._words = [str(w) for w in rng.choice(COMMON_WORDS, size=1 << 12)]
        self._body = " ".join(self._words)
        self._cuts: dict[int, int] = {}  # asked length -> cut (characters of the body)
        self._got: dict[int, int] = {}  # asked length -> the count at that cut
        self._chars_per_token = 4.0
        self.probes = 0

    @property
    def exact(self) -> bool:
        """Every fitted length was hit exactly (and lengths not fitted are searched on demand)."""
        return self._fit_missing and all(self._got[n] == n for n in self._got)

    # ------------------------------------------------------------------ the text
    def _body_upto(self, cut: int) -> str:
        while cut > len(self._body):
            self._body = self._body + " " + self._body
        return self._body[:cut]

    def text(self, cut: int, key: int, n_tokens: int) -> str:
        return head(key, n_tokens) + self._body_upto(cut)

    def synth_text(self, n_tokens: int, key: int) -> str:
        return self.text(self.cut(n_tokens), key, n_tokens)

    def synth(self, n_tokens: int, key: int) -> str:
        return self.synth_text(n_tokens, key)

    def synth_ids(self, n_tokens: int, key: int) -> list[int]:
        raise ConfigError("prompts as token ids need a tokenizer (--tokenizer DIR, or tokenizer: in the target)")

    def count(self, text: str) -> int:
        """An estimate from the fitted characters per token (dataset prompts are counted by the server)."""
        return max(1, round(len(text) / self._chars_per_token))

    # ------------------------------------------------------------------ the search
    def fit(self, lengths: Iterable[int], *, max_lengths: int = 12) -> None:
        """Search the cut of each asked length (of `max_lengths` spread over them when there are more)."""
        asked = sorted({int(n) for n in lengths if n >= 1})
        if len(asked) > max_lengths:
            idx = np.unique(np.round(np.linspace(0, len(asked) - 1, max_lengths)).astype(int))
            asked = [asked[i] for i in idx]
        for n in asked:
            self._fit_one(n)

    def _fit_one(self, n: int) -> None:
        lo: tuple[int, int] | None = None  # (cut, count) with count < n, the largest such cut
        hi: tuple[int, int] | None = None  # count > n, the smallest such cut
        best: tuple[int, int, int] | None = None  # (|error|, cut, count)
        head_chars = len(head(_PROBE_KEY, n))
        cut = max(0, round(n * self._chars_per_token) - head_chars)
        for _ in range(self._max_probes):
            k = self._count(self.text(cut, _PROBE_KEY, n))
            self.probes += 1
            if best is None or abs(k - n) < best[0] or (abs(k - n) == best[0] and k < n):
                best = (abs(k - n), cut, k)
            if k == n:
                break
            if k < n and (lo is None or cut > lo[0]):
                lo = (cut, k)
            if k > n and (hi is None or cut < hi[0]):
                hi = (cut, k)
            if hi is not None and hi[0] == 0:
                break  # the head alone is longer than asked
            if lo is not None and hi is not None:
                if hi[0] - lo[0] <= 1:
                    break  # no cut between: the nearest is best
                step = (n - lo[1]) * (hi[0] - lo[0]) / max(1, hi[1] - lo[1])
                nxt = min(max(lo[0] + round(step), lo[0] + 1), hi[0] - 1)
            else:
                rate = (head_chars + cut) / max(1, k)
                nxt = max(0, cut + round((n - k) * rate))
                if nxt == cut:
                    nxt = cut + (1 if k < n else -1)
                nxt = max(0, nxt)
            cut = nxt
        assert best is not None
        self._cuts[n], self._got[n] = best[1], best[2]
        if best[2] > 0:
            self._chars_per_token = (head_chars + best[1]) / best[2]

    def cut(self, n: int) -> int:
        """The cut for `n` tokens: fitted, searched now (fit_missing), or interpolated between fitted ones."""
        if n in self._cuts:
            return self._cuts[n]
        if self._fit_missing or not self._cuts:
            self._fit_one(n)
            return self._cuts[n]
        known = sorted(self._cuts)
        below = [m for m in known if m < n]
        above = [m for m in known if m > n]
        if below and above:
            a, b = below[-1], above[0]
            return round(self._cuts[a] + (n - a) * (self._cuts[b] - self._cuts[a]) / (b - a))
        m = below[-1] if below else above[0]
        return max(0, round(self._cuts[m] + (n - m) * self._chars_per_token))

    def report(self) -> dict[str, Any]:
        errors = [self._got[n] - n for n in sorted(self._got)]
        return {"method": self.method, "probes": self.probes, "lengths_fitted": len(self._got),
                "fit_max_error_tokens": max((abs(e) for e in errors), default=0)}


# ---------------------------------------------------------------------------- counters on the server
def _post_json(url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> Any:
    req = urllib.request.Request(url, data=body, headers=dict(headers), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:200].decode(errors="replace")
        raise CountError(f"{exc.code} from {url}: {redact_text(detail)}") from None
    except (OSError, ValueError) as exc:
        raise CountError(f"{url}: {redact_text(str(exc))}") from None


def tokenize_counter(base_url: str, model: str, *, chat: bool, headers: Mapping[str, str],
                     timeout_s: float) -> Count:
    """Counts with the server's `POST /tokenize` (vLLM): `{"count": n, "tokens": [...]}`; for chat the
    messages are templated the way the chat endpoint does it."""
    url = base_url.rstrip("/") + "/tokenize"

    def count(text: str) -> int:
        body: dict[str, Any] = {"model": model}
        if chat:
            body.update(messages=[{"role": "user", "content": text}], add_generation_prompt=True)
        else:
            body["prompt"] = text
        d = _post_json(url, json.dumps(body).encode(), headers, timeout_s)
        if isinstance(d, dict) and isinstance(d.get("count"), int):
            return int(d["count"])
        if isinstance(d, dict) and isinstance(d.get("tokens"), list):
            return len(d["tokens"])
        raise CountError(f"{url} answered without a count: {str(d)[:120]}")

    return count


def usage_counter(url: str, body_for: Callable[[str], bytes], *, headers: Mapping[str, str],
                  timeout_s: float) -> Count:
    """Counts with the `usage.prompt_tokens` of a one-token, unstreamed answer (`body_for(text)` builds it)."""

    def count(text: str) -> int:
        d = _post_json(url, body_for(text), headers, timeout_s)
        u = d.get("usage") if isinstance(d, dict) else None
        v = u.get("prompt_tokens") if isinstance(u, dict) else None
        if not isinstance(v, int) or v < 1:
            raise CountError(f"{url} reported no usage.prompt_tokens")
        return v

    return count


def fitted_for_server(lengths: Sequence[int], counters: Sequence[tuple[str, Callable[[], Count], int]],
                      *, seed: int) -> tuple[FittedPrompts | None, list[str]]:
    """The first counting method that works, fitted to `lengths` (each counter with the most distinct
    lengths it may fit); (None, why each failed) when none does."""
    why: list[str] = []
    for method, make, max_lengths in counters:
        fp = FittedPrompts(make(), method, seed=seed)
        try:
            fp.fit(lengths, max_lengths=max_lengths)
        except CountError as exc:
            why.append(f"{method}: {exc}")
            continue
        return fp, why
    return None, why


# ---------------------------------------------------------------------------- what the server counted
def residual(records: Iterable[RequestRecord]) -> dict[str, Any]:
    """How far the server's prompt counts were from the asked lengths (measured, successful requests)."""
    pairs = [(r.requested_prompt_tokens, r.server_prompt_tokens) for r in records
             if r.ok and not r.warmup and r.requested_prompt_tokens and r.server_prompt_tokens is not None]
    if not pairs:
        return {"counted_by_server": 0}
    rel = np.array([(got - asked) / asked for asked, got in pairs], dtype=float)
    return {
        "counted_by_server": len(pairs),
        "asked_median": float(np.median([a for a, _ in pairs])),
        "server_median": float(np.median([g for _, g in pairs])),
        "error_frac_median": float(np.median(rel)),
        "abs_error_frac_max": float(np.abs(rel).max()),
        "within_2pct_frac": float(np.mean(np.abs(rel) <= 0.02)),
    }
