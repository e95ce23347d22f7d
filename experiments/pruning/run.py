"""What pruning spares and what the `max_rate_under_slo` objective costs (issue 26).

Part 1 (simulator): the shipped agent agents/sim-8xa100.yaml (30 trials, its TPE with a layout sweep), with
pruning at its default (factor 3, min_requests 20) and off, for several sampler seeds: trials pruned, the load
the trials ran (seconds of measured requests on the simulated clock, which a real server would have spent), and
the best found. Part 2 (simulator): the same agent with the max_rate_under_slo objective: probe runs and load
seconds per trial against one measurement per trial. Part 3 (`--engine`): the real reference engine, slowed to
25 ms a step, a configuration that queues (max_batch_size 1 for 8 requests in flight) with pruning on and off:
wall seconds of the trial, requests measured.

    .venv/bin/python experiments/pruning/run.py [--seeds 3] [--engine]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from optuna.trial import TrialState  # noqa: E402

from tuner.agent import load_agent  # noqa: E402
from tuner.loop import open_session, run_cycle  # noqa: E402


def sim_spec(**changes: Any) -> dict[str, Any]:
    spec = yaml.safe_load((ROOT / "agents" / "sim-8xa100.yaml").read_text())
    spec["search_space"] = str(ROOT / "search_spaces" / "sim.yaml")
    spec["tracking"] = {"enabled": False}
    spec.pop("schedule", None)
    for k, v in changes.items():
        spec[k] = v
    return spec


def run(spec: dict[str, Any], trials: int, enqueue: tuple[dict[str, Any], ...] = ()) -> tuple[Any, Any, float]:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "agent.yaml"
        p.write_text(yaml.safe_dump(spec, sort_keys=False))
        session = open_session(load_agent(p), Path(d) / "state")
        for params in enqueue:
            session.study.study.enqueue_trial(params)
        t0 = time.monotonic()
        run_cycle(session, trials=trials)
        wall = time.monotonic() - t0
        trials_ = session.study.trials()
        best = session.study.best()
        return trials_, (best[0] if best else None), wall


def load_s(trials: list[Any]) -> float:
    return sum(float(t.user_attrs.get("metrics", {}).get("duration", 0.0)) for t in trials
               if "config" in t.user_attrs and not t.user_attrs.get("duplicate_of"))


def part1(seeds: int) -> None:
    print("## Part 1: the shipped sim agent, 30 trials, pruning at its default vs off\n")
    print("| seed | pruning | trials pruned | measured requests | load (simulated s) | best output_throughput "
          "(tok/s) | best trial |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    saved = []
    for seed in range(seeds):
        row = {}
        for mode, pruning in (("default", {}), ("off", {"enabled": False})):
            spec = sim_spec(pruning=pruning, sampler={**sim_spec()["sampler"], "seed": seed})
            trials, best, _ = run(spec, 30)
            n_pruned = sum(t.state == TrialState.PRUNED for t in trials)
            reqs = sum(int(t.user_attrs.get("metrics", {}).get("completed", 0)) for t in trials
                       if not t.user_attrs.get("duplicate_of"))
            ls = load_s(trials)
            row[mode] = ls
            print(f"| {seed} | {mode} | {n_pruned} | {reqs} | {ls:.0f} | "
                  f"{best.values[0]:.0f} | {best.number} |" if best else f"| {seed} | {mode} | {n_pruned} | "
                  f"{reqs} | {ls:.0f} | none | - |")
        saved.append(1 - row["default"] / row["off"])
    print(f"\nload spared by pruning: median {statistics.median(saved):.1%} (per seed: "
          + ", ".join(f"{s:.1%}" for s in saved) + ")\n")


def part2() -> None:
    print("## Part 2: max_rate_under_slo on the same agent (10 trials, open loop from 4 req/s)\n")
    base = sim_spec()
    wl = dict(base["workload"])
    wl["arrival"] = {"kind": "poisson", "rate_per_s": 4}
    wl.pop("warmup_requests", None)
    spec = sim_spec(workload=wl, objectives=[{"metric": "max_rate_under_slo", "direction": "maximize",
                                              "search": {"max_runs": 6, "run_s": 20}}])
    trials, best, wall = run(spec, 10)
    done = [t for t in trials if t.user_attrs.get("capacity_search")]
    runs = [t.user_attrs["capacity_search"]["runs"] for t in done]
    loads = [t.user_attrs["capacity_search"]["load_s"] for t in done]
    conv = sum(bool(t.user_attrs["capacity_search"]["converged"]) for t in done)
    one = sim_spec(workload=wl)
    t1, _, _ = run(one, 10)
    print("| quantity | value |\n|---|---:|")
    print(f"| trials with a capacity search | {len(done)} |")
    print(f"| probe runs per trial, mean (max 6) | {statistics.fmean(runs):.1f} |")
    print(f"| converged (bracket within rel_tol 0.25) | {conv} of {len(done)} |")
    print(f"| load per trial, mean (simulated s) | {statistics.fmean(loads):.0f} |")
    print(f"| load per trial with one measurement at 4 req/s, mean (simulated s) | {load_s(t1) / len(t1):.0f} |")
    if best is not None:
        print(f"| best max_rate_under_slo (req/s) | {best.values[0]:.1f} (trial {best.number}) |")
        print(f"| baseline max_rate_under_slo (req/s) | {trials[0].values[0]:.1f} |")
    print(f"| cycle wall (s, this host) | {wall:.1f} |\n")


def part3() -> None:
    print("## Part 3: the reference engine (tiny, CPU, 25 ms a step), max_batch_size 1 for 8 requests in flight\n")
    spec: dict[str, Any] = {
        "name": "engine-prune", "noise": {"baseline_repeats": 0}, "sampler": {"name": "random", "seed": 0},
        "tracking": {"enabled": False}, "budget": {"trials": 2},
        "target": {"kind": "torch_engine", "preset": "tiny", "device": "cpu", "cpu_threads": 1, "step_delay_ms": 25,
                   "startup_timeout_s": 120},
        "search_space": {"target": "torch_engine", "params": {
            "batching": {"type": "categorical", "choices": ["continuous"], "default": "continuous"},
            "max_batch_size": {"type": "categorical", "choices": [16, 1], "default": 16}}},
        "workload": {"arrival": {"kind": "closed", "concurrency": 8},
                     "prompt_tokens": {"dist": "fixed", "value": 16}, "output_tokens": {"dist": "fixed", "value": 12},
                     "num_requests": 120, "ignore_eos": True, "timeout_s": 60},
        "objectives": [{"metric": "output_throughput", "direction": "maximize"}],
        "slos": [{"metric": "ttft_ms.p99", "max": 500}]}
    print("| pruning | state | requests measured | p99 TTFT (ms) | trial wall (s, deploy included) |")
    print("|---|---|---:|---:|---:|")
    for mode, pruning in (("default", {}), ("off", {"enabled": False})):
        trials, _, _ = run({**spec, "pruning": pruning}, 2, ({"batching": "continuous", "max_batch_size": 1},))
        t = trials[1]
        m = t.user_attrs["metrics"]
        print(f"| {mode} | {t.state.name} | {m['completed']:.0f} | {m['p99_ttft_ms']:.0f} | "
              f"{t.user_attrs['duration_s']:.1f} |")
    print()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--engine", action="store_true")
    a = ap.parse_args()
    part1(a.seeds)
    part2()
    if a.engine:
        part3()


if __name__ == "__main__":
    main()
