"""Baseline + a 30-trial Optuna TPE study run directly against SimTarget (before the tuner's loop exists).

Usage: .venv/bin/python experiments/sim-check/tune.py [agents/sim-8xa100.yaml] [--trials 30] [--seed 0]
Prints one row per trial and the best feasible trial against the baseline (trial 0, all defaults).
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from pathlib import Path
from typing import Any

import optuna

from tuner.agent import load_agent
from tuner.errors import TrialError
from tuner.search.space import SearchSpace
from tuner.targets.base import TrialContext
from tuner.targets.registry import make_target


def suggest(trial: optuna.Trial, space: SearchSpace) -> dict[str, Any]:
    chosen: dict[str, Any] = {}
    for p in space.params:
        if space.active(p, chosen):
            chosen[p.name] = trial._suggest(p.name, p.distribution())  # noqa: SLF001 - conditional space
    return chosen


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("agent", nargs="?", default="agents/sim-8xa100.yaml")
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.basicConfig(level=logging.WARNING)
    agent = load_agent(args.agent)
    spec = agent.spec
    target = make_target(spec.target.kind, agent.target_options, agent.path.parent)
    sampler = optuna.samplers.TPESampler(seed=args.seed, n_startup_trials=spec.sampler.n_startup_trials or 10)
    obj = spec.objectives[0]
    study = optuna.create_study(direction=obj.direction, sampler=sampler)
    study.enqueue_trial(agent.space.defaults())
    t_start = time.perf_counter()
    rows = []
    print(f"{'#':>3} {'tp':>2} {'dp':>2} {'batch':>5} {'seqs':>5} {'mnbt':>6} {'chunk':>5} {'gmu':>5} {'kv':>4} "
          f"{'graphs':>18} {'cap':>5} | {obj.metric:>17} {'ttft99':>8} {'itl99':>7} {'ok':>3} {'sim_s':>6}")
    for i in range(args.trials):
        trial = study.ask()
        params = suggest(trial, agent.space)
        bad = agent.space.violations(params)
        t0 = time.perf_counter()
        value = math.nan
        ttft = itl = math.nan
        feasible = False
        if bad:
            status = "constraint"
            # never deployed: told as the worst value and infeasible, so that TPE learns to avoid the region
            trial.set_constraint("slo", 1e12)
            study.tell(trial, 0.0)
        else:
            try:
                ctx = TrialContext(trial_number=i, state_dir=Path("/tmp/sim-check"), seed=i)
                with target.deploy(agent.space.full_config(params), ctx) as dep:
                    m = dep.measure(spec.workload, goodput_ms={}, seed=i)
                value = m.value(obj.metric)
                # relative violations (value / limit - 1), so that no SLO dominates by its unit
                viol = [m.value(s.metric) / s.max - 1 if s.max is not None
                        else 1 - m.value(s.metric) / float(s.min or 1.0) for s in spec.slos]
                worst = max((v if math.isfinite(v) else math.inf for v in viol), default=-1.0)
                worst = min(worst, 1e12)  # NaN/inf (no completed request) -> a large violation
                ttft, itl = m.value("ttft_ms.p99"), m.value("itl_ms.p99")
                feasible = worst <= 0
                trial.set_constraint("slo", worst)
                study.tell(trial, value)
                status = "ok" if feasible else "slo"
            except TrialError as exc:
                status = exc.cause
                trial.set_constraint("slo", 1e12)
                study.tell(trial, 0.0)
        el = time.perf_counter() - t0
        rows.append((i, params, value, feasible, status))
        g = "eager" if params.get("enforce_eager") else params.get("cudagraph_mode", "-")
        print(f"{i:>3} {params['tensor_parallel_size']:>2} {params['data_parallel_size']:>2} "
              f"{params['batching'][:5]:>5} {params['max_num_seqs']:>5} {params['max_num_batched_tokens']:>6} "
              f"{params['enable_chunked_prefill']!s:>5} {params['gpu_memory_utilization']:>5.2f} "
              f"{params['kv_cache_dtype']:>4} {g:>18} {params.get('max_cudagraph_capture_size', '-')!s:>5} | "
              f"{value:>17.0f} {ttft:>8.0f} {itl:>7.1f} {status if status != 'ok' else 'yes':>3} {el:>6.3f}")
    total = time.perf_counter() - t_start
    base = rows[0][2]
    feas = [r for r in rows if r[3]]
    print(f"\n{args.trials} trials in {total:.2f} s ({total / args.trials * 1000:.0f} ms/trial, Optuna included)")
    print(f"baseline (trial 0) {obj.metric} = {base:.0f}, feasible: {rows[0][3]}")
    if feas:
        best = max(feas, key=lambda r: r[2]) if obj.direction == "maximize" else min(feas, key=lambda r: r[2])
        print(f"best feasible: trial {best[0]} {obj.metric} = {best[2]:.0f} ({best[2] / base - 1:+.0%} vs baseline)")
        print(f"  params: {best[1]}")
    else:
        print("no feasible trial")


if __name__ == "__main__":
    main()
