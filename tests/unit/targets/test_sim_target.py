"""search_spaces/sim.yaml and agents/sim-8xa100.yaml: loadable, baseline = vLLM defaults, tuning pays."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.agent import load_agent
from tuner.errors import ConfigError
from tuner.search.space import parse_space
from tuner.targets.base import TrialContext
from tuner.targets.registry import make_target
from tuner.targets.sim import SimTarget

ROOT = Path(__file__).resolve().parents[3]
AGENT = ROOT / "agents" / "sim-8xa100.yaml"


def test_agent_loads_and_its_baseline_is_vllm_defaults() -> None:
    agent = load_agent(AGENT)
    assert agent.spec.target.kind == "sim"
    assert isinstance(agent.target_options, SimTarget.Options)
    assert agent.target_options.hardware == "a100-80gb-sxm" and agent.target_options.model == "llama-3-8b"
    assert agent.spec.objectives[0].metric == "output_throughput"
    assert {s.metric for s in agent.spec.slos} == {"ttft_ms.p99", "itl_ms.p99"}
    base = agent.space.defaults()
    assert base["tensor_parallel_size"] == 1 and base["data_parallel_size"] == 1
    assert "batch_timeout_ms" not in base  # only when batching == 'static'
    t = make_target("sim", agent.target_options, AGENT.parent)
    assert isinstance(t, SimTarget)
    t.check_space(agent.space)
    # the explicit defaults resolve to exactly what vLLM picks when nothing is set
    explicit, implicit = t.resolve(agent.space.full_config(base)), t.resolve({})
    assert explicit == implicit


def test_space_conditions_and_constraints() -> None:
    space = load_agent(AGENT).space
    p = space.by_name
    assert space.active(p["batch_timeout_ms"], {"batching": "static"})
    assert not space.active(p["batch_timeout_ms"], {"batching": "continuous"})
    assert not space.active(p["max_cudagraph_capture_size"], {"enforce_eager": True})
    assert not space.active(p["max_cudagraph_capture_size"], {"enforce_eager": False, "cudagraph_mode": "NONE"})
    assert space.active(p["max_cudagraph_capture_size"], {"enforce_eager": False, "cudagraph_mode": "FULL"})
    base = space.defaults()
    assert space.violations(base) == []
    assert space.violations({**base, "max_num_seqs": 512, "max_num_batched_tokens": 256})
    assert space.violations({**base, "tensor_parallel_size": 4, "data_parallel_size": 4})
    assert p["tensor_parallel_size"].spec.choices == [1, 2, 4, 8]
    assert p["data_parallel_size"].spec.choices == [1, 2, 4, 8]


def test_check_space_rejects_unknown_knobs() -> None:
    space = parse_space({"params": {"swap_space": {"type": "int", "low": 1, "high": 8, "default": 4}}},
                        file="inline.yaml")
    with pytest.raises(ConfigError, match="swap_space"):
        SimTarget(SimTarget.Options(), agent_dir=ROOT).check_space(space)


def test_tuning_pays_on_the_agent_workload(tmp_path: Path) -> None:
    """A config an operator would try (all 8 GPUs as DP replicas) beats the baseline by >= 20% within SLOs."""
    agent = load_agent(AGENT)
    t = make_target("sim", agent.target_options, AGENT.parent)
    spec = agent.spec

    def measure(params: dict[str, object]) -> tuple[float, bool]:
        with t.deploy(agent.space.full_config(params), TrialContext(0, tmp_path)) as dep:
            m = dep.measure(spec.workload, goodput_ms={}, seed=0)
        ok = all(m.value(s.metric) <= s.max for s in spec.slos if s.max is not None)
        return m.value("output_throughput"), ok

    base, _ = measure(agent.space.defaults())
    tuned, ok = measure({**agent.space.defaults(), "data_parallel_size": 8, "max_num_batched_tokens": 1024})
    assert ok
    assert tuned >= 1.2 * base


def test_agent_with_unknown_hardware_is_a_located_config_error(tmp_path: Path) -> None:
    text = AGENT.read_text().replace("hardware: a100-80gb-sxm", "hardware: a100").replace(
        "../search_spaces/sim.yaml", str(ROOT / "search_spaces" / "sim.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_agent(bad)
    assert exc.value.field == "target.hardware" and exc.value.line == 7
    assert "a100-80gb-sxm, h100-sxm, h200" in str(exc.value)
