"""Parallel trials over a GPU pool: 8 fake GPU ids, TP in {1, 2, 4, 8} x DP, the simulator as target."""

from __future__ import annotations

from pathlib import Path

from tests.support import agents
from tuner.agent import load_agent
from tuner.loop import open_session, run_cycle
from tuner.placement.gpupool import GpuPool, overlaps


def write_agent(path: Path) -> Path:
    return agents.write_agent(
        path, name="parallel-sim", slos=None, sampler={"name": "random", "seed": 3}, budget={"trials": 16},
        gpus=list(range(8)), parallel_trials=4,
        search_space={"params": {
            "tensor_parallel_size": {"type": "categorical", "choices": [1, 2, 4, 8], "default": 1},
            "data_parallel_size": {"type": "categorical", "choices": [1, 2, 4], "default": 1},
            "max_num_seqs": {"type": "int", "low": 16, "high": 256, "log": True, "default": 128}}},
        at={"workload.arrival": {"kind": "poisson", "rate_per_s": 30},
            "workload.prompt_tokens": {"dist": "uniform", "low": 64, "high": 512}, "workload.num_requests": 150})


def test_parallel_trials_never_share_a_gpu(tmp_path: Path) -> None:
    p = write_agent(tmp_path / "agent.yaml")
    agent = load_agent(p)
    session = open_session(agent, tmp_path / "state")
    pool = GpuPool(agent.spec.gpus)
    result = run_cycle(session, trials=16, gpu_pool=pool)
    assert len(result.outcomes) == 16
    assert overlaps(pool.history) == []  # no GPU was ever held by two trials at once
    by_trial = {c.label: c for c in pool.history}
    for o in result.outcomes:
        tp = o.params["tensor_parallel_size"]
        dp = o.params["data_parallel_size"]
        if tp * dp > 8:  # more GPUs than the node has: infeasible at once, nothing claimed
            assert o.cause == "infeasible_config", o
            assert f"trial-{o.number}" not in by_trial
            continue
        claim = by_trial[f"trial-{o.number}"]
        assert len(claim.gpus) == tp * dp
        assert tuple(session.study.trial(o.number).user_attrs["gpus"]) == claim.gpus
    # (that trials really run side by side, and faster, is shown with I/O-bound servers in
    # test_command_parallel.py: simulated trials are CPU-bound and may or may not interleave)
