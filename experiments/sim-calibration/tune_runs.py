"""Tuning runs on the real reference engine (tiny, CPU), with and without screening by the calibrated simulator.

    .venv/bin/python experiments/sim-calibration/tune_runs.py --rate R [--seeds 3] [--trials 8]
        [--variants tpe,tpe+screen,random] [--model model-cpu.json]

Each run is `tuner run`'s loop (open_session + run_cycle; storage in memory, tracking off) on
agents/quickstart.yaml at the fixed rate R (the collection's), its sampler replaced per variant (seed = the run's
seed): `tpe` is the agent's own sampler, `tpe+screen` the same with `screen: {model: ...}` (the model file fitted
by calibrate.py fit), `random` Optuna's random sampler. Every run is appended to runs.jsonl (rerun: runs already
there are skipped); the table (stdout, table-runs.md) compares each variant's best mean TTFT after k deployed
trials with the best configuration measured anywhere (the collection's table and every trial of these runs).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tuner.agent import load_agent
from tuner.loop import open_session, run_cycle
from tuner.placement.gpupool import GpuPool
from tuner.tracking.tracker import Tracker

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
KS = (2, 4, 6, 8, 10)


def sampler_of(name: str, seed: int, model: str) -> dict[str, Any]:
    agent = load_agent(ROOT / "agents/quickstart.yaml")
    own = {k: v for k, v in agent.spec.sampler.model_dump().items() if v is not None and k != "screen"}
    if name == "random":
        return {"name": "random", "seed": seed}
    if name == "tpe":
        return {**own, "seed": seed}
    if name == "tpe+screen":
        return {**own, "seed": seed, "screen": {"model": str(HERE / model)}}
    raise SystemExit(f"unknown variant {name!r}")


def one_run(variant: str, seed: int, trials: int, rate: float, model: str) -> dict[str, Any]:
    agent = load_agent(ROOT / "agents/quickstart.yaml")
    spec = agent.spec
    spec = spec.model_copy(update={
        "workload": spec.workload.with_rate(rate), "storage": "memory:",
        "sampler": type(spec.sampler).model_validate(sampler_of(variant, seed, model)),
        "tracking": spec.tracking.model_copy(update={"enabled": False})})
    agent = agent.model_copy(update={"spec": spec})
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tune-runs-") as tmp:
        d = Path(tmp)
        session = open_session(agent, d, tracker=Tracker("file:" + str(d / "mlruns"), spec.name, enabled=False))
        result = run_cycle(session, trials=trials, gpu_pool=GpuPool([]))
        screened = [t for t in session.study.trials() if t.user_attrs.get("screened")]
        outcomes = sorted(result.outcomes, key=lambda o: o.number)
        return {"variant": variant, "seed": seed, "trials": trials, "rate_per_s": rate,
                "wall_s": round(time.monotonic() - t0, 1),
                "outcomes": [{"number": o.number, "params": o.params, "value": o.values[0] if o.values else None,
                              "feasible": o.feasible, "cause": o.cause, "duration_s": round(o.duration_s, 2)}
                             for o in outcomes],
                "screened": [{"number": t.number, "params": t.params, "reason": t.user_attrs.get("error", "")}
                             for t in screened]}


def best_after(run: dict[str, Any], k: int) -> float:
    vals = [o["value"] for o in run["outcomes"][:k] if o["feasible"] and o["value"] is not None]
    return min(vals) if vals else math.inf


def table(runs: list[dict[str, Any]], optimum: float, source: str) -> str:
    ks = [k for k in KS if k <= max(r["trials"] for r in runs)]
    lines = [f"agents/quickstart.yaml at {runs[0]['rate_per_s']:g} req/s, mean TTFT (minimize); optimum "
             f"{optimum:.1f} ms ({source}); ratio = optimum / best feasible after k deployed trials "
             "(1 = the optimum)", "",
             "| variant | seeds | " + " | ".join(f"k={k} median / worst" for k in ks) +
             " | trials to 90% (median; seeds) | deployed trials feasible | screened proposals per run (mean) | "
             "wall s per run (mean) |",
             "|---|---|" + "---|" * len(ks) + "---|---|---|---|"]
    for variant in dict.fromkeys(r["variant"] for r in runs):
        rs = [r for r in runs if r["variant"] == variant]
        cells = []
        for k in ks:
            ratios = [optimum / best_after(r, k) for r in rs]
            cells.append(f"{statistics.median(ratios):.3f} / {min(ratios):.3f}")
        reach = []
        for r in rs:
            hit = next((k for k in range(1, len(r["outcomes"]) + 1) if optimum / best_after(r, k) >= 0.9), None)
            reach.append(hit)
        got = sorted(x for x in reach if x is not None)
        med = statistics.median([x if x is not None else math.inf for x in reach])
        lines.append(f"| {variant} | {len(rs)} | " + " | ".join(cells) +
                     f" | {'>' + str(rs[0]['trials']) if math.isinf(med) else f'{med:.0f}'} ({len(got)}/{len(rs)}) | "
                     f"{sum(o['feasible'] for r in rs for o in r['outcomes'])}/{sum(len(r['outcomes']) for r in rs)} | "
                     f"{statistics.mean(len(r['screened']) for r in rs):.1f} | "
                     f"{statistics.mean(r['wall_s'] for r in rs):.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, required=True)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--variants", default="tpe,tpe+screen,random")
    ap.add_argument("--model", default="model-cpu.json")
    ap.add_argument("--out", default=str(HERE / "runs.jsonl"))
    ap.add_argument("--table-only", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    runs = [json.loads(x) for x in out.read_text().splitlines() if x.strip()] if out.exists() else []
    if not args.table_only:
        for seed in range(args.seeds):
            for variant in args.variants.split(","):
                if any(r["variant"] == variant and r["seed"] == seed for r in runs):
                    continue
                run = one_run(variant, seed, args.trials, args.rate, args.model)
                runs.append(run)
                with out.open("a") as f:
                    f.write(json.dumps(run) + "\n")
                print(f"{variant} seed {seed}: best {best_after(run, args.trials):.1f} ms, {len(run['screened'])} "
                      f"screened, {run['wall_s']:.0f} s", file=sys.stderr, flush=True)
    best_runs = min((o["value"] for r in runs for o in r["outcomes"] if o["feasible"] and o["value"] is not None),
                    default=math.inf)
    optimum, source = best_runs, "the best trial of these runs"
    data = HERE / "data.jsonl.gz"
    if data.exists():
        sys.path.insert(0, str(HERE))
        from calibrate import read_data, usable

        agent = load_agent(ROOT / "agents/quickstart.yaml")
        from tuner.measure.measurement import Measurement
        from tuner.study.objectives import evaluate

        table_best = math.inf
        for r in usable(read_data(data)):
            ev = evaluate(Measurement(summary=r["summary"]), agent.spec.objectives, agent.spec.slos)
            if ev.feasible:
                table_best = min(table_best, ev.values[0])
        if table_best < optimum:
            optimum, source = table_best, "the best configuration of the collection's table"
    text = table(runs, optimum, source)
    (HERE / "table-runs.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
