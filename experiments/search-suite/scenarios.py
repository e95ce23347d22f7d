"""The scenarios of the search suite: sim agents across the three GPU types and the three models, objectives to
maximise and to minimise, closed and open arrivals, loose and tight SLOs. Each is written as an agent file
(`agent_file`) over the sim target's own search space (search_spaces/sim.yaml; the default layout raised where
the model does not fit one GPU), noise off, with no sampler options but the seed."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@dataclass(frozen=True)
class Scenario:
    name: str
    hardware: str
    model: str
    gpus: int
    arrival: dict[str, Any]
    objective: tuple[str, str]  # metric, direction
    slos: tuple[tuple[str, float], ...] = ()
    prompt_mean: int = 512
    output_mean: int = 192
    num_requests: int = 150
    default_tp: int = 1
    held_out: bool = False
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


SCENARIOS: list[Scenario] = [
    Scenario("a100-8b-closed-throughput", "a100-80gb-sxm", "llama-3-8b", 8, {"kind": "closed", "concurrency": 128},
             ("output_throughput", "maximize"), (("ttft_ms.p99", 2000), ("itl_ms.p99", 100)),
             note="the shipped landscape, smaller: the layout dominates; infeasible at the defaults"),
    Scenario("h100-70b-poisson-goodput-tight", "h100-sxm", "llama-3-70b", 8, {"kind": "poisson", "rate_per_s": 6},
             ("request_goodput", "maximize"), (("itl_ms.p99", 40), ("ttft_ms.p99", 3000)), default_tp=2,
             note="70B at a fixed rate, tight p99 ITL"),
    Scenario("h200-1b-4gpu-poisson-ttft", "h200", "llama-1.1b", 4, {"kind": "poisson", "rate_per_s": 120},
             ("ttft_ms.p99", "minimize"), note="a small model at a high rate, 4 GPUs, minimise p99 TTFT"),
    Scenario("a100-8b-2users-e2e", "a100-80gb-sxm", "llama-3-8b", 8, {"kind": "closed", "concurrency": 2},
             ("e2el_ms.mean", "minimize"), prompt_mean=1024, output_mean=512, num_requests=40,
             note="two users with long tasks: minimise mean end-to-end latency"),
    Scenario("h100-8b-4gpu-throughput-tight-itl", "h100-sxm", "llama-3-8b", 4, {"kind": "closed", "concurrency": 256},
             ("output_throughput", "maximize"), (("itl_ms.p99", 30),), note="4 GPUs, tight ITL"),
    Scenario("h200-70b-closed-throughput", "h200", "llama-3-70b", 8, {"kind": "closed", "concurrency": 64},
             ("output_throughput", "maximize"), (("ttft_ms.p99", 5000),), num_requests=120,
             note="70B fits one H200: loose SLO"),
    Scenario("a100-1b-2gpu-ttft-p90", "a100-80gb-sxm", "llama-1.1b", 2, {"kind": "closed", "concurrency": 32},
             ("ttft_ms.p90", "minimize"), (("itl_ms.p99", 50),),
             note="2 GPUs: the layout does not dominate"),
    Scenario("h100-8b-1gpu-goodput", "h100-sxm", "llama-3-8b", 1, {"kind": "poisson", "rate_per_s": 12},
             ("request_goodput", "maximize"), (("ttft_ms.p99", 500), ("itl_ms.p99", 50)),
             note="one GPU: no layout to choose, only the engine knobs"),
    Scenario("h200-8b-poisson-e2e-p99", "h200", "llama-3-8b", 8, {"kind": "poisson", "rate_per_s": 40},
             ("e2el_ms.p99", "minimize"), (("ttft_ms.p99", 1000),), note="minimise p99 end-to-end at a fixed rate"),
    Scenario("a100-70b-poisson-goodput", "a100-80gb-sxm", "llama-3-70b", 8, {"kind": "poisson", "rate_per_s": 3},
             ("request_goodput", "maximize"), (("itl_ms.p99", 80), ("ttft_ms.p99", 4000)), default_tp=2,
             note="70B on A100s: needs TP >= 2"),
    # held out: not looked at while the default was chosen
    Scenario("h100-1b-8gpu-closed-tight-ttft", "h100-sxm", "llama-1.1b", 8, {"kind": "closed", "concurrency": 512},
             ("output_throughput", "maximize"), (("ttft_ms.p99", 300),), held_out=True,
             note="held out: many users, tight TTFT"),
    Scenario("a100-8b-4gpu-tpot", "a100-80gb-sxm", "llama-3-8b", 4, {"kind": "poisson", "rate_per_s": 10},
             ("tpot_ms.mean", "minimize"), (("ttft_ms.p99", 1500),), held_out=True,
             note="held out: minimise mean TPOT on 4 GPUs"),
    # held out, added with the model-guided default (issue 26, step 3) and never run before its final table
    Scenario("h200-8b-2gpu-closed-tight-itl", "h200", "llama-3-8b", 2, {"kind": "closed", "concurrency": 96},
             ("output_throughput", "maximize"), (("itl_ms.p99", 25),), held_out=True,
             note="held out: two GPUs, a tight ITL"),
    Scenario("a100-70b-closed-e2e", "a100-80gb-sxm", "llama-3-70b", 8, {"kind": "closed", "concurrency": 16},
             ("e2el_ms.mean", "minimize"), (("ttft_ms.p99", 10000),), default_tp=2, num_requests=80, held_out=True,
             note="held out: 70B, minimise mean end-to-end latency"),
    Scenario("h100-1b-4gpu-long-prompts-goodput", "h100-sxm", "llama-1.1b", 4, {"kind": "poisson", "rate_per_s": 80},
             ("request_goodput", "maximize"), (("ttft_ms.p99", 400), ("itl_ms.p99", 20)), prompt_mean=2048,
             output_mean=128, held_out=True, note="held out: long prompts at a high rate, two tight SLOs"),
    # held out, added with step 5 (the descent while infeasible, the repair) before any variant ran on them
    Scenario("a100-8b-2gpu-closed-tight-itl", "a100-80gb-sxm", "llama-3-8b", 2, {"kind": "closed", "concurrency": 64},
             ("output_throughput", "maximize"), (("itl_ms.p99", 35),), held_out=True,
             note="held out (step 5): two A100s, a tight ITL"),
    Scenario("h100-70b-4gpu-poisson-goodput", "h100-sxm", "llama-3-70b", 4, {"kind": "poisson", "rate_per_s": 4},
             ("request_goodput", "maximize"), (("itl_ms.p99", 50), ("ttft_ms.p99", 2000)), default_tp=2,
             held_out=True, note="held out (step 5): 70B on four H100s, two SLOs"),
    Scenario("h200-1b-2gpu-closed-ttft-itl", "h200", "llama-1.1b", 2, {"kind": "closed", "concurrency": 256},
             ("output_throughput", "maximize"), (("ttft_ms.p99", 500), ("itl_ms.p99", 15)), held_out=True,
             note="held out (step 5): a small model, many users, two tight SLOs"),
    Scenario("a100-8b-8gpu-poisson-e2e-p90", "a100-80gb-sxm", "llama-3-8b", 8, {"kind": "poisson", "rate_per_s": 30},
             ("e2el_ms.p90", "minimize"), (("itl_ms.p99", 60),), held_out=True,
             note="held out (step 5): minimise p90 E2E under an ITL SLO"),
]


def by_name(name: str) -> Scenario:
    for s in SCENARIOS:
        if s.name == name:
            return s
    raise KeyError(name)


def agent_data(s: Scenario) -> dict[str, Any]:
    space = yaml.safe_load((ROOT / "search_spaces" / "sim.yaml").read_text())
    space["params"]["tensor_parallel_size"]["default"] = s.default_tp
    return {
        "name": s.name,
        "description": s.note,
        "target": {"kind": "sim", "hardware": s.hardware, "model": s.model, "num_gpus": s.gpus,
                   "max_model_len": 8192, "noise_cv": 0.0},
        "search_space": space,
        "workload": {"arrival": s.arrival,
                     "prompt_tokens": {"dist": "lognormal", "mean": s.prompt_mean, "sigma": 0.8, "min": 16,
                                       "max": 4096},
                     "output_tokens": {"dist": "lognormal", "mean": s.output_mean, "sigma": 0.6, "min": 8,
                                       "max": 1024},
                     "num_requests": s.num_requests,
                     "warmup_requests": min(s.arrival.get("concurrency", 16), s.num_requests // 4),
                     "timeout_s": 120, "seed": 0},
        "objectives": [{"metric": s.objective[0], "direction": s.objective[1]}],
        "slos": [{"metric": m, "max": v} for m, v in s.slos],
        "budget": {"trials": 30},
        "sampler": {"seed": 0},
        "tracking": {"enabled": False},
        **s.extra,
    }


def agent_file(s: Scenario, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / f"{s.name}.yaml"
    p.write_text(yaml.safe_dump(agent_data(s), sort_keys=False))
    return p
