"""Parallel trials through the real loop: the command target starts fake servers on disjoint GPU claims."""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.agents import fake_server_agent, write_spec
from tuner.agent import load_agent
from tuner.loop import open_session, run_cycle
from tuner.placement.gpupool import GpuPool, overlaps


def run(tmp_path: Path, parallel: int) -> tuple[float, GpuPool, list]:
    d = tmp_path / f"p{parallel}"
    d.mkdir()
    write_spec(d / "agent.yaml", fake_server_agent(
        ttft_ms=list(range(100, 300, 10)), itl_ms=5, output_tokens=8, num_requests=6,
        server_args=["--ready-delay-s", "0.5"],
        name=f"parallel-{parallel}", budget={"trials": 8}, gpus=list(range(8)), parallel_trials=parallel,
        at={"target.gpus_per_trial": 2}))
    agent = load_agent(d / "agent.yaml")
    (d / "state").mkdir()
    session = open_session(agent, d / "state")
    # the baseline first, alone: Optuna on SQLite can hand one enqueued trial to two threads that ask at
    # once (reported to the lead: TunerStudy.ask needs a lock); sampled trials are created atomically
    run_cycle(session, trials=1, parallel=1)
    pool = GpuPool(agent.spec.gpus)
    t0 = time.monotonic()
    result = run_cycle(session, trials=8, gpu_pool=pool)
    return time.monotonic() - t0, pool, result.outcomes


def test_four_parallel_trials_run_side_by_side_on_disjoint_gpus(tmp_path: Path) -> None:
    wall_1, pool_1, out_1 = run(tmp_path, 1)
    wall_4, pool_4, out_4 = run(tmp_path, 4)
    for outcomes in (out_1, out_4):
        # 20 configurations, so the budget is not cut short by the space running out; a configuration
        # proposed again is a repeat of the earlier trial (repeat_of), no budget trial
        assert len([o for o in outcomes if o.repeat_of is None]) == 8
        assert all(o.cause is None for o in outcomes), [o.error for o in outcomes]
        assert all(len(o.gpus) == 2 for o in outcomes)
        assert all(o.metrics["completed"] == 6 and o.metrics["cold_start_s"] > 0.4 for o in outcomes)
    assert overlaps(pool_1.history) == [] and overlaps(pool_4.history) == []
    # with 4 workers, claims really ran side by side (on disjoint GPUs)
    peak = max(sum(1 for c in pool_4.history if c.start_s <= a.start_s < (c.end_s or 1e18))
               for a in pool_4.history)
    assert peak >= 3
    peak_1 = max(sum(1 for c in pool_1.history if c.start_s <= a.start_s < (c.end_s or 1e18))
                 for a in pool_1.history)
    assert peak_1 == 1
    # how much faster 4 workers are is a measurement of the host (experiments/distributed-scaling), not asserted:
    # beside a CPU hog the ratio moves; that claims overlapped (above) is the behaviour
    print(f"parallel_trials 4 took {wall_4:.1f} s, 1 took {wall_1:.1f} s")
