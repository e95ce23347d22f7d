"""The suite's one real-engine scenario: the reference engine on this CPU, a small budget, through the tuner's loop.

    nice -n 5 .venv/bin/python experiments/search-suite/engine.py run [--seeds 3] [--trials 10] [--variants ...]
    .venv/bin/python experiments/search-suite/engine.py table

The agent is agents/quickstart.yaml (the tiny preset, one thread; mean TTFT minimised under p99 TTFT <= 2 s and
p99 ITL <= 250 ms) with a fixed Poisson rate instead of `auto` (the capacity search would cost each run a
minute) and 5 s of arrivals, so a trial costs ~8 s. Each variant of suite.VARIANTS runs seeds 0..N-1 with
`--trials` budget trials (open_session + run_cycle, storage in memory, tracking off, the real torch_engine
target). No ground truth can be afforded here (thousands of trials): each run's best is compared with its own
baseline (trial 0, measured minutes apart at about the same host load), and every figure moves with the host's
load (written next to each run).
"""

from __future__ import annotations

import argparse
import json
import os
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
    """Per variant: each run's baseline (trial 0) and best feasible mean TTFT, the best as a share of the run's own
    baseline (the same run, so about the same host load), feasible trials, the tuner's time per trial."""
    lines = ["| variant | seed | baseline mean TTFT ms | best feasible ms (trial) | baseline / best | feasible | "
             "tuner ms/trial | load 1-min before/after |", "|---|---|---|---|---|---|---|---|"]
    for v in VARIANTS:
        for r in sorted((r for r in runs if r["variant"] == v), key=lambda r: r["seed"]):
            feas = [(x, i) for i, x in enumerate(r["values"]) if x is not None]
            base = r["values"][0]
            best, at = min(feas) if feas else (None, None)
            gain = f"{base / best:.2f}x" if base and best else "-"
            lines.append(f"| {v} | {r['seed']} | {base if base is None else f'{base:.0f}'} | "
                         f"{'-' if best is None else f'{best:.0f} ({at})'} | {gain} | "
                         f"{len(feas)}/{len(r['values'])} | {1000 * r['overhead_s'] / max(1, r['trials']):.0f} | "
                         f"{r['load_before'][0]:g}/{r['load_after'][0]:g} |")
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
