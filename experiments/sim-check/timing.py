"""Wall time of one simulated run of the agent workload (deploy + measure + summarise), 5 seeds each.

Usage: .venv/bin/python experiments/sim-check/timing.py
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from tuner.agent import load_agent
from tuner.targets.base import TrialContext
from tuner.targets.registry import make_target

PARAMS: list[dict[str, object]] = [
    {}, {"data_parallel_size": 8}, {"tensor_parallel_size": 2, "data_parallel_size": 4}, {"batching": "static"},
]


def main() -> None:
    agent = load_agent("agents/sim-8xa100.yaml")
    t = make_target("sim", agent.target_options, agent.path.parent)
    for p in PARAMS:
        ts = []
        for i in range(5):
            t0 = time.perf_counter()
            with t.deploy({**agent.space.defaults(), **p}, TrialContext(0, Path("/tmp/sim-check"))) as d:
                m = d.measure(agent.spec.workload, goodput_ms={}, seed=i)
            ts.append(time.perf_counter() - t0)
        tokens = sum(r.output_tokens for r in m.records)
        print(f"{str(p):<55} median {statistics.median(ts) * 1000:.0f} ms  max {max(ts) * 1000:.0f} ms  "
              f"records {len(m.records)}  output tokens {tokens}")


if __name__ == "__main__":
    main()
