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


SPECIAL_KINDS = ("fifo", "dir", "devzero", "devnull", "socket")


def special_file(kind: str, d: Any, name: str | None = None) -> Any:
    """A path of `kind` under the folder `d` (a pathlib.Path) that a reader must refuse: fifo (a named pipe: an
    open for reading blocks until a writer comes), dir, devzero (a link to /dev/zero: endless bytes), devnull
    (a link to /dev/null: a device that reads empty), socket (a bound Unix socket)."""
    import os
    import socket

    p = d / (name or f"special-{kind}")
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "dir":
        p.mkdir()
    elif kind in ("devzero", "devnull"):
        p.symlink_to(f"/dev/{kind[3:]}")
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(p))
        s.close()
    else:
        raise ValueError(kind)
    return p


def with_duplicate_key(text: str, rng: Any) -> tuple[str, int]:
    """`text` (a block-style YAML mapping, as yaml.safe_dump writes it) with one of its keys written a second
    time in the same mapping, after the block that key opens: (the new text, the line of the second key)."""
    lines = text.splitlines()
    keyed = [i for i, line in enumerate(lines) if ":" in line and not line.lstrip().startswith("-")
             and not line.lstrip().startswith("#")]
    i = rng.choice(keyed)
    indent = len(lines[i]) - len(lines[i].lstrip())
    j = i + 1
    while j < len(lines):  # the block the key opens: deeper lines, and a sequence's dashes at its own indent
        ind = len(lines[j]) - len(lines[j].lstrip())
        if ind > indent or (ind == indent and lines[j].lstrip().startswith("- ")):
            j += 1
            continue
        break
    key = lines[i].split(":", 1)[0]
    out = [*lines[:j], f"{key}: {rng.choice(['1', 'x', '[]', '{}', 'null'])}", *lines[j:]]
    return "\n".join(out) + "\n", j + 1


def nested_tower(rng: Any, name: str = "max_num_seqs") -> str:
    """An expression over lists of lists repeated, each level within the evaluator's per-step bound (at most
    1000 items) while the whole nests 10**5..10**12 elements, compared, searched or passed to max."""
    depth = rng.randint(2, 4)
    tower = f"[{rng.choice(['1', name, 'True', repr('ab')])}]"
    for k in (rng.randint(100, 1000) for _ in range(depth)):
        tower = f"[{tower}]*{k}" if tower.startswith("[[") else f"{tower}*{k}"
    return rng.choice([f"{tower} == {tower}", f"{tower} != {tower}", f"{name} in {tower}", f"{tower} < {tower}",
                       f"max({tower}, {tower}) == 1"])


def work_chain(rng: Any, max_work: int = 100_000) -> str:
    """A chain of comparisons of strings of about 900-1000 characters each (within the size limit) whose
    walks add up past `max_work`: only a budget counted across the whole evaluation refuses it."""
    n = rng.randint(900, 1000)
    piece = rng.choice(["a", "xy", "b7c"])
    each = f"{piece!r}*{n // len(piece)}"
    return each + "".join(f" {rng.choice(['==', '<=', '>='])} {each}" for _ in range(max_work // (2 * n - 6) + 4))


# counts, durations and periods far past any bound (the spec fuzzers put them anywhere)
HUGE_NUMBERS = (10**10, 10**12, 99999999999999999999, 1e10, 1e12, 1e308, 2**63, "99999999999999999999d", "1e308s")
