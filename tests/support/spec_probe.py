"""What a sim agent's search space can hand the simulator that it refuses at every trial, whatever the other
knobs: each parameter's choices and range ends (the others at their defaults) and each fixed value, resolved
by the sim target. `tuner validate` must have refused a space with any of them (the spec fuzz test and the
fault campaign check every accepted spec with it).

    refused_values(load_agent(path))   # [] for a space validate may accept
"""

from __future__ import annotations

from typing import Any

# refusals that depend on two knobs at once: a space may hold values that clash only in some combinations
# (its constraints, or the failed trials, sort them out), so one value against the defaults proves nothing;
# and a value the hardware lacks (fp8 KV cache on an A100): one search space serves several hardware
# profiles, and the trials that draw it are recorded as invalid_config
COMBINATION_RULES = ("must be greater than or equal to max_num_seqs", "is smaller than max_model_len",
                     "is not supported on")


def _values(p: Any) -> list[Any]:
    s = p.spec
    if s.type in ("categorical", "bool"):
        return list(p.grid())
    ends = [v for v in (s.low, s.high) if v is not None]
    return [int(v) for v in ends] if s.type == "int" else [float(v) for v in ends]


def refused_values(agent: Any) -> list[str]:
    """'knob=value: why' for every such value (an empty list for a sound space)."""
    from tuner.agent import preflight
    from tuner.errors import DeployError

    target, space = preflight(agent)
    if not hasattr(target, "resolve"):
        return []
    base = space.full_config(space.defaults())
    out: list[str] = []
    candidates = [(p.name, v) for p in space.params for v in _values(p)]
    candidates += list(getattr(space, "fixed", {}).items())
    for name, value in candidates:
        try:
            target.resolve({**base, name: value})
        except DeployError as exc:
            if exc.cause == "invalid_config" and not any(rule in str(exc) for rule in COMBINATION_RULES):
                out.append(f"{name}={value!r}: {exc}")
        except Exception:  # noqa: BLE001, S112 - infeasible or out of memory: a trial measures that
            continue
    return out


def spec_paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a nested spec (dict keys and list indices), parents before children: where a fuzzer may
    change, remove or add a value."""
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += spec_paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += spec_paths(v, (*prefix, i))
    return out
