"""Hostile inputs of the second fault campaign (issue 30), each class on generated variants: expressions whose
values nest (a list of lists repeated) or whose work adds up across the evaluation; spec, space, trace and
model paths that are special files (a FIFO, a directory, a device, a socket, a link to /dev/zero) or too big;
duplicate YAML keys; and numbers past the bounds of every count, duration and period of the schema. Each is
a located error (file, field, rule), quick, never a hang or a traceback."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from tests.support.agents import agent_spec
from tests.support.spec_probe import SPECIAL_KINDS, nested_tower, special_file, with_duplicate_key, work_chain
from tuner import spec as S
from tuner.base.expr import MAX_WORK, Expr, ExprError
from tuner.base.files import read_bounded
from tuner.base.yamlio import MAX_YAML_BYTES, load_yaml
from tuner.cli.main import app
from tuner.errors import ConfigError


def _cli(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, list(args))
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r.exit_code, " ".join(r.output.split())


def _write_spec(path: Path, spec: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


# ------------------------------------------------------------------ 1. expressions: total size and total work
def _towers(seed: int, n: int) -> Iterator[str]:
    rng = random.Random(seed)
    return (nested_tower(rng) for _ in range(n))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("src", list(_towers(30, 12)))
def test_nested_containers_count_every_element(src: str) -> None:
    """Each level is within MAX_SEQ_LEN; the nest is not: refused as over the size limit, at once."""
    with pytest.raises(ExprError, match="items in all"):
        Expr(src)({"max_num_seqs": 8})


@pytest.mark.timeout(60)
@pytest.mark.parametrize("seed", range(4))
def test_work_is_counted_across_the_whole_evaluation(seed: int) -> None:
    """Many comparisons, each of a value within the size limit, add up past MAX_WORK: refused by the work
    limit, though no single step is too big."""
    chain = work_chain(random.Random(seed), MAX_WORK)
    assert len(chain) < 2000
    with pytest.raises(ExprError, match="work limit"):
        Expr(chain)({})


def test_ordinary_containers_still_evaluate() -> None:
    assert Expr("max_num_seqs in [8, 16, 32] and [1, [2, 3]] == [1, [2, 3]]")({"max_num_seqs": 16})
    assert Expr("[max_num_seqs] * 500 == [16] * 500")({"max_num_seqs": 16})
    assert Expr("min([3, 1, 2]) == 1 and 'ab' * 400 != 'x'")({})


@pytest.mark.timeout(60)
def test_validate_names_the_constraint_of_a_nested_tower(tmp_path: Path) -> None:
    tower = "[[[[1]*1000]*1000]*1000]*1000"
    spec = agent_spec(at={"search_space.constraints": ["max_num_batched_tokens >= max_num_seqs",
                                                       f"{tower} == {tower}"]})
    code, out = _cli("validate", str(_write_spec(tmp_path / "agent.yaml", spec)))
    assert code == 2, out
    assert "agent.yaml:" in out and "search_space.constraints.1" in out and "size limit" in out, out


# ------------------------------------------------------------------ 3. special files
def _special(kind: str, d: Path) -> Path:
    return Path(special_file(kind, d))


KINDS = list(SPECIAL_KINDS)
RULE = "not a regular file"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KINDS)
def test_an_agent_path_that_is_a_special_file_is_refused(tmp_path: Path, kind: str) -> None:
    p = _special(kind, tmp_path)
    code, out = _cli("validate", str(p))
    assert code == 2, out
    assert p.name in out and RULE in out, out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("field", ["search_space", "workload.dataset", "workload.arrival.trace"])
def test_a_named_file_that_is_a_special_file_is_refused(tmp_path: Path, kind: str, field: str) -> None:
    target = _special(kind, tmp_path)
    at: dict[str, Any] = {"search_space": str(target)} if field == "search_space" else {field: str(target)}
    if field == "workload.arrival.trace":
        at["workload.arrival"] = {"kind": "trace", "trace": str(target)}
    code, out = _cli("validate", str(_write_spec(tmp_path / "agent.yaml", agent_spec(at=at))))
    assert code == 2, out
    assert RULE in out and target.name in out, out
    if field != "search_space":
        assert field in out, out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KINDS)
def test_the_readers_refuse_special_files(tmp_path: Path, kind: str) -> None:
    from tuner.measure.datasets import _read_records
    from tuner.sim.refcost import StepModel

    p = _special(kind, tmp_path)
    for read in (lambda: load_yaml(p), lambda: _read_records(p), lambda: StepModel.load(p),
                 lambda: read_bounded(p, 10)):
        with pytest.raises(ConfigError, match=RULE):
            read()


def test_a_file_over_the_limit_is_refused_after_reading_at_most_limit_plus_one(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_bytes(b"a: 1\n" + b"#" * MAX_YAML_BYTES)
    with pytest.raises(ConfigError, match="over 1000000 bytes"):
        load_yaml(big)
    sized = tmp_path / "sized"
    sized.write_bytes(b"x" * 11)
    with pytest.raises(ConfigError, match="over 10 bytes"):
        read_bounded(sized, 10)
    assert read_bounded(sized, 11) == b"x" * 11


def test_a_link_to_a_regular_file_is_read(tmp_path: Path) -> None:
    real = _write_spec(tmp_path / "real.yaml", agent_spec())
    link = tmp_path / "link.yaml"
    link.symlink_to(real)
    code, out = _cli("validate", str(link))
    assert code == 0, out


# ------------------------------------------------------------------ 6. duplicate keys
def _dup_variants(seed: int, n: int) -> Iterator[tuple[str, int]]:
    """The sim agent as YAML with one key written twice at a random place (top level or nested), and in flow
    mappings: (text, the line of the second key)."""
    rng = random.Random(seed)
    base = yaml.safe_dump(agent_spec(), sort_keys=False)
    for _ in range(n):
        yield with_duplicate_key(base, rng)
    yield "name: a\nworkload: {num_requests: 5, num_requests: 6}\n", 2
    yield "name: a\nb: {1: x, 0x1: y}\n", 2


@pytest.mark.parametrize(("text", "line"), list(_dup_variants(6, 10)))
def test_a_duplicate_key_is_refused_with_its_line(tmp_path: Path, text: str, line: int) -> None:
    p = tmp_path / "agent.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match="duplicate key") as ei:
        load_yaml(p)
    assert ei.value.file == str(p) and ei.value.line == line, (str(ei.value), text)
    code, out = _cli("validate", str(p))
    assert code == 2 and f"agent.yaml:{line}: duplicate key" in out, out


def test_a_second_slos_no_longer_replaces_the_real_ones(tmp_path: Path) -> None:
    text = yaml.safe_dump(agent_spec(), sort_keys=False) + "slos: []\n"
    p = tmp_path / "agent.yaml"
    p.write_text(text)
    code, out = _cli("validate", str(p))
    assert code == 2 and "duplicate key 'slos'" in out, out


def test_a_merge_key_may_still_be_overridden(tmp_path: Path) -> None:
    p = tmp_path / "m.yaml"
    p.write_text("base: &b {x: 1, y: 2}\nmine: {<<: *b, x: 3}\n")
    assert load_yaml(p)[0]["mine"] == {"x": 3, "y": 2}


# ------------------------------------------------------------------ 7. numbers past the bounds
# every count, duration and period of the schema, with a value just past its bound and a huge one
BOUNDED: list[tuple[str, float, str]] = [
    ("workload.num_requests", S.MAX_REQUESTS, "int"), ("workload.warmup_requests", S.MAX_REQUESTS, "int"),
    ("workload.duration_s", S.MAX_TRIAL_S, "float"), ("workload.warmup_s", S.MAX_TRIAL_S, "float"),
    ("workload.cooldown_s", S.MAX_TRIAL_S, "float"), ("workload.timeout_s", S.MAX_TRIAL_S, "float"),
    ("workload.arrival.concurrency", S.MAX_CONCURRENCY, "int"),
    ("workload.prompt_tokens.value", S.MAX_TOKENS, "int"), ("workload.output_tokens.value", S.MAX_TOKENS, "int"),
    ("workload.prompt_tokens.max", S.MAX_TOKENS, "int"),
    ("budget.trials", S.MAX_TRIALS, "int"), ("budget.wall_time_s", S.MAX_WALL_S, "float"),
    ("sampler.n_startup_trials", S.MAX_TRIALS, "int"), ("lease.heartbeat_s", 3600, "int"),
    ("lease.timeout_s", S.MAX_TRIAL_S, "int"), ("promotion.verify_runs", 1000, "int"),
    ("parallel_trials", S.MAX_GPUS, "int"), ("executor.cpus_per_trial", S.MAX_GPUS, "float"),
    ("schedule.trials_per_cycle", S.MAX_TRIALS, "int"), ("target.num_gpus", S.MAX_GPUS, "int"),
    ("target.max_model_len", S.MAX_TOKENS, "int"),
]


def _past(bound: float, kind: str, rng: random.Random) -> list[Any]:
    return [int(bound) + 1 if kind == "int" else bound * 1.001, rng.choice([10**12, 10**20, 2**64])
            if kind == "int" else rng.choice([1e12, 1e100, 1e308])]


_CASES = [(f, v) for i, (f, b, k) in enumerate(BOUNDED) for v in _past(b, k, random.Random(i))]


@pytest.mark.parametrize(("field", "value"), _CASES)
def test_every_count_and_duration_is_bounded(tmp_path: Path, field: str, value: Any) -> None:
    at: dict[str, Any] = {field: value}
    if field.startswith("schedule."):
        at["schedule"] = {"every": "1h", field.split(".")[1]: value}
    if field == "lease.timeout_s":
        at["lease.heartbeat_s"] = 1
    code, out = _cli("validate", str(_write_spec(tmp_path / "agent.yaml", agent_spec(at=at))))
    assert code == 2, out
    assert "agent.yaml:" in out and field.split(".")[-1] in out and "less than or equal" in out, out


@pytest.mark.parametrize("every", ["99999999999999999999d", "400d", "0.5s", "1" * 30 + "s", "9" * 400 + "h"])
def test_a_schedule_period_past_its_bounds_is_a_located_error(tmp_path: Path, every: str) -> None:
    spec = agent_spec(schedule={"every": every})
    code, out = _cli("validate", str(_write_spec(tmp_path / "agent.yaml", spec)))
    assert code == 2, out
    assert "schedule.every" in out and ("between" in out or "look like" in out), out


def test_a_duration_bound_run_that_plans_too_many_requests_is_refused(tmp_path: Path) -> None:
    spec = agent_spec(at={"workload.num_requests": None, "workload.duration_s": 80_000.0,
                          "workload.arrival": {"kind": "poisson", "rate_per_s": 1000.0}})
    code, out = _cli("validate", str(_write_spec(tmp_path / "agent.yaml", spec)))
    assert code == 2 and "plans" in out and str(S.MAX_REQUESTS) in out, out


def test_values_at_the_bounds_are_accepted(tmp_path: Path) -> None:
    spec = agent_spec(at={"workload.timeout_s": S.MAX_TRIAL_S, "budget.trials": S.MAX_TRIALS,
                          "workload.output_tokens.value": 64, "schedule": {"every": "366d"}})
    code, out = _cli("validate", str(_write_spec(tmp_path / "agent.yaml", spec)))
    assert code == 0, out


