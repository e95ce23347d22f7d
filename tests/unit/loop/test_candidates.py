"""Candidates: configurations an agent names (known profiles) are tried right after the baseline, once per study,
and a bad one is refused at load time with its file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.agents import write_agent
from tuner.agent import load_agent
from tuner.errors import ConfigError
from tuner.loop import open_session, run_cycle
from tuner.report.data import _row
from tuner.search.space import parse_space

SPACE = {"params": {
    "batching": {"type": "categorical", "choices": ["static", "continuous"], "default": "static"},
    "batch": {"type": "int", "low": 4, "high": 64, "log": True, "default": 8},
    "timeout_ms": {"type": "float", "low": 0.0, "high": 100.0, "default": 50.0, "when": "batching == 'static'"},
    "pre_allocate": {"type": "bool", "default": False},
}, "constraints": ["batch <= 48 or pre_allocate"]}


def test_a_point_takes_defaults_for_knobs_left_out_and_names_what_is_wrong() -> None:
    space = parse_space(SPACE, file="<test>")
    cfg, problems = space.point({"batch": 32})
    assert problems == [] and cfg == {"batching": "static", "batch": 32, "timeout_ms": 50.0, "pre_allocate": False}
    cfg, problems = space.point({"batching": "continuous"})
    assert problems == [] and "timeout_ms" not in cfg  # its condition is off: not part of the configuration
    knob, rule = space.point({"batch_size": 8})[1][0]
    assert knob == "batch_size" and "not a knob" in rule
    for bad in (3, 65, 8.5, True, "8"):
        knob, rule = space.point({"batch": bad})[1][0]
        assert knob == "batch" and "is not a value" in rule and "int in [4, 64]" in rule, bad
    knob, rule = space.point({"batching": "continuous", "timeout_ms": 10.0})[1][0]
    assert knob == "timeout_ms" and "inactive" in rule and "batching == 'static'" in rule
    knob, rule = space.point({"pre_allocate": 1})[1][0]
    assert knob == "pre_allocate" and "true or false" in rule
    knob, rule = space.point({"batch": 64})[1][0]
    assert knob == "" and "batch <= 48 or pre_allocate" in rule
    assert space.point({"batch": 64, "pre_allocate": True})[1] == []


def test_a_bad_candidate_is_refused_with_its_file_line_and_field(tmp_path: Path) -> None:
    path = write_agent(tmp_path / "a.yaml", candidates=[
        {"name": "big", "params": {"max_num_seqs": 256, "max_num_batched_tokens": 8192}},
        {"name": "typo", "params": {"max_num_sqs": 64}}])
    with pytest.raises(ConfigError) as err:
        load_agent(path)
    text = str(err.value)
    assert "candidates[1].params.max_num_sqs" in text and "candidate 'typo'" in text
    assert "not a knob of the search space" in text and str(path) in text and err.value.line is not None
    path = write_agent(tmp_path / "b.yaml", candidates=[{"name": "small", "params": {"max_num_seqs": 4096}}])
    with pytest.raises(ConfigError, match=r"candidates\[0\]\.params\.max_num_seqs.*4096 is not a value"):
        load_agent(path)
    path = write_agent(tmp_path / "c.yaml", candidates=[  # max_num_batched_tokens >= max_num_seqs
        {"name": "tight", "params": {"max_num_seqs": 512, "max_num_batched_tokens": 256}}])
    with pytest.raises(ConfigError, match="violates the constraint max_num_batched_tokens >= max_num_seqs"):
        load_agent(path)
    path = write_agent(tmp_path / "d.yaml", candidates=[{"name": "x", "params": {"max_num_seqs": 64}},
                                                        {"name": "x", "params": {"max_num_seqs": 32}}])
    with pytest.raises(ConfigError, match="candidate names must be unique: x"):
        load_agent(path)


def test_candidates_run_right_after_the_baseline_once_per_study(tmp_path: Path) -> None:
    path = write_agent(tmp_path / "a.yaml", tracking={"enabled": False}, candidates=[
        {"name": "big", "params": {"max_num_seqs": 256, "max_num_batched_tokens": 8192}},
        {"name": "plain", "params": {"max_num_seqs": 16}},  # the defaults: the baseline measures it already
        {"name": "wide", "params": {"max_num_batched_tokens": 16384}}])
    session = open_session(load_agent(path), tmp_path / "state")
    run_cycle(session, trials=4)
    trials = session.study.trials()
    assert trials[0].user_attrs.get("baseline")
    assert trials[1].user_attrs.get("candidate") == "big"
    assert trials[1].params == {"max_num_seqs": 256, "max_num_batched_tokens": 8192}
    assert trials[2].user_attrs.get("candidate") == "wide"
    assert trials[2].params == {"max_num_seqs": 16, "max_num_batched_tokens": 16384}  # the rest at its default
    assert "candidate" not in trials[3].user_attrs  # the sampler's own
    assert _row(trials[1]).candidate == "big"
    run_cycle(session, trials=2)  # a later cycle: nothing tried again
    named = [t.user_attrs.get("candidate") for t in session.study.trials() if t.user_attrs.get("candidate")]
    assert named == ["big", "wide"]
