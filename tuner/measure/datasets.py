"""Request mixes from local files: ShareGPT-style datasets and JSONL traces.

Datasets (`workload.dataset`):
- ShareGPT JSON: a list of `{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}]}`
  (the first human turn is the prompt, the next assistant turn sets the output length).
- JSONL: one object per line with `prompt` (text or token ids) and `output_tokens` (or `max_tokens`, or a
  `completion`/`output` text whose token count is used).

Traces (`workload.arrival.kind: trace`), JSONL, one request per line:
`{"timestamp": <s>, "prompt_tokens": N | "prompt": text|ids, "output_tokens": M}` (`timestamp_ms` also
accepted). Timestamps are shifted so the first request arrives at 0.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from tuner.base.files import read_text_bounded
from tuner.errors import ConfigError
from tuner.measure.records import RequestPlan
from tuner.measure.tokenize import Tokenizer
from tuner.measure.workload import build_plans
from tuner.spec import WorkloadSpec


@dataclass(frozen=True)
class Sample:
    prompt: str | list[int]
    prompt_tokens: int
    output_tokens: int
    exact: bool


def resolve(path: str, base_dir: Path | None) -> Path:
    p = Path(path)
    if not p.is_absolute() and base_dir is not None:
        p = base_dir / p
    if not p.exists():
        raise ConfigError(f"file not found: {p}")
    return p  # a directory, a FIFO or a device is refused where it is read (read_text_bounded)


MAX_TRACE_BYTES = 256 * 2**20  # a dataset or trace file (a regular file: read_text_bounded)


def _read_records(p: Path) -> list[tuple[int, Any]]:
    text = read_text_bounded(p, MAX_TRACE_BYTES)
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"invalid JSON: {exc}", file=str(p), line=exc.lineno) from None
        return [(0, d) for d in data]
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append((i, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"invalid JSON line: {exc.msg}", file=str(p), line=i) from None
    return out


def _prompt_len(prompt: Any, tok: Tokenizer) -> tuple[int, bool]:
    if isinstance(prompt, list):
        return len(prompt), True
    return tok.count(str(prompt)), tok.exact


def _output_len(d: dict[str, Any], tok: Tokenizer) -> int | None:
    for k in ("output_tokens", "max_tokens", "output_len"):
        if isinstance(d.get(k), int):
            return int(d[k])
    for k in ("completion", "output", "response"):
        if isinstance(d.get(k), str):
            return max(1, tok.count(d[k]))
    return None


def load_dataset(path: Path, tok: Tokenizer, *, max_output_tokens: int | None = None) -> list[Sample]:
    """Prompt samples from a ShareGPT JSON or a JSONL file (entries without a prompt are skipped)."""
    samples: list[Sample] = []
    for line, d in _read_records(path):
        if not isinstance(d, dict):
            raise ConfigError("each entry must be a JSON object", file=str(path), line=line or None)
        conv = d.get("conversations") or d.get("conversation")
        if isinstance(conv, list):
            turns = [t for t in conv if isinstance(t, dict)]
            if len(turns) < 2:
                continue
            prompt: Any = turns[0].get("value", turns[0].get("content"))
            answer = turns[1].get("value", turns[1].get("content"))
            if not isinstance(prompt, str) or not prompt:
                continue
            out_len: int | None = max(1, tok.count(answer)) if isinstance(answer, str) else None
        else:
            prompt = d.get("prompt", d.get("text"))
            if prompt is None or prompt == "" or prompt == []:
                continue
            out_len = _output_len(d, tok)
        if out_len is None:
            out_len = 128
        if max_output_tokens is not None:
            out_len = min(out_len, max_output_tokens)
        n_in, exact = _prompt_len(prompt, tok)
        samples.append(Sample(prompt=prompt, prompt_tokens=n_in, output_tokens=out_len, exact=exact))
    if not samples:
        raise ConfigError("the dataset has no usable prompts", file=str(path))
    return samples


def load_trace(path: Path, tok: Tokenizer) -> list[tuple[float, Sample | None, int, int]]:
    """Trace entries: (arrival_s from the first, sample with a prompt or None, prompt_tokens, output_tokens)."""
    rows: list[tuple[float, Sample | None, int, int]] = []
    for line, d in _read_records(path):
        if not isinstance(d, dict):
            raise ConfigError("each trace line must be a JSON object", file=str(path), line=line or None)
        if "timestamp" in d:
            t = float(d["timestamp"])
        elif "timestamp_s" in d:
            t = float(d["timestamp_s"])
        elif "timestamp_ms" in d:
            t = float(d["timestamp_ms"]) / 1000.0
        else:
            raise ConfigError("trace line needs timestamp (s) or timestamp_ms", file=str(path), line=line)
        out_len = _output_len(d, tok)
        if out_len is None:
            raise ConfigError("trace line needs output_tokens", file=str(path), line=line)
        prompt = d.get("prompt")
        if prompt is not None:
            n_in, exact = _prompt_len(prompt, tok)
            rows.append((t, Sample(prompt, n_in, out_len, exact), n_in, out_len))
        elif isinstance(d.get("prompt_tokens"), int) and d["prompt_tokens"] >= 1:
            rows.append((t, None, int(d["prompt_tokens"]), out_len))
        else:
            raise ConfigError("trace line needs prompt or prompt_tokens >= 1", file=str(path), line=line)
    if not rows:
        raise ConfigError("the trace is empty", file=str(path))
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    return [(t - t0, s, a, b) for t, s, a, b in rows]


def plans_for(spec: WorkloadSpec, *, seed: int, tok: Tokenizer,
              base_dir: Path | None = None) -> tuple[list[RequestPlan], list[str]]:
    """The plans of one run with prompts from the dataset or trace when the spec names one.

    Returns the plans and notes (e.g. about approximate token counts).
    """
    notes: list[str] = []
    if spec.arrival.kind == "trace":
        assert spec.arrival.trace is not None
        rows = load_trace(resolve(spec.arrival.trace, base_dir), tok)
        if spec.num_requests is not None:
            rows = rows[: spec.warmup_requests + spec.num_requests]
        if spec.duration_s is not None:
            rows = [r for r in rows if r[0] <= spec.warmup_s + spec.duration_s]
        plans = [
            RequestPlan(index=i, arrival_s=t, prompt_tokens=n_in, output_tokens=n_out,
                        prompt=s.prompt if s is not None else None, warmup=i < spec.warmup_requests)
            for i, (t, s, n_in, n_out) in enumerate(rows)
        ]
        if any(s is not None and not s.exact for _, s, _, _ in rows):
            notes.append(f"trace prompt lengths are approximate (tokenizer {tok.name})")
        return plans, notes
    plans = build_plans(spec, seed=seed)
    if spec.dataset:
        samples = load_dataset(resolve(spec.dataset, base_dir), tok, max_output_tokens=spec.output_tokens.max)
        rng = np.random.default_rng(seed + 1)
        pick = rng.permutation(len(plans)) % len(samples)
        plans = [replace(p, prompt=samples[j].prompt, prompt_tokens=samples[j].prompt_tokens,
                         output_tokens=samples[j].output_tokens) for p, j in zip(plans, pick, strict=True)]
        if not all(s.exact for s in samples):
            notes.append(f"dataset prompt lengths are approximate (tokenizer {tok.name})")
    return plans, notes
