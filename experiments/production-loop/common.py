"""Shared by the production-loop scripts: the two static configurations, the traffic phases, a reference-engine
server on 127.0.0.1 and `tuner bench` against it."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

PRESET = "small"  # 110 M parameters: a decode step reads ~440 MB of float32 weights, so batching pays on a CPU
THREADS = 1
MAX_MODEL_LEN = 2048  # the preset's (the torch_engine target runs it so): one KV slot is ~50 MB, 5 in 256 MB
# the engine's own defaults (static batching, batches of 8, a 50 ms timeout, a 256 MB pool grown on demand)
DEFAULTS: dict[str, Any] = {"batching": "static", "max_batch_size": 8, "batch_timeout_ms": 50.0, "kv_pool_mb": 256,
                            "pre_allocate": False, "quantization": "none"}
# the seed's Flash-style serving configuration, as far as the engine expresses it on a CPU
FLASH: dict[str, Any] = {"batching": "static", "max_batch_size": 32, "batch_timeout_ms": 100.0, "kv_pool_mb": 4096,
                         "pre_allocate": True, "quantization": "none"}
# the daemon's search space: the engine's scheduling and memory knobs (a KV slot is ~50 MB: a batch larger than
# the pool holds waits for slots); DEFAULTS and FLASH are two of its points
SPACE: dict[str, dict[str, Any]] = {
    "batching": {"type": "categorical", "choices": ["static", "continuous"], "default": "static"},
    "max_batch_size": {"type": "int", "low": 4, "high": 64, "log": True, "default": 8},
    "batch_timeout_ms": {"type": "float", "low": 0.0, "high": 100.0, "default": 50.0,
                         "when": "batching == 'static'"},
    "kv_pool_mb": {"type": "int", "low": 256, "high": 4096, "log": True, "default": 256},
    "pre_allocate": {"type": "bool", "default": False},
}
PHASES: dict[str, dict[str, int]] = {  # many short concurrent requests; a single long task (one client's chain of
    # short sequential calls, an agent's loop: each call waits for the one before)
    "concurrent": {"concurrency": 32, "prompt_tokens": 32, "output_tokens": 16},
    "single": {"concurrency": 1, "prompt_tokens": 32, "output_tokens": 8},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_argv(config: dict[str, Any], port: int) -> list[str]:
    argv = [sys.executable, "-m", "tuner.engine.server", "--port", str(port), "--preset", PRESET,
            "--cpu-threads", str(THREADS)]
    for k, v in config.items():
        flag = "--" + k.replace("_", "-")
        if isinstance(v, bool):
            argv.append(flag if v else "--no-" + k.replace("_", "-"))
        else:
            argv += [flag, str(v)]
    return argv


def wait_ready(base: str, proc: subprocess.Popen[bytes] | None = None, timeout_s: float = 180) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError("server not ready")


def bench_argv(base: str, phase: str, *, requests: int | None = None, duration_s: float | None = None,
               out: Path | None = None, seed: int = 0) -> list[str]:
    p = PHASES[phase]
    argv = [sys.executable, "-m", "tuner.cli", "bench", "--url", base, "--concurrency", str(p["concurrency"]),
            "--prompt-tokens", str(p["prompt_tokens"]), "--output-tokens", str(p["output_tokens"]),
            "--timeout-s", "300", "--seed", str(seed),
            # the engine's tokenizer is byte-level: prompts of exact lengths without the one-token probe requests
            # a fitted prompt starts with (between two learning runs they looked like a few seconds of a single
            # client's traffic)
            "--tokenizer", "byte"]
    argv += ["--requests", str(requests)] if requests else ["--duration-s", str(duration_s)]
    if out is not None:
        argv += ["--json", str(out)]
    return argv


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())
