"""The seed's inversion in the simulator: a "Flash"-style configuration against the plain defaults.

    .venv/bin/python experiments/seed-inversion/run.py > experiments/seed-inversion/table.md

Llama-3-8B on 8 x A100-80GB (the sim-8xa100 agent's target), noise off. Two scenarios:
- single task: one request at a time (closed loop, concurrency 1), 512 prompt tokens, 6,000 output tokens
  (the seed's single task: 14.7 tok/s x 6.8 min = about 6,000 tokens), 3 tasks measured after 1 warm-up;
- high concurrency: the agent's own workload (256 users, chat-like lengths).
"Flash" is what the simulator can express of the seed's optimisations (dynamic batching with a 100 ms timeout
and batches of 32 -> static batching, batch_timeout_ms 100, max_num_seqs 32; CUDA graphs -> FULL graphs);
the rest is listed in the README as not expressible.
"""

from __future__ import annotations

import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from tuner.agent import load_agent
from tuner.errors import TrialError
from tuner.spec import WorkloadSpec
from tuner.study.objectives import goodput_thresholds_ms
from tuner.targets.base import TrialContext
from tuner.targets.sim import SimTarget

ROOT = Path(__file__).resolve().parents[2]

PLAIN: dict[str, Any] = {}
FLASH: dict[str, Any] = {"batching": "static", "batch_timeout_ms": 100.0, "max_num_seqs": 32,
                         "enforce_eager": False, "cudagraph_mode": "FULL"}
SINGLE = WorkloadSpec.model_validate({
    "arrival": {"kind": "closed", "concurrency": 1}, "prompt_tokens": {"dist": "fixed", "value": 512},
    "output_tokens": {"dist": "fixed", "value": 6000}, "num_requests": 4, "warmup_requests": 1,
    "timeout_s": 3600})
# the seed's figures: task completion minutes and output tokens per second, plain (base) vs Flash
SEED = {"minutes": (6.8, 14.4), "tok_s": (14.7, 6.9)}


KEYS = [("e2el_ms.mean", "mean task time, s", 1e-3), ("output_throughput", "output tok/s", 1.0),
        ("ttft_ms.mean", "mean TTFT, ms", 1.0), ("itl_ms.p50", "median ITL, ms", 1.0)]


def measure(target: SimTarget, params: dict[str, Any], workload: WorkloadSpec, slos: Any) -> dict[str, float]:
    ctx = TrialContext(trial_number=0, state_dir=Path(tempfile.gettempdir()), seed=0,
                       stop_event=threading.Event())
    try:
        with target.deploy(params, ctx) as dep:
            m = dep.measure(workload, goodput_ms=goodput_thresholds_ms(slos), seed=0)
    except TrialError as exc:
        print(f"{params}: {exc.cause}: {exc}", file=sys.stderr)
        return {}
    return {key: m.value(key) for key, _, _ in KEYS}


def main() -> None:
    agent = load_agent(ROOT / "agents/sim-8xa100.yaml")
    target = SimTarget(agent.target_options.model_copy(update={"noise_cv": 0.0}), agent_dir=ROOT / "agents")
    rows = []
    for scen, wl in (("single task (1 user, 512 in / 6,000 out)", SINGLE),
                     ("high concurrency (agent workload, 256 users)", agent.spec.workload)):
        res = {name: measure(target, p, wl, agent.spec.slos) for name, p in (("plain", PLAIN), ("flash", FLASH))}
        rows.append((scen, res))
    out = ["| scenario | metric | plain | flash | flash / plain | seed: flash / plain |", "|---|---|---|---|---|---|"]
    for scen, res in rows:
        for key, label, scale in KEYS:
            p, f = res["plain"].get(key, float("nan")), res["flash"].get(key, float("nan"))
            seed = ""
            if scen.startswith("single") and key == "e2el_ms.mean":
                seed = f"{SEED['minutes'][1] / SEED['minutes'][0]:.2f} (14.4 vs 6.8 min)"
            if scen.startswith("single") and key == "output_throughput":
                seed = f"{SEED['tok_s'][1] / SEED['tok_s'][0]:.2f} (6.9 vs 14.7 tok/s)"
            out.append(f"| {scen} | {label} | {p * scale:,.1f} | {f * scale:,.1f} | {f / p:.2f} | {seed} |")
    print("\n".join(out))
    print(f"\nflash = {FLASH}; plain = the defaults of search_spaces/sim.yaml (vLLM 0.33 on an A100)", file=sys.stdout)


if __name__ == "__main__":
    main()
