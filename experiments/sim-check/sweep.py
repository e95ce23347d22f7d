"""One knob at a time from the baseline (and from DP=8) on the agent's workload, noise off: what each knob does.

Usage: .venv/bin/python experiments/sim-check/sweep.py [agents/sim-8xa100.yaml]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from tuner.agent import load_agent
from tuner.errors import TrialError
from tuner.targets.base import TrialContext
from tuner.targets.registry import make_target

VARIANTS: list[dict[str, Any]] = [
    {},
    {"max_num_batched_tokens": 512}, {"max_num_batched_tokens": 8192},
    {"enable_chunked_prefill": False},
    {"max_num_seqs": 32}, {"max_num_seqs": 64, "max_cudagraph_capture_size": 128},
    {"gpu_memory_utilization": 0.5}, {"gpu_memory_utilization": 0.3},
    {"kv_cache_dtype": "fp8"},
    {"enforce_eager": True}, {"cudagraph_mode": "PIECEWISE"}, {"cudagraph_mode": "FULL_DECODE_ONLY"},
    {"cudagraph_mode": "NONE"}, {"max_cudagraph_capture_size": 16},
    {"batching": "static", "batch_timeout_ms": 100},
    {"tensor_parallel_size": 2}, {"tensor_parallel_size": 8},
    {"data_parallel_size": 2}, {"tensor_parallel_size": 2, "data_parallel_size": 4},
]


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else "agents/sim-8xa100.yaml"
    agent = load_agent(path)
    spec = agent.spec
    options = agent.target_options.model_copy(update={"noise_cv": 0.0})  # knob effects without machine noise
    target = make_target(spec.target.kind, options, agent.path.parent)
    ctx = TrialContext(trial_number=0, state_dir=Path("/tmp/sim-check"))
    print(f"{'from':<5} {'change':<55} | {'out tok/s':>9} {'ttft p50':>8} {'ttft p99':>8} {'itl p50':>7} "
          f"{'itl p99':>7} {'run':>4} {'kv tokens':>9} {'preempt':>7} {'cold s':>6} {'sim s':>5}")
    for base_name, base in (("base", {}), ("dp8", {"data_parallel_size": 8})):
        for v in VARIANTS:
            params = {**agent.space.defaults(), **base, **v}
            if base and "data_parallel_size" in v:
                continue
            t0 = time.perf_counter()
            try:
                with target.deploy(params, ctx) as dep:
                    m = dep.measure(spec.workload, goodput_ms={}, seed=0)
            except TrialError as exc:
                print(f"{base_name:<5} {str(v):<55} | {exc.cause}: {str(exc)[:60]}")
                continue
            s, tel = m.summary, m.telemetry
            print(f"{base_name:<5} {str(v) if v else '(none)':<55} | {s['output_throughput']:>9.0f} "
                  f"{s['median_ttft_ms']:>8.0f} {s['p99_ttft_ms']:>8.0f} {s['median_itl_ms']:>7.1f} "
                  f"{s['p99_itl_ms']:>7.1f} {tel['sim_mean_running']:>4.0f} {tel['sim_kv_capacity_tokens']:>9.0f} "
                  f"{tel['sim_preemptions']:>7.0f} {m.cold_start_s:>6.1f} {time.perf_counter() - t0:>5.2f}")


if __name__ == "__main__":
    main()
