"""Fleet scaling: trials per hour with 1, 2 and 4 workers on one PostgreSQL study, and on Ray with 2 nodes;
and the tuner's own overhead per trial on PostgreSQL vs SQLite.

The workers serve the command target: tests/support/fake_openai_server.py with fixed delays (TTFT and
inter-token gaps), so a trial's time is waiting, not CPU, and the workers are not limited by this machine's
two cores. Each worker is a real `tuner worker` process on a real PostgreSQL server (started here, as in the
tests); the Ray row is one `tuner worker` driving a local two-node Ray cluster (ray.cluster_utils.Cluster, 4
declared GPUs per node, one GPU per trial, 4 trials at once). Trials per hour = completed trials / (last
trial's end - first trial's start), from the study's own timestamps; ideal = N x the one-worker rate.

    .venv/bin/python experiments/distributed-scaling/run.py [--trials 8] [--overhead-trials 30]
        [--parts workers,ray,overhead]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support import postgres  # noqa: E402
from tests.support.agents import fake_server_agent, fleet_sim_agent, write_spec  # noqa: E402


def trials_per_hour(url: str, name: str) -> tuple[int, float, float]:
    import optuna
    from optuna.trial import TrialState

    from tuner.study.study import open_storage

    done = [t for t in optuna.load_study(study_name=name, storage=open_storage(url)).get_trials()
            if t.state == TrialState.COMPLETE]
    start = min(t.datetime_start for t in done if t.datetime_start)
    end = max(t.datetime_complete for t in done if t.datetime_complete)
    span_s = (end - start).total_seconds()
    return len(done), span_s, len(done) / span_s * 3600


PROCS: list[subprocess.Popen[bytes]] = []


def run_workers(pg: postgres.PgServer, work: Path, workers: int, trials: int, extra: dict[str, Any] | None = None,
                gpus_per_trial: int = 0, label: str = "") -> tuple[int, float, float, float]:
    name = f"scale-{label or workers}"
    url = pg.create_database(name)
    agent = work / f"{name}.yaml"
    write_spec(agent, fake_server_agent(
        ttft_ms=[4000, 5000, 6000], itl_ms=250, output_tokens=30, num_requests=4, name=name,
        budget={"trials": trials}, storage=url, lease={"heartbeat_s": 2, "timeout_s": 20}, **(extra or {}),
        at={"target.gpus_per_trial": gpus_per_trial, "search_space.params.ttft_ms.default": 5000}))
    t0 = time.monotonic()
    procs = PROCS  # ended on exit whatever happens (SIGTERM included)
    procs[:] = [subprocess.Popen([sys.executable, "-m", "tuner.cli", "worker", str(agent), "--state-dir",
                               str(work / f"{name}-state-{i}")], env=pg.env(), stdout=subprocess.DEVNULL,
                              stderr=open(work / f"{name}-{i}.log", "w"))  # noqa: SIM115
             for i in range(workers)]
    for p in procs:
        if p.wait(timeout=1800) != 0:
            raise SystemExit(f"a worker failed: see {work}/{name}-*.log")
    wall_s = time.monotonic() - t0
    n, span_s, per_hour = trials_per_hour(url, name)
    return n, span_s, per_hour, wall_s


def overhead(kind: str, url: str, work: Path, trials: int) -> list[float]:
    from tuner.agent import load_agent
    from tuner.fleet.worker import run_worker
    from tuner.loop import open_session

    agent = work / f"overhead-{kind}.yaml"
    write_spec(agent, fleet_sim_agent(name=f"overhead-{kind}", trials=trials, storage=url, batched_tokens=False,
                                      sampler={"name": "tpe", "seed": 0}))
    session = open_session(load_agent(agent), work / f"overhead-{kind}-state")
    result = run_worker(session)
    return [o.overhead_s * 1000 for o in result.outcomes]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--overhead-trials", type=int, default=30)
    ap.add_argument("--parts", default="workers,ray,overhead",
                    help="comma-separated: workers (1, 2, 4 workers), ray (2 nodes), overhead (PostgreSQL vs SQLite)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # unwinds: workers and PostgreSQL are stopped
    try:
        run(args)
    finally:
        for p in PROCS:
            if p.poll() is None:
                p.kill()


def run(args: argparse.Namespace) -> None:
    rows: list[tuple[Any, ...]] = []
    with tempfile.TemporaryDirectory() as d, postgres.start_postgres() as pg:
        work = Path(d)
        os.environ["PGPASSWORD"] = pg.password
        base = None
        parts = set(args.parts.split(","))
        for n in (1, 2, 4) if "workers" in parts else ():
            done, span_s, per_hour, wall_s = run_workers(pg, work, n, args.trials)
            base = base or per_hour
            rows.append((f"{n} worker(s)", done, span_s, wall_s, per_hour, base * n, per_hour / base))
            print(rows[-1], flush=True)
        if "ray" in parts:
            if base is None:
                raise SystemExit("the ray part is compared with one worker: run it with the workers part")
            import ray
            from ray.cluster_utils import Cluster

            node = {"num_cpus": 4, "num_gpus": 4, "object_store_memory": 100 * 1024 * 1024}
            cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
            cluster.add_node(**node)
            cluster.wait_for_nodes()
            try:
                extra = {"executor": {"kind": "ray", "address": cluster.address, "cpus_per_trial": 1},
                         "parallel_trials": 4}
                done, span_s, per_hour, wall_s = run_workers(pg, work, 1, args.trials, extra=extra,
                                                             gpus_per_trial=1, label="ray")
                rows.append(("Ray, 2 nodes, 4 at once", done, span_s, wall_s, per_hour, base * 4, per_hour / base))
                print(rows[-1], flush=True)
            finally:
                ray.shutdown()
                cluster.shutdown()
        over = {}
        if "overhead" in parts:
            over = {"SQLite": overhead("sqlite", f"sqlite:///{work / 'overhead.db'}", work, args.overhead_trials),
                    "PostgreSQL": overhead("postgresql", pg.create_database("overhead"), work, args.overhead_trials)}
    print()
    if rows:
        print_rows(args, rows)
    if over:
        print_overhead(args, over)


def print_rows(args: argparse.Namespace, rows: list[tuple[Any, ...]]) -> None:
    print(f"### Trials per hour (command target, fixed delays; {args.trials} trials per row)\n")
    print("| workers | trials | first start to last end (s) | wall incl. start-up (s) | trials/hour | ideal "
          "| vs 1 worker |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, done, span_s, wall_s, per_hour, ideal, ratio in rows:
        print(f"| {label} | {done} | {span_s:.1f} | {wall_s:.1f} | {per_hour:.0f} | {ideal:.0f} | {ratio:.2f}x |")


def print_overhead(args: argparse.Namespace, over: dict[str, list[float]]) -> None:
    print(f"\n### The tuner's own overhead per trial (ask, tell, bookkeeping; sim target, {args.overhead_trials} "
          "trials, MLflow off)\n")
    print("| storage | mean (ms) | median (ms) | p95 (ms) |")
    print("|---|---:|---:|---:|")
    for kind, ms in over.items():
        q = statistics.quantiles(ms, n=20)
        print(f"| {kind} | {statistics.mean(ms):.1f} | {statistics.median(ms):.1f} | {q[18]:.1f} |")


if __name__ == "__main__":
    main()
