from pathlib import Path

import pytest

from tuner.errors import ConfigError
from tuner.search.space import load_space, parse_space

GOOD = {
    "params": {
        "max_num_seqs": {"type": "int", "low": 8, "high": 512, "log": True, "default": 256},
        "max_num_batched_tokens": {"type": "int", "low": 256, "high": 16384, "default": 2048},
        "enforce_eager": {"type": "bool", "default": False},
        "capture": {"type": "int", "low": 8, "high": 512, "default": 512, "when": "not enforce_eager"},
        "mode": {"type": "categorical", "choices": ["a", "b"], "default": "a"},
        "util": {"type": "float", "low": 0.5, "high": 0.95, "default": 0.9},
        "gpu_only": {"type": "bool", "default": False, "when": "device == 'cuda'"},
    },
    "constraints": ["max_num_batched_tokens >= max_num_seqs"],
    "facts": {"device": "cpu"},
}


def test_defaults_apply_conditions() -> None:
    space = parse_space(GOOD, file="x.yaml")
    d = space.defaults()
    assert d["capture"] == 512 and "gpu_only" not in d
    assert space.bind_facts({"device": "cuda", "other": 1}).defaults()["gpu_only"] is False


def test_violations_and_inactive() -> None:
    space = parse_space(GOOD, file="x.yaml")
    assert space.violations({"max_num_seqs": 512, "max_num_batched_tokens": 256}) == [
        "max_num_batched_tokens >= max_num_seqs"]
    assert space.violations(space.defaults()) == []
    cap = space.by_name["capture"]
    assert not space.active(cap, {"enforce_eager": True})


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "space.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("params:\n  a: {type: int, low: 5, high: 1, default: 3}\n", 2, "low (5.0) must be <= high"),
        ("params:\n  a: {type: int, low: 1, high: 9, default: 30}\n", 2, "outside"),
        ("params:\n  a: {type: float, low: 0, high: 1, log: true, default: 0.5}\n", 2, "log scale needs low > 0"),
        ("params:\n  a: {type: categorical, choices: [x, y], default: z}\n", 2, "not one of the choices"),
        ("params:\n  a: {type: bool, default: 3}\n", 2, "true or false"),
        ("params:\n  a: {type: int, low: 1, high: 9, default: 3, colour: red}\n", 2, "unknown field"),
        ("params:\n  a: {type: wat, default: 3}\n", 2, "type"),
        ("params:\n  a: {type: bool, default: true}\nconstraints:\n  - b > 1\n", 4, "unknown parameter"),
        ("params:\n  a: {type: bool, default: true, when: 'import os'}\n", 2, "syntax error"),
        ("params:\n  a: {type: bool, default: true, when: 'b'}\n  b: {type: bool, default: true}\n", 2,
         "must be declared before"),
        ("params:\n  a: {type: int, low: 1, high: 9, default: 3}\nconstraints: ['a > 5']\n", 3,
         "defaults (baseline) violate"),
        ("params: {}\n", 1, "params"),
        ("params:\n  a: [unclosed\n", 3, "invalid YAML"),
    ],
)
def test_located_errors(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    p = _write(tmp_path, text)
    with pytest.raises(ConfigError) as ei:
        load_space(p)
    msg = str(ei.value)
    assert fragment in msg
    assert msg.startswith(f"{p}:{line}:"), msg


def test_distributions() -> None:
    space = parse_space(GOOD, file="x.yaml")
    dist = space.by_name["max_num_seqs"].distribution()
    assert dist.log and dist.low == 8 and dist.high == 512
    assert space.by_name["mode"].grid() == ["a", "b"]
    assert space.by_name["util"].grid(3) == [0.5, 0.725, 0.95]
