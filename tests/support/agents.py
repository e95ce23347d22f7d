"""The agent factory: one valid sim agent, changed by keyword, written as YAML (instead of copied YAML).

`agent_spec(**changes)` returns the spec as a dict; `write_agent(path, **changes)` writes it;
`fake_server_agent(...)` is the command-target agent whose server is tests/support/fake_openai_server.py
(fixed delays per trial; the fleet, parallel-trial and scaling runs), and `fleet_sim_agent(...)` the sim agent of
runs sharing a study (the fleet tests, the scaling experiment's overhead part), changed the same way. A change is a
top-level key (`name="x"`, `slos=[]`, `schedule={"every": "5s"}`) or a dotted path given in `at`
(`at={"workload.arrival.concurrency": 8, "target.noise_cv": 0.02}`); the value None removes the key.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

SIM_AGENT: dict[str, Any] = {
    "name": "agent",
    "target": {"kind": "sim", "hardware": "a100-80gb-sxm", "model": "llama-3-8b", "num_gpus": 8},
    "search_space": {"params": {
        "max_num_seqs": {"type": "int", "low": 8, "high": 512, "log": True, "default": 16},
        "max_num_batched_tokens": {"type": "int", "low": 256, "high": 16384, "log": True, "default": 2048},
    }, "constraints": ["max_num_batched_tokens >= max_num_seqs"]},
    "workload": {
        "arrival": {"kind": "closed", "concurrency": 64},
        "prompt_tokens": {"dist": "fixed", "value": 256},
        "output_tokens": {"dist": "fixed", "value": 64},
        "num_requests": 100,
    },
    "objectives": [{"metric": "output_throughput", "direction": "maximize"}],
    "slos": [{"metric": "ttft_ms.p99", "max": 60000}],
    "sampler": {"name": "random", "seed": 0},
}


FAKE_SERVER = Path(__file__).resolve().parent / "fake_openai_server.py"


def fake_server_agent(*, ttft_ms: Sequence[int], itl_ms: int, output_tokens: int, num_requests: int,
                      server_args: Sequence[str] = (), at: Mapping[str, Any] | None = None,
                      **changes: Any) -> dict[str, Any]:
    """A command agent tuning the fake server's `--ttft-ms` over `ttft_ms` (the first is the default), its
    `--itl-ms` fixed; closed loop of 2, 16-token prompts; random sampler; MLflow off."""
    spec: dict[str, Any] = {
        "name": "fake",
        "target": {"kind": "command", "model": "fake", "startup_timeout_s": 60,
                   "command": ["{python}", str(FAKE_SERVER), "--port", "{port}", "--ttft-ms", "{ttft_ms}",
                               "--itl-ms", str(itl_ms), *server_args]},
        "search_space": {"params": {"ttft_ms": {"type": "categorical", "choices": list(ttft_ms),
                                                "default": ttft_ms[0]}}},
        "workload": {"arrival": {"kind": "closed", "concurrency": 2},
                     "prompt_tokens": {"dist": "fixed", "value": 16},
                     "output_tokens": {"dist": "fixed", "value": output_tokens}, "num_requests": num_requests},
        "objectives": [{"metric": "output_throughput", "direction": "maximize"}],
        "sampler": {"name": "random", "seed": 0},
        "tracking": {"enabled": False},
    }
    return _changed(spec, at, changes)


def fleet_sim_agent(*, name: str, trials: int, storage: str, batched_tokens: bool = True,
                    at: Mapping[str, Any] | None = None, **changes: Any) -> dict[str, Any]:
    """A sim agent for runs sharing a study (workers, Ray, the overhead of a storage): TP 1-4 and max_num_seqs
    (and max_num_batched_tokens unless `batched_tokens` is false), no SLO, closed loop of 32 over 64-512-token
    prompts, `trials` in the budget, the study in `storage`; random sampler, MLflow off unless changed."""
    params: dict[str, Any] = {
        "tensor_parallel_size": {"type": "categorical", "choices": [1, 2, 4], "default": 1},
        "max_num_seqs": {"type": "int", "low": 16, "high": 256, "log": True, "default": 128}}
    if batched_tokens:
        params["max_num_batched_tokens"] = {"type": "int", "low": 1024, "high": 16384, "log": True, "default": 8192}
    spec = agent_spec(name=name, search_space={"params": params}, slos=None, budget={"trials": trials},
                      storage=storage, tracking={"enabled": False},
                      at={"workload.arrival.concurrency": 32,
                          "workload.prompt_tokens": {"dist": "uniform", "low": 64, "high": 512}})
    return _changed(spec, at, changes)


def agent_spec(at: Mapping[str, Any] | None = None, **changes: Any) -> dict[str, Any]:
    return _changed(copy.deepcopy(SIM_AGENT), at, changes)


def _changed(spec: dict[str, Any], at: Mapping[str, Any] | None, changes: Mapping[str, Any]) -> dict[str, Any]:
    for key, value in [*changes.items(), *(at or {}).items()]:
        *parents, last = key.split(".")
        node = spec
        for p in parents:
            node = node.setdefault(p, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = copy.deepcopy(value)
    return spec


def write_agent(path: Path, at: Mapping[str, Any] | None = None, **changes: Any) -> Path:
    return write_spec(path, agent_spec(at, **changes))


def write_spec(path: Path, spec: Mapping[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dict(spec), sort_keys=False, default_flow_style=None, width=1000))
    return path
