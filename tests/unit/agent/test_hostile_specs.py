"""Specs written to hurt: expressions and YAML that used to crash or hang `validate` (a division by zero,
a tower of powers, a string of 10**10 characters, a self-referencing anchor, a "billion laughs" of
aliases, NaN and infinities) are located errors, fast and small."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tuner.agent import load_agent
from tuner.base.expr import Expr, ExprError
from tuner.base.yamlio import MAX_YAML_NODES, load_yaml
from tuner.cli.main import app
from tuner.errors import ConfigError

SIM_AGENT = Path(__file__).resolve().parents[3] / "agents" / "sim-8xa100.yaml"


@pytest.mark.parametrize(("src", "env", "match"), [
    ("a / 0 > 1", {"a": 1}, "division by zero"),
    ("a // b", {"a": 1, "b": 0}, "division by zero"),
    ("9 ** 9 ** 9 > 1", {}, "over 2\\*\\*256"),
    ("2 ** 100000", {}, "over 2\\*\\*256"),
    ("'x' * 10 ** 10", {}, "over 1000 items"),
    ("[1] * 10 ** 6", {}, "over 1000 items"),
    ("'%0999999999d' % 1", {}, "% takes numbers"),
    ("a < 'x'", {"a": 1}, "not supported"),
    ("10.0 ** 400", {}, "over 2\\*\\*256"),
    ("(-8) ** 0.5 > 1", {}, "complex"),
    ("a in 5", {"a": 1}, "not iterable"),
])
def test_evaluation_errors_are_expr_errors_and_fast(src: str, env: dict, match: str) -> None:
    cpu0 = time.thread_time()  # CPU time (what a tower of powers burns), not wall time a busy host stretches
    with pytest.raises(ExprError, match=match):
        Expr(src)(env)
    assert time.thread_time() - cpu0 < 1.0  # each takes well under 1 ms of CPU


@pytest.mark.parametrize("src", [
    " + ".join(["a"] * 5000),
    "-" * 200 + "a",
    "[" * 100 + "a" + "]" * 100,
    "a" + " < a" * 500,
    "x" * 3000,
    "1" * 5000,
])
def test_oversized_expressions_are_refused_at_compile_time(src: str) -> None:
    with pytest.raises(ExprError):
        Expr(src)


def test_ordinary_expressions_still_work() -> None:
    assert Expr("2 ** 10 == 1024 and 'ab' * 3 == 'ababab' and 7 % 3 == 1")({})
    assert Expr("max_num_batched_tokens >= max_num_seqs * 2")({"max_num_batched_tokens": 512, "max_num_seqs": 8})


def _write(tmp_path: Path, text: str, name: str = "x.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_a_self_referencing_anchor_is_a_located_error(tmp_path: Path) -> None:
    p = _write(tmp_path, "name: x\nlist: &a [1, *a]\n")
    with pytest.raises(ConfigError, match="refers to its own anchor") as ei:
        load_yaml(p)
    assert ei.value.line == 2


def test_a_billion_laughs_is_refused_quickly_and_small(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    p = _write(tmp_path, "\n".join(lines) + "\n")
    tracemalloc.start()
    cpu0 = time.thread_time()
    try:
        with pytest.raises(ConfigError, match=f"over {MAX_YAML_NODES} nodes"):
            load_yaml(p)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.thread_time() - cpu0 < 2.0  # CPU, not wall time: a busy host does not stretch it
    assert peak < 100 * 2**20


def test_deep_nesting_is_a_located_error(tmp_path: Path) -> None:
    p = _write(tmp_path, "a: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match="nested"):
        load_yaml(p)


@pytest.mark.parametrize("text", ["x: .nan\n", "x: [1, .NaN]\n", "x: !!float nan\n"])
def test_nan_is_refused_anywhere(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError, match="not a number"):
        load_yaml(_write(tmp_path, text))


def _sim_spec(tmp_path: Path, replace: tuple[str, str]) -> Path:
    text = SIM_AGENT.read_text()
    assert replace[0] in text, replace[0]
    return _write(tmp_path, text.replace(replace[0], replace[1], 1), "agent.yaml")


def test_the_sim_agent_is_valid_as_shipped() -> None:
    load_agent(SIM_AGENT)


def _cli(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, list(args))
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r.exit_code, r.output


def test_an_error_on_line_100_prints_its_line_number_not_an_emoji(tmp_path: Path) -> None:
    p = _write(tmp_path, "\n" * 99 + "name: x\nfoo: 1\n", "emoji.yaml")  # `target` missing: line 100
    code, out = _cli("validate", str(p))
    assert code == 2
    assert "emoji.yaml:100:" in out and "\U0001f4af" not in out


def test_a_when_comparing_a_number_with_a_string_is_a_located_error(tmp_path: Path) -> None:
    from tuner.search.space import parse_space

    data = {"params": {"a": {"type": "int", "low": 1, "high": 4, "default": 2},
                       "b": {"type": "int", "low": 1, "high": 4, "default": 2, "when": "a < 'x'"}}}
    with pytest.raises(ConfigError, match="cannot evaluate") as ei:
        parse_space(data, file="s.yaml")
    assert ei.value.field == "params.b.when"
    data = {"params": {"a": {"type": "int", "low": 0, "high": 4, "default": 0}}, "constraints": ["8 / a > 1"]}
    with pytest.raises(ConfigError, match="division by zero") as ei:
        parse_space(data, file="s.yaml")
    assert ei.value.field == "constraints.0"


@pytest.mark.parametrize("bad", [-float("inf"), float("inf")])
def test_infinite_bounds_are_refused(bad: float) -> None:
    from tuner.search.space import parse_space

    with pytest.raises(ConfigError):
        parse_space({"params": {"a": {"type": "int", "low": bad, "high": 4, "default": 2}}}, file="s.yaml")
    with pytest.raises(ConfigError):
        parse_space({"params": {"a": {"type": "float", "low": 0, "high": bad, "default": 2}}}, file="s.yaml")


_SIM_SPACE = """\
name: bad-knobs
target: {kind: sim, hardware: a100-80gb-sxm, model: llama-3-8b, num_gpus: 8}
search_space:
  params:
    max_num_seqs: {type: int, low: 8, high: 512, default: 256}
    PARAM
workload:
  arrival: {kind: closed, concurrency: 8}
  prompt_tokens: {dist: fixed, value: 64}
  output_tokens: {dist: fixed, value: 16}
  num_requests: 20
objectives: [{metric: output_throughput, direction: maximize}]
"""


@pytest.mark.parametrize(("param", "field", "rule"), [
    ("tensor_parallel_size: {type: categorical, choices: [1, 0.5], default: 1}",
     "params.tensor_parallel_size.choices", "tensor_parallel_size must be an integer >= 1 (got 0.5)"),
    ("tensor_parallel_size: {type: categorical, choices: [1, -1028], default: 1}",
     "params.tensor_parallel_size.choices", "tensor_parallel_size must be an integer >= 1 (got -1028)"),
    ("tensor_parallel_size: {type: categorical, choices: [1, 3], default: 1}",
     "params.tensor_parallel_size.choices", "does not divide the model's 32 attention heads"),
    ("tensor_parallel_size: {type: float, low: 1, high: 4, default: 1}",
     "params.tensor_parallel_size.type", "takes integers"),
    ("data_parallel_size: {type: int, low: 0, high: 4, default: 1}",
     "params.data_parallel_size.low", "data_parallel_size must be an integer >= 1 (got 0)"),
    ("gpu_memory_utilization: {type: float, low: 0.5, high: 1.5, default: 0.9}",
     "params.gpu_memory_utilization.high", "gpu_memory_utilization must be a number in (0, 1] (got 1.5)"),
    ("gpu_memory_utilization: {type: categorical, choices: [0.9, 0], default: 0.9}",
     "params.gpu_memory_utilization.choices", "must be a number in (0, 1] (got 0)"),
    ("max_num_batched_tokens: {type: int, low: 512, high: 100000000000, default: 2048}",
     "params.max_num_batched_tokens.high", "must be an integer in [1, 2147483647]"),
    ("block_size: {type: int, low: 8, high: 32, default: 16}", "params.block_size", "8, 16 or 32 (got 9)"),
    ("kv_cache_dtype: {type: categorical, choices: [auto, int3], default: auto}",
     "params.kv_cache_dtype.choices", "kv_cache_dtype must be one of"),
])
def test_sim_knob_values_the_simulator_refuses_are_located_errors(tmp_path: Path, param: str, field: str,
                                                                 rule: str) -> None:
    """validate refuses a space that hands the simulator a value it refuses at every trial (tensor_parallel_size
    0.5 or -1028 validated, then failed each trial that drew it), naming the file, the field and the rule."""
    assert_refused_where_written(_write(tmp_path, _SIM_SPACE.replace("PARAM", param), "agent.yaml"), field, rule)


def assert_refused_where_written(p: Path, field: str, rule: str) -> None:
    """`validate` exits 2 naming the agent file, the field and the rule; `run`'s own check (preflight) raises
    the same located error before its first trial."""
    code, out = _cli("validate", str(p))
    assert code == 2, out
    flat = " ".join(out.split())
    assert "agent.yaml:" in flat and f"search_space.{field}" in flat and rule in flat, out
    with pytest.raises(ConfigError) as ei:  # `run` makes the same check before its first trial
        from tuner.agent import preflight

        preflight(load_agent(p))
    assert ei.value.field == f"search_space.{field}" and ei.value.line is not None


_ENGINE_SPACE = (_SIM_SPACE.replace("{kind: sim, hardware: a100-80gb-sxm, model: llama-3-8b, num_gpus: 8}",
                                    "{kind: torch_engine, preset: tiny, device: cpu}")
                 .replace("max_num_seqs: {type: int, low: 8, high: 512, default: 256}",
                          "max_batch_size: {type: int, low: 1, high: 16, default: 8}"))


@pytest.mark.parametrize(("param", "field", "rule"), [
    ("prefill_chunk_tokens: {type: int, low: -3, high: 64, default: 16}",
     "params.prefill_chunk_tokens.low", "prefill_chunk_tokens must be >= 1 (got -3)"),
    ("dtype: {type: categorical, choices: [float32, float64], default: float32}",
     "params.dtype.choices", "dtype must be one of float32, bfloat16, float16 (got 'float64')"),
    ("batch_timeout_ms: {type: float, low: -5, high: 50, default: 10}",
     "params.batch_timeout_ms.low", "batch_timeout_ms must be >= 0 (got -5.0)"),
    ("kv_pool_mb: {type: categorical, choices: [64, 32.5], default: 64}",
     "params.kv_pool_mb.choices", "kv_pool_mb takes an integer (got 32.5)"),
    ("pre_allocate: {type: categorical, choices: [false, 'yes'], default: false}",
     "params.pre_allocate.choices", "pre_allocate takes true or false (got 'yes')"),
])
def test_engine_knob_values_the_engine_refuses_are_located_errors(tmp_path: Path, param: str, field: str,
                                                                 rule: str) -> None:
    """The torch_engine target refuses, at validate and before run's first trial, a value the engine refuses
    whatever the other knobs are (a chunk of -3 tokens used to validate and then fail every trial that drew it)."""
    assert_refused_where_written(_write(tmp_path, _ENGINE_SPACE.replace("PARAM", param), "agent.yaml"), field, rule)


@pytest.mark.parametrize(("space", "param"), [
    (_SIM_SPACE, "tensor_parallel_size: {type: categorical, choices: [1, 2, 4, 8], default: 1}\n"
                 "    gpu_memory_utilization: {type: float, low: 0.5, high: 1.0, default: 0.9}\n"
                 "    block_size: {type: categorical, choices: [8, 16, 32], default: 16}\n"
                 "    enforce_eager: {type: bool, default: false}"),
    (_ENGINE_SPACE, "dtype: {type: categorical, choices: [float32, bfloat16], default: float32}\n"
                    "    batch_timeout_ms: {type: float, low: 0, high: 200, default: 50}\n"
                    "    pre_allocate: {type: bool, default: false}\n"
                    "    cpu_threads: {type: categorical, choices: [1, 2], default: 1}"),
], ids=["sim", "torch_engine"])
def test_sound_knob_values_are_accepted(tmp_path: Path, space: str, param: str) -> None:
    from tests.support.spec_probe import refused_values

    p = _write(tmp_path, space.replace("PARAM", param), "agent.yaml")
    code, out = _cli("validate", str(p))
    assert code == 0, out
    assert refused_values(load_agent(p)) == []
    for shipped in (SIM_AGENT, SIM_AGENT.parent / "quickstart.yaml"):
        assert refused_values(load_agent(shipped)) == []
        assert _cli("validate", str(shipped))[0] == 0


def test_a_missing_vllm_interpreter_is_located_in_the_agent_file_not_the_space_file(tmp_path: Path) -> None:
    """`target.python` is written in the agent file; with the search space in a file of its own the error used
    to name the space file (and a line of it) instead."""
    (tmp_path / "space.yaml").write_text("target: vllm\nparams:\n  max_num_seqs: {type: int, low: 8, high: 64, "
                                         "default: 16}\n")
    agent = _write(tmp_path, "name: v\ntarget:\n  kind: vllm\n  model: m\n  python: ./no-such-venv/bin/python\n"
                   "search_space: space.yaml\nworkload:\n  arrival: {kind: closed, concurrency: 2}\n"
                   "  prompt_tokens: {dist: fixed, value: 16}\n  output_tokens: {dist: fixed, value: 4}\n"
                   "  num_requests: 4\nobjectives: [{metric: output_throughput, direction: maximize}]\n",
                   "agent.yaml")
    code, out = _cli("validate", str(agent))
    flat = " ".join(out.split())
    assert code == 2, out
    assert "agent.yaml:5: target.python" in flat and "no such interpreter" in flat and "space.yaml" not in flat, out
