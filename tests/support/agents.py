"""The agent factory: one valid sim agent, changed by keyword, written as YAML (instead of copied YAML).

`agent_spec(**changes)` returns the spec as a dict; `write_agent(path, **changes)` writes it. A change is a
top-level key (`name="x"`, `slos=[]`, `schedule={"every": "5s"}`) or a dotted path given in `at`
(`at={"workload.arrival.concurrency": 8, "target.noise_cv": 0.02}`); the value None removes the key.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
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


def agent_spec(at: Mapping[str, Any] | None = None, **changes: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SIM_AGENT)
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
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(agent_spec(at, **changes), sort_keys=False, default_flow_style=None, width=1000))
    return path
