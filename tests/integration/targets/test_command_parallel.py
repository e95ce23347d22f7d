"""Parallel trials through the real loop: the command target starts fake servers on disjoint GPU claims."""

from __future__ import annotations

import time
from pathlib import Path

from tuner.agent import load_agent
from tuner.gpupool import GpuPool, overlaps
from tuner.loop import open_session, run_cycle

FAKE = Path(__file__).resolve().parents[2] / "support" / "fake_openai_server.py"

AGENT = """\
name: parallel-{parallel}
target:
  kind: command
  command: ["{{python}}", "{fake}", "--port", "{{port}}", "--ttft-ms", "{{ttft_ms}}", "--itl-ms", "5",
            "--ready-delay-s", "0.5"]
  model: fake
  gpus_per_trial: 2
  startup_timeout_s: 60
search_space:
  params:
    ttft_ms: {{type: categorical, choices: [100, 150, 200], default: 100}}
workload:
  arrival: {{kind: closed, concurrency: 2}}
  prompt_tokens: {{dist: fixed, value: 16}}
  output_tokens: {{dist: fixed, value: 8}}
  num_requests: 6
objectives:
  - {{metric: output_throughput, direction: maximize}}
sampler: {{name: random, seed: 0}}
budget: {{trials: 8}}
tracking: {{enabled: false}}
gpus: [0, 1, 2, 3, 4, 5, 6, 7]
parallel_trials: {parallel}
"""


def run(tmp_path: Path, parallel: int) -> tuple[float, GpuPool, list]:
    d = tmp_path / f"p{parallel}"
    d.mkdir()
    (d / "agent.yaml").write_text(AGENT.format(parallel=parallel, fake=FAKE))
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


def test_four_parallel_trials_take_well_under_half_the_time_of_one(tmp_path: Path) -> None:
    wall_1, pool_1, out_1 = run(tmp_path, 1)
    wall_4, pool_4, out_4 = run(tmp_path, 4)
    for outcomes in (out_1, out_4):
        assert len(outcomes) == 8
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
    assert wall_4 < 0.5 * wall_1, f"parallel_trials 4 took {wall_4:.1f} s, 1 took {wall_1:.1f} s"
