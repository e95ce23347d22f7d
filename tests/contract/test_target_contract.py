"""The Target contract: every target that runs here deploys and measures, tears down on an error, honours a
stop request, classifies a failure into a cause, and describes itself. Run over sim, command (the fake
OpenAI server), torch_engine (the tiny preset on the CPU) and a second command-like target defined in the
test suite (fake_server_target.py, written by following docs/ARCHITECTURE.md). vLLM joins where installed."""

from __future__ import annotations

import math
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from tests.contract.fake_server_target import FAKE, FakeServerOptions, FakeServerTarget
from tuner.base.proc import pid_alive
from tuner.errors import Interrupted, TrialError
from tuner.spec import WorkloadSpec
from tuner.targets.base import Target, TrialContext
from tuner.targets.registry import make_target, target_class

WORKLOAD = WorkloadSpec.model_validate({
    "arrival": {"kind": "closed", "concurrency": 2},
    "prompt_tokens": {"dist": "fixed", "value": 16},
    "output_tokens": {"dist": "fixed", "value": 4},
    "num_requests": 6,
})
# every cause a failed trial may be recorded with (tuner.errors and tuner.targets.process)
CAUSES = {"infeasible_config", "deploy_failed", "out_of_memory", "invalid_config", "port_in_use",
          "startup_timeout", "crashed_at_startup", "crashed_during_run", "server_errors", "workload_failed"}


@dataclass
class Case:
    make: Callable[[Path], Target]
    ok: dict[str, Any]  # params that deploy and measure
    bad: dict[str, Any]  # params that fail, with a classified cause


def _options(kind: str, **values: Any) -> Any:
    return target_class(kind).Options.model_validate(values)


CASES = {
    "sim": Case(lambda d: make_target("sim", _options("sim", hardware="a100-80gb-sxm", model="llama-3-70b",
                                                      num_gpus=8), d),
                ok={"tensor_parallel_size": 4}, bad={"tensor_parallel_size": 1}),  # 70B on one GPU: no room
    "command": Case(lambda d: make_target("command", _options(
        "command", model="fake", command=["{python}", str(FAKE), "--port", "{port}", "--itl-ms", "{itl_ms}"]), d),
                    ok={"itl_ms": 1}, bad={"itl_ms": "fast"}),  # the server's parser refuses it
    "torch_engine": Case(lambda d: make_target("torch_engine", _options(
        "torch_engine", device="cpu", preset="tiny", cpu_threads=1), d),
                         ok={}, bad={"max_num_seqs": 0}),
    "fake_server (a target of the test suite)": Case(
        lambda d: FakeServerTarget(FakeServerOptions(), agent_dir=d), ok={"ttft_ms": 5}, bad={"ttft_ms": "soon"}),
}


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Case, Target, TrialContext]:
    c = CASES[request.param]
    return c, c.make(tmp_path), TrialContext(trial_number=0, state_dir=tmp_path / "state", label="contract")


def _refused(endpoint: str | None) -> bool:
    if endpoint is None:
        return True
    u = urlparse(endpoint)
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex((u.hostname or "127.0.0.1", u.port or 80)) != 0


def _leftovers(ctx: TrialContext) -> list[Path]:
    return sorted((ctx.state_dir / "pids").glob("*.json")) if (ctx.state_dir / "pids").is_dir() else []


def test_deploy_measure_and_teardown(case: tuple[Case, Target, TrialContext]) -> None:
    c, target, ctx = case
    with target.deploy(c.ok, ctx) as dep:
        m = dep.measure(WORKLOAD, goodput_ms={"ttft": 600000.0}, seed=0)
        endpoint, pid = dep.endpoint, getattr(getattr(dep, "server", None), "pid", None)
    assert m.summary["completed"] == 6 and m.summary["failed"] == 0
    assert m.summary["output_throughput"] > 0 and math.isfinite(m.value("ttft_ms.p99"))
    assert m.value("request_goodput") > 0
    assert _refused(endpoint) and (pid is None or not pid_alive(pid)) and not _leftovers(ctx)


def test_teardown_runs_when_the_caller_fails(case: tuple[Case, Target, TrialContext]) -> None:
    c, target, ctx = case
    with pytest.raises(RuntimeError, match="the caller broke"):
        with target.deploy(c.ok, ctx) as dep:
            endpoint, pid = dep.endpoint, getattr(getattr(dep, "server", None), "pid", None)
            raise RuntimeError("the caller broke")
    assert _refused(endpoint) and (pid is None or not pid_alive(pid)) and not _leftovers(ctx)


def test_a_stop_request_interrupts(case: tuple[Case, Target, TrialContext]) -> None:
    c, target, ctx = case
    ctx.stop_event = threading.Event()
    ctx.stop_event.set()
    with pytest.raises(Interrupted):
        with target.deploy(c.ok, ctx) as dep:
            dep.measure(WORKLOAD, goodput_ms={}, seed=0)
    assert not _leftovers(ctx)


def test_a_failure_is_classified(case: tuple[Case, Target, TrialContext]) -> None:
    c, target, ctx = case
    with pytest.raises(TrialError) as info:
        with target.deploy(c.bad, ctx) as dep:
            dep.measure(WORKLOAD, goodput_ms={}, seed=0)
    assert info.value.cause in CAUSES and str(info.value), info.value
    assert not _leftovers(ctx)


def test_describe_names_the_kind_in_text(case: tuple[Case, Target, TrialContext]) -> None:
    _, target, _ = case
    d = target.describe()
    assert d["kind"] == target.kind and all(isinstance(v, str) for v in d.values())
    assert target.describe() == d  # stable: a change opens a new study

