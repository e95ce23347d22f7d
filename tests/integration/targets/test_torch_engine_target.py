"""The torch_engine target: real server subprocesses through ProcessTarget, the quality probe, the
search space's device conditions and the quickstart agent."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.agent import load_agent
from tuner.errors import ConfigError, InfeasibleConfig
from tuner.search.space import load_space
from tuner.spec import Arrival, LengthDist, WorkloadSpec
from tuner.targets.base import TrialContext
from tuner.targets.registry import make_target, target_class
from tuner.targets.torch_engine import PROBE_PROMPTS, PROBE_TOKENS, TorchEngineOptions, TorchEngineTarget

ROOT = Path(__file__).resolve().parents[3]
GPU_ONLY = {"cuda_graphs", "cuda_graph_max_batch", "compile", "async_output", "stream_priority"}


def _target(tmp: Path, **opts: object) -> TorchEngineTarget:
    options = TorchEngineOptions(**{"device": "cpu", "preset": "tiny", "cpu_threads": 1, **opts})
    t = make_target("torch_engine", options, tmp)
    assert isinstance(t, TorchEngineTarget)
    return t


def test_registry_and_facts(tmp_path: Path) -> None:
    assert target_class("torch_engine") is TorchEngineTarget
    t = _target(tmp_path)
    from tuner.targets.torch_engine import BFLOAT16_SLOWDOWN_LIMIT, cpu_bfloat16_slowdown

    slowdown = cpu_bfloat16_slowdown()
    assert slowdown > 0
    assert t.facts() == {"device": "cpu", "fast_bfloat16": slowdown <= BFLOAT16_SLOWDOWN_LIMIT}
    assert t.gpus_needed({}) == 0
    d = t.describe()
    assert d["kind"] == "torch_engine" and d["torch"] and d["device"] == "cpu" and d["preset"] == "tiny"
    assert _target(tmp_path, preset="auto").preset() == "tiny"  # auto on a CPU


def test_space_conditions_follow_the_device() -> None:
    space = load_space(ROOT / "search_spaces" / "torch_engine.yaml")
    cpu = space.bind_facts({"device": "cpu"}).defaults()
    cuda = space.bind_facts({"device": "cuda"}).defaults()
    assert not GPU_ONLY & set(cpu)
    assert {"compile", "async_output", "stream_priority"} <= set(cuda)
    assert cpu["batching"] == "static" and cpu["dtype"] == "float32" and cpu["pre_allocate"] is False
    cuda_space = space.bind_facts({"device": "cuda"})
    assert cuda_space.active(cuda_space.by_name["cuda_graphs"], {**cuda, "pre_allocate": True})
    assert not cuda_space.active(cuda_space.by_name["cuda_graphs"], cuda)


def test_check_space_and_command(tmp_path: Path) -> None:
    t = _target(tmp_path)
    space = load_space(ROOT / "search_spaces" / "torch_engine.yaml")
    t.check_space(space)
    ctx = TrialContext(trial_number=0, state_dir=tmp_path)
    argv, env = t.build_command({"batching": "continuous", "pre_allocate": True}, ctx, 1234)
    assert argv[1:3] == ["-m", "tuner.engine.server"] and env == {}
    assert "--port" in argv and "1234" in argv and "--pre-allocate" in argv and "--cpu-threads" in argv
    bad = load_space(ROOT / "search_spaces" / "torch_engine.yaml")
    bad.fixed["max_num_seqs"] = 4
    with pytest.raises(ConfigError, match="max_num_seqs"):
        t.check_space(bad)


def test_gpu_knob_on_cpu_is_infeasible_before_anything_starts(tmp_path: Path) -> None:
    t = _target(tmp_path)
    ctx = TrialContext(trial_number=1, state_dir=tmp_path)
    with pytest.raises(InfeasibleConfig, match="cuda_graphs"):
        with t.deploy({"cuda_graphs": True, "pre_allocate": True}, ctx):
            pass
    with pytest.raises(InfeasibleConfig, match="attention='flash' cannot apply on device 'cpu' in bfloat16: torch's "
                                               "flash kernel needs a CUDA GPU"):
        with t.deploy({"attention": "flash", "dtype": "bfloat16"}, ctx):
            pass
    assert not (tmp_path / "logs" / "trial-1.log").exists()
    # the search space keeps such a sample from being proposed at all
    space = load_space(ROOT / "search_spaces" / "torch_engine.yaml").bind_facts(t.facts())
    assert space.violations({**space.defaults(), "attention": "flash", "dtype": "bfloat16"})


def test_deploy_measure_and_quality_probe(tmp_path: Path) -> None:
    t = _target(tmp_path)
    space = load_space(ROOT / "search_spaces" / "torch_engine.yaml").bind_facts(t.facts())
    base = space.full_config(space.defaults())
    w = WorkloadSpec(arrival=Arrival(kind="closed", concurrency=4), prompt_tokens=LengthDist(dist="fixed", value=32),
                     output_tokens=LengthDist(dist="fixed", value=8), num_requests=8, ignore_eos=True)
    with t.deploy(base, TrialContext(trial_number=0, state_dir=tmp_path)) as dep:
        assert dep.cold_start_s > 0 and dep.log_path is not None
        m = dep.measure(w, goodput_ms={"ttft": 10_000.0}, seed=0)
        probe = dep.quality_probe()
    assert m.summary["completed"] == 8 and m.summary["failed"] == 0 and m.cold_start_s > 0
    assert probe is not None and len(probe) == len(PROBE_PROMPTS)
    assert all(len(p) == PROBE_TOKENS for p in probe)
    tuned = {**base, "batching": "continuous", "max_batch_size": 4, "prefill_chunk_tokens": 8, "pre_allocate": True}
    with t.deploy(tuned, TrialContext(trial_number=1, state_dir=tmp_path)) as dep:
        assert dep.quality_probe() == probe  # float32 greedy output does not depend on the batching knobs


def test_quickstart_agent_loads() -> None:
    agent = load_agent(ROOT / "agents" / "quickstart.yaml")
    assert agent.spec.target.kind == "torch_engine"
    assert agent.spec.objectives[0].metric == "ttft_ms.mean"
    assert agent.spec.workload.auto_rate and agent.spec.workload.arrival.load == 0.5  # sized on the host
    assert {s.metric for s in agent.spec.slos} == {"ttft_ms.p99", "itl_ms.p99"}
    defaults = agent.space.bind_facts({"device": "cpu"}).defaults()
    assert defaults["batching"] == "static" and "cuda_graphs" not in defaults


def test_the_quickstart_offers_bfloat16_only_where_it_is_fast() -> None:
    """On a CPU that emulates bfloat16 (30-50x slower than float32 on an AVX2-only host) the quickstart's
    dtype stays at float32: every bfloat16 trial broke an SLO there and the best was the baseline."""
    space = load_agent(ROOT / "agents" / "quickstart.yaml").space
    slow = space.bind_facts({"device": "cpu", "fast_bfloat16": False})
    fast = space.bind_facts({"device": "cpu", "fast_bfloat16": True})
    assert "dtype" not in slow.defaults() and fast.defaults()["dtype"] == "float32"
    assert not slow.active(slow.by_name["dtype"], slow.defaults())
    assert fast.by_name["dtype"].spec.choices == ["float32", "bfloat16"]
