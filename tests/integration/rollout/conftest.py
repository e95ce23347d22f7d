"""Shared parts of the rollout tests: the reference engine (tiny preset) as stable and canary replicas, a real
HAProxy in front of them, and live traffic through it."""

from __future__ import annotations

import contextlib
import json
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.agents import write_spec
from tests.support.haproxy import Balancer, running_haproxy
from tuner.targets.base import Deployment, TrialContext
from tuner.targets.torch_engine import TorchEngineOptions, TorchEngineTarget

MODEL = "torch-engine-tiny"
CONFIG = {"batching": "continuous", "max_batch_size": 8}


def engine_target(agent_dir: Path, step_delay_ms: float = 0.0) -> TorchEngineTarget:
    return TorchEngineTarget(TorchEngineOptions(preset="tiny", device="cpu", cpu_threads=1, startup_timeout_s=120,
                                                step_delay_ms=step_delay_ms), agent_dir=agent_dir)


def rollout_agent(path: Path, socket: Path, **rollout: Any) -> Path:
    """A torch_engine agent whose rollout section points at the test's HAProxy (short stages)."""
    spec = {
        "name": "canary",
        "target": {"kind": "torch_engine", "preset": "tiny", "device": "cpu", "cpu_threads": 1},
        "search_space": {"params": {
            "batching": {"type": "categorical", "choices": ["static", "continuous"], "default": "continuous"},
            "max_batch_size": {"type": "int", "low": 1, "high": 32, "default": 8}}},
        "workload": {"arrival": {"kind": "closed", "concurrency": 2}, "num_requests": 10,
                     "prompt_tokens": {"dist": "fixed", "value": 32}, "output_tokens": {"dist": "fixed", "value": 8}},
        "objectives": [{"metric": "ttft_ms.mean", "direction": "minimize"}],
        "slos": [{"metric": "ttft_ms.p99", "max": 10000}],
        "rollout": {"load_balancer": {"socket": str(socket), "backend": "llm"},
                    "stages": [20, 50, 100], "max_first_stage": 20, "window_s": 1.5, "min_windows": 3,
                    "min_requests": 6, "max_stage_s": 45, "max_regression": 0.1,
                    "metrics": ["ttft_ms.mean", "e2el_ms.mean"], **rollout},
    }
    return write_spec(path, spec)


@contextlib.contextmanager
def replica(target: TorchEngineTarget, state_dir: Path, label: str) -> Iterator[Deployment]:
    ctx = TrialContext(trial_number=-1, state_dir=state_dir, label=label)
    with target.deploy(CONFIG, ctx) as dep:
        yield dep


def addr(dep: Deployment) -> str:
    return (dep.endpoint or "").removeprefix("http://")


@contextlib.contextmanager
def traffic(url: str, *, concurrency: int = 3) -> Iterator[dict[str, int]]:
    """Requests through the balancer until the block ends; counts ok and failed answers."""
    stop = threading.Event()
    counts = {"ok": 0, "failed": 0}
    body = json.dumps({"model": MODEL, "prompt": "the quick brown fox " * 6, "max_tokens": 8,
                       "ignore_eos": True}).encode()

    def loop() -> None:
        while not stop.is_set():
            req = urllib.request.Request(url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    r.read()
                counts["ok"] += 1
            except OSError:
                counts["failed"] += 1
                stop.wait(0.2)

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    try:
        yield counts
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=90)


@pytest.fixture
def stack(tmp_path: Path) -> Callable[..., contextlib.AbstractContextManager[tuple[Balancer, Deployment]]]:
    """stack(step_delay_ms) -> a stable replica behind a real HAProxy."""

    @contextlib.contextmanager
    def make(step_delay_ms: float = 0.0) -> Iterator[tuple[Balancer, Deployment]]:
        with replica(engine_target(tmp_path, step_delay_ms), tmp_path / "stable-state", "stable0") as dep, \
                running_haproxy(tmp_path / "hx", {"stable0": addr(dep)}) as bal:
            yield bal, dep

    return make
