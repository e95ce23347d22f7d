"""The engine's GPU paths: CUDA graphs, async output, stream priority, torch.compile, bf16 and INT8.

Skipped without CUDA. Runs under pytest (`-m gpu`) or on its own on a GPU host that lacks pytest:
`python tests/integration/engine/test_engine_gpu.py`.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

try:
    import pytest

    pytestmark = [pytest.mark.gpu,
                  pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
except ImportError:  # run as a script on a host without pytest
    pytest = None  # type: ignore[assignment]

from tests.support.engine_run import generate as run  # noqa: E402
from tuner.engine.config import EngineConfig  # noqa: E402

PROMPTS = [list(range(7 + 3 * i, 7 + 3 * i + n)) for i, n in enumerate([5, 33, 17, 90, 9, 48, 2, 64, 21, 3])]
MAX_TOKENS = [12, 5, 20, 8, 16, 3, 11, 9, 30, 7]
BASE = {"device": "cuda", "prefill_chunk_tokens": 16, "batching": "continuous", "kv_pool_mb": 64}


def generate(**knobs: Any) -> list[list[int]]:
    return run(EngineConfig(**{**BASE, **knobs}), PROMPTS, MAX_TOKENS)


_reference: list[list[int]] = []


def reference() -> list[list[int]]:
    if not _reference:
        _reference.extend(generate(max_batch_size=1))
    return _reference


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    same = sum(x == y for p, q in zip(a, b, strict=True) for x, y in zip(p, q, strict=True))
    return same / sum(len(p) for p in a)


def test_cuda_graphs_and_async_output_keep_greedy_output() -> None:
    ref = reference()
    for knobs in ({"max_batch_size": 8},
                  {"max_batch_size": 8, "pre_allocate": True, "cuda_graphs": True, "warmup": True},
                  {"max_batch_size": 6, "pre_allocate": True, "cuda_graphs": True, "async_output": True,
                   "stream_priority": "high", "cuda_graph_max_batch": 4},
                  {"max_batch_size": 8, "async_output": True},
                  {"max_batch_size": 8, "batching": "static", "pre_allocate": True, "cuda_graphs": True}):
        out = generate(**knobs)
        assert [len(o) for o in out] == MAX_TOKENS, knobs
        assert out == ref, (knobs, agreement(out, ref))


def test_compile_keeps_greedy_output() -> None:
    out = generate(max_batch_size=8, compile=True, pre_allocate=True, cuda_graphs=True, warmup=True,
                   cuda_graph_max_batch=8)
    assert agreement(out, reference()) >= 0.95


def test_matmul_attention_keeps_greedy_output() -> None:
    out = generate(max_batch_size=8, pre_allocate=True, cuda_graphs=True, attention="matmul")
    assert agreement(out, reference()) >= 0.95


def test_bf16_and_int8_mostly_agree_with_float32() -> None:
    for knobs in ({"dtype": "bfloat16"}, {"dtype": "bfloat16", "quantization": "int8"},
                  {"dtype": "bfloat16", "pre_allocate": True, "cuda_graphs": True}):
        out = generate(max_batch_size=8, **knobs)
        assert [len(o) for o in out] == MAX_TOKENS
        assert agreement(out, reference()) > 0.3, knobs  # random weights: diverges after a first flip


def test_server_on_gpu_with_every_knob(tmp_path: Path | None = None) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "tuner.engine.server", "--port", str(port), "--device", "cuda",
                             "--preset", "tiny", "--batching", "continuous", "--pre-allocate", "--cuda-graphs",
                             "--async-output", "--stream-priority", "high", "--warmup", "--dtype", "bfloat16",
                             "--max-batch-size", "16"], cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 300
        while True:
            assert proc.poll() is None and time.monotonic() < end
            try:
                with urllib.request.urlopen(base + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        body = json.dumps({"prompt": "Hello GPU", "max_tokens": 20, "temperature": 0, "ignore_eos": True,
                           "stream": True, "stream_options": {"include_usage": True}}).encode()
        with urllib.request.urlopen(urllib.request.Request(base + "/v1/completions", data=body), timeout=60) as r:
            events = [e for e in r.read().decode().split("\n\n") if e]
        assert events[-1] == "data: [DONE]" and len(events) == 22
        with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
            metrics = r.read().decode()
        capture = [line for line in metrics.splitlines() if 'phase="capture"' in line][0]
        assert float(capture.split()[-1]) > 0
    finally:
        proc.terminate()
        proc.wait(30)


# ---- last: a fault in the flash kernel must not take the checks above with it (one process)
def test_flash_kernel_keeps_the_varlen_contract() -> None:
    """torch's flash kernel, called on the pool as the engine calls it, against the contract's reference."""
    from tests.support.gpu_doubles import ReferenceVarlen
    from tuner.engine.model import FlashSeqs, flash_decode_attention
    from tuner.engine.varlen import VarlenAttention

    gen = torch.Generator(device="cuda").manual_seed(0)
    assert VarlenAttention().unavailable("cuda", "bfloat16") is None
    slots, hkv, positions, hd, attn_len = 6, 8, 300, 64, 256
    k, v = (torch.randn(slots, hkv, positions, hd, device="cuda", generator=gen).bfloat16() for _ in range(2))
    pos = torch.tensor([0, 5, 100, 255, positions - 1], device="cuda")  # the last: a padded row (scratch)
    seqs = FlashSeqs.of(pos, hkv, positions, attn_len)
    for g in (4, 1):  # grouped-query heads (the kernel's swapped-groups path) and plain multi-head
        q = torch.randn(pos.shape[0], hkv, g, hd, device="cuda", generator=gen).bfloat16()
        out = flash_decode_attention(VarlenAttention(), q, k, v, seqs)
        ref = flash_decode_attention(ReferenceVarlen(), q, k, v, seqs)
        torch.testing.assert_close(out[:4].float(), ref[:4].float(), rtol=2e-2, atol=2e-2, msg=f"group {g}")


def test_flash_attention_serves_under_graphs_like_sdpa() -> None:
    knobs = {"max_batch_size": 8, "dtype": "bfloat16", "pre_allocate": True, "cuda_graphs": True, "warmup": True}
    sdpa = generate(**knobs)
    flash = generate(**knobs, attention="flash")
    assert [len(o) for o in flash] == MAX_TOKENS
    assert agreement(flash, sdpa) >= 0.9


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to check")
        sys.exit(0)
    import os

    skip = [w for w in os.environ.get("TUNER_GPU_TESTS_SKIP", "").split(",") if w]  # e.g. "compile"
    failed = 0
    for name, fn in list(globals().items()):
        if any(w in name for w in skip):
            print(f"SKIP {name}", flush=True)
            continue
        if name.startswith("test_") and callable(fn):
            t0 = time.perf_counter()
            try:
                fn()
                print(f"PASS {name} ({time.perf_counter() - t0:.1f} s)", flush=True)
            except Exception as exc:  # noqa: BLE001 - report every check
                failed += 1
                print(f"FAIL {name}: {type(exc).__name__}: {exc}", flush=True)
                import traceback

                traceback.print_exc()
    sys.exit(1 if failed else 0)
