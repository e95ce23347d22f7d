"""The suite's one real-engine scenario: the reference engine on this CPU, a small budget, through the tuner's loop.

    nice -n 5 .venv/bin/python experiments/search-suite/engine.py run [--seeds 3] [--trials 10] [--variants ...]
    .venv/bin/python experiments/search-suite/engine.py table

The agent is agents/quickstart.yaml (the tiny preset, one thread; mean TTFT minimised under p99 TTFT <= 2 s and
p99 ITL <= 250 ms) with a fixed Poisson rate instead of `auto` (the capacity search would cost each run a
minute) and 5 s of arrivals, so a trial costs ~8 s. Each variant of suite.VARIANTS runs seeds 0..N-1 with
`--trials` budget trials (open_session + run_cycle, storage in memory, tracking off, the real torch_engine
target). No ground truth can be afforded here (thousands of trials): a variant's best is compared with the best
feasible mean TTFT any run measured, and every figure moves with the host's load (written next to each run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
from suite import VARIANTS  # noqa: E402

from tuner.agent import Agent, load_agent  # noqa: E402
from tuner.loop import open_session, run_cycle  # noqa: E402
from tuner.placement.gpupool import GpuPool  # noqa: E402
from tuner.tracking.tracker import Tracker  # noqa: E402

RESULTS = HERE / "results" / "engine.json"
RATE_PER_S = 3.0
DURATION_S = 5.0


def agent_of(variant: str, seed: int, folder: Path) -> Agent:
    import yaml

    data = yaml.safe_load((ROOT / "agents" / "quickstart.yaml").read_text())
    data["workload"]["arrival"] = {"kind": "poisson", "rate_per_s": RATE_PER_S}
    data["workload"]["duration_s"] = DURATION_S
    data["sampler"] = {**VARIANTS[variant], "seed": seed}
    data["tracking"] = {"enabled": False}
    data["storage"] = "memory:"
    p = folder / "engine.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_agent(p)


def run_one(variant: str, seed: int, trials: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="suite-engine-") as tmp:
        d = Path(tmp)
        agent = agent_of(variant, seed, d)
        tracker = Tracker("file:" + str(d / "mlruns"), agent.spec.name, enabled=False)
        load_before = os.getloadavg()
        t0 = time.monotonic()
        session = open_session(agent, d / "state", tracker=tracker)
        result = run_cycle(session, trials=trials, gpu_pool=GpuPool([]))
        outcomes = sorted(result.outcomes, key=lambda o: o.number)
        budget = [o for o in outcomes if o.repeat_of is None]
        return {"variant": variant, "seed": seed, "wall_s": round(time.monotonic() - t0, 1),
                "load_before": [round(x, 2) for x in load_before],
                "load_after": [round(x, 2) for x in os.getloadavg()],
                "values": [o.values[0] if o.feasible and o.values else None for o in budget],
                "causes": [o.cause or ("ok" if o.feasible else "slo") for o in budget],
                "params": [o.params for o in budget],
                "overhead_s": round(sum(o.overhead_s for o in outcomes), 4), "trials": len(outcomes)}


def table(runs: list[dict[str, Any]]) -> str:
    feas = [v for r in runs for v in r["values"] if v is not None]
    if not feas:
        return "no feasible trial in any run"
    best_all = min(feas)
    lines = [f"Best feasible mean TTFT of any run: {best_all:.1f} ms (the reference: no ground truth).", "",
             "| variant | seeds | best after 5 (median; worst) | after 10 | best/reference at 10 (median) | "
             "feasible trials | tuner ms/trial | load before/after (1-min) |", "|---|---|---|---|---|---|---|---|"]
    for v in VARIANTS:
        rs = [r for r in runs if r["variant"] == v]
        if not rs:
            continue

        def best(r: dict[str, Any], k: int) -> float:
            xs = [x for x in r["values"][:k] if x is not None]
            return min(xs) if xs else float("inf")

        b5 = [best(r, 5) for r in rs]
        b10 = [best(r, 10) for r in rs]
        n_feas = sum(x is not None for r in rs for x in r["values"])
        n_all = sum(len(r["values"]) for r in rs)
        ms = 1000 * sum(r["overhead_s"] for r in rs) / max(1, sum(r["trials"] for r in rs))
        loads = ", ".join(f"{r['load_before'][0]:g}/{r['load_after'][0]:g}" for r in rs)
        lines.append(f"| {v} | {len(rs)} | {statistics.median(b5):.1f}; {max(b5):.1f} | "
                     f"{statistics.median(b10):.1f}; {max(b10):.1f} | {best_all / statistics.median(b10):.3f} | "
                     f"{n_feas}/{n_all} | {ms:.0f} | {loads} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=("run", "table"))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--variants", default="auto,old-default,random")
    a = ap.parse_args()
    runs: list[dict[str, Any]] = json.loads(RESULTS.read_text()) if RESULTS.is_file() else []
    if a.cmd == "run":
        for seed in range(a.seeds):  # seeds outermost: host-load drift is shared by the variants
            for v in a.variants.split(","):
                r = run_one(v, seed, a.trials)
                runs = [x for x in runs if (x["variant"], x["seed"]) != (v, seed)] + [r]
                RESULTS.write_text(json.dumps(runs) + "\n")
                print(f"{v} seed {seed}: {r['wall_s']} s, values {r['values']}", file=sys.stderr, flush=True)
        return
    print(table(runs))


if __name__ == "__main__":
    main()
