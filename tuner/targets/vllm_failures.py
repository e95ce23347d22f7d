"""Failures of a vLLM trial, classified from vLLM's own output.

The generic classifier (tuner/targets/process.py) sees the last lines of the server's log. vLLM's root cause
often lies further up: the EngineCore process prints its traceback, then the API server prints its own
("Engine core initialization failed. See root cause above"). So this reads the whole log of the failed start
(from the command line the tuner wrote at its top), finds vLLM's own line for the cause, and gives the trial
a precise cause and a message that leads with that line:

- kv_cache_too_small: the KV cache cannot hold one sequence of max_model_len (on a CPU: VLLM_CPU_KVCACHE_SPACE
  too small; on a GPU: too little memory left for it);
- invalid_config: vLLM refused a value or a combination (argparse, or a config validator's "Value error");
- out_of_memory, startup_timeout, crashed_*: as the generic classifier says.
"""

from __future__ import annotations

import re
from pathlib import Path

from tuner.errors import DeployError, OutOfMemoryError, TrialError

CAUSE_KV_TOO_SMALL = "kv_cache_too_small"
LOG_WINDOW_BYTES = 512 * 1024

# (cause, patterns whose first matching line names the cause); the first cause with a match wins
_KV_TOO_SMALL = (
    r"larger than the available KV cache memory",
    r"No available memory for the cache blocks",
    r"KV cache is needed, which is larger than",
    r"is larger than the maximum number of tokens that can be stored in KV cache",
    r"insufficient KV cache",
)
_INVALID = (
    r"Value error, .*",
    r"error: unrecognized arguments.*",
    r"error: argument .*",
    r"\bValueError: .*",
    r"\bValidationError\b.*",
    r"\bNotImplementedError: .*",
)


def run_log(path: Path | None, max_bytes: int = LOG_WINDOW_BYTES) -> str:
    """The text of the last server run in a trial's log (from the last `$ argv` line the tuner wrote)."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    start = text.rfind("\n$ ")
    return text[start + 1:] if start >= 0 else text


def _first_line(patterns: tuple[str, ...], text: str) -> str | None:
    for p in patterns:
        m = re.search(p, text, flags=re.MULTILINE)
        if m:
            line_start = text.rfind("\n", 0, m.start()) + 1
            line_end = text.find("\n", m.end())
            line = text[line_start:line_end if line_end >= 0 else None]
            return _strip_log_prefix(line).strip()[:600]
    return None


def _strip_log_prefix(line: str) -> str:
    """Drop vLLM's `(EngineCore pid=1) ERROR 11-30 22:50:01 [core.py:123] ` style prefix."""
    return re.sub(r"^(\(\w+(?: pid=\d+)?\)\s*)?((INFO|WARNING|ERROR|DEBUG|CRITICAL)\s+\S+\s+\S+\s+\[[^\]]*\]\s*)?",
                  "", line)


def classify(exc: TrialError, log_path: Path | None) -> TrialError:
    """A more precise TrialError for a failed vLLM start or run, from the trial's whole log; else `exc`."""
    if exc.cause not in ("invalid_config", "crashed_at_startup", "out_of_memory", "crashed_during_run",
                         "startup_timeout", "deploy_failed"):
        return exc
    text = run_log(log_path) or exc.log_tail
    line = _first_line(_KV_TOO_SMALL, text)
    if line:
        return OutOfMemoryError(f"vLLM's KV cache cannot hold one sequence: {line}\n{exc}",
                                cause=CAUSE_KV_TOO_SMALL, log_tail=exc.log_tail)
    if exc.cause in ("out_of_memory", "startup_timeout", "crashed_during_run"):
        return exc
    line = _first_line(_INVALID, text)
    if line:
        return DeployError(f"vLLM refused the configuration: {line}\n{exc}", cause="invalid_config",
                           log_tail=exc.log_tail)
    return exc


__all__ = ["CAUSE_KV_TOO_SMALL", "classify", "run_log"]
