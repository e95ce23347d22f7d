"""Bad specs of the `max_rate_under_slo` objective and of `pruning:` are refused naming the file, the line, the
field and the rule; good ones load."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tuner.agent import load_agent
from tuner.errors import ConfigError
from tuner.study.rate_objective import search_spec

RATE = {"metric": "max_rate_under_slo", "direction": "maximize"}
POISSON = {"kind": "poisson", "rate_per_s": 4}


def test_the_objective_loads_with_its_search_bounds(agent_file: Callable[..., Path]) -> None:
    agent = load_agent(agent_file(objectives=[{**RATE, "search": {"max_runs": 4, "run_s": 3}}],
                                  at={"workload.arrival": POISSON}))
    bounds = search_spec(agent.spec)
    assert bounds is not None and bounds.max_runs == 4 and bounds.run_s == 3
    # defaults without `search:`; none without the objective
    plain = load_agent(agent_file(objectives=[RATE], file="b.yaml"))
    assert search_spec(plain.spec) is not None and search_spec(plain.spec).max_runs == 6  # type: ignore[union-attr]
    assert search_spec(load_agent(agent_file(file="c.yaml")).spec) is None


CASES: list[tuple[dict[str, Any], str, str]] = [
    ({"objectives": [{**RATE, "direction": "minimize"}]}, "objectives[0].metric", "direction: maximize"),
    ({"objectives": [RATE], "slos": [{"metric": "output_throughput", "min": 10}]}, "objectives[0].metric",
     "add at least one slo with a max"),
    ({"objectives": [RATE], "slos": [], "at": {"workload.arrival": POISSON}}, "objectives[0].metric",
     "add at least one slo with a max"),
    ({"objectives": [RATE], "at": {"workload.arrival": {"kind": "poisson", "rate_per_s": "auto"}}},
     "objectives[0].metric", "rate_per_s: auto"),
    ({"objectives": [{"metric": "output_throughput", "direction": "maximize", "search": {"max_runs": 3}}]},
     "objectives[0].search", "search bounds the capacity search of max_rate_under_slo"),
    ({"objectives": [RATE], "slos": [{"metric": "ttft_ms.p99", "max": 100},
                                     {"metric": "max_rate_under_slo", "min": 3}]},
     "slos[1].metric", "not a measured metric"),
    ({"objectives": [{**RATE, "search": {"max_runs": 1}}]}, "objectives.0.search.max_runs", "greater than or equal"),
    ({"objectives": [{**RATE, "search": {"min_rate_per_s": 5, "max_rate_per_s": 2}}]}, "objectives.0.search",
     "below min_rate_per_s"),
    ({"objectives": [{**RATE, "search": {"max_run": 3}}]}, "objectives.0.search.max_run", "unknown field"),
    ({"pruning": {"factor": 1.0}}, "pruning.factor", "greater than 1"),
    ({"pruning": {"min_requests": 0}}, "pruning.min_requests", "greater than or equal"),
    ({"pruning": {"enable": False}}, "pruning.enable", "unknown field"),
]


@pytest.mark.parametrize(("changes", "field", "rule"), CASES)
def test_bad_specs_are_located(agent_file: Callable[..., Path], changes: dict[str, Any], field: str,
                               rule: str) -> None:
    p = agent_file(**changes)
    with pytest.raises(ConfigError) as ei:
        load_agent(p)
    msg = str(ei.value)
    assert msg.startswith(f"{p}:"), msg
    assert ei.value.line is not None, msg
    assert field in msg, msg
    assert rule in msg, msg


def test_a_trace_cannot_be_re_rated(agent_file: Callable[..., Path], tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"timestamp": 0.0, "input_length": 16, "output_length": 4}\n'
                     '{"timestamp": 0.5, "input_length": 16, "output_length": 4}\n')
    p = agent_file(objectives=[RATE], at={"workload.arrival": {"kind": "trace", "trace": str(trace)},
                                         "workload.num_requests": 2})
    with pytest.raises(ConfigError, match=r"objectives\[0\]\.metric: .*trace's arrivals cannot be re-rated"):
        load_agent(p)
