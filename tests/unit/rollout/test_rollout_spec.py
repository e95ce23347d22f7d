"""The agent file's `rollout:` section: defaults, and located errors for stages, the first stage's bound and
judged metrics the servers cannot report."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tuner.agent import load_agent
from tuner.errors import ConfigError

LB = {"socket": "hx.sock", "backend": "llm"}


def test_defaults(agent_file: Callable[..., Path]) -> None:
    spec = load_agent(agent_file(rollout={"load_balancer": LB})).spec
    assert spec.rollout is not None
    assert spec.rollout.stages == [5, 25, 50, 100]
    assert spec.rollout.load_balancer.canary_server == "canary"
    assert load_agent(agent_file()).spec.rollout is None


@pytest.mark.parametrize(("rollout", "field", "words"), [
    ({"stages": [5, 50, 25, 100]}, "rollout.stages", "ascending"),
    ({"stages": [5, 50]}, "rollout.stages", "last stage must be 100"),
    ({"stages": [0, 100]}, "rollout.stages", "(0, 100]"),
    ({"stages": [30, 100]}, "rollout", "max_first_stage"),
    ({"max_stage_s": 5, "window_s": 5, "min_windows": 4}, "rollout", "no stage could ever be judged"),
    ({"metrics": ["tpot_ms.p99"]}, "rollout.metrics[0]", "cannot be judged"),
    ({"metrics": ["ttft_ms.p42"]}, "rollout.metrics[0]", "needs a statistic"),
    ({"load_balancer": {"backend": "llm"}}, "rollout.load_balancer.socket", "required"),
])
def test_located_errors(agent_file: Callable[..., Path], rollout: dict[str, Any], field: str, words: str) -> None:
    path = agent_file(rollout={"load_balancer": LB, **rollout})
    with pytest.raises(ConfigError) as exc:
        load_agent(path)
    msg = str(exc.value)
    assert str(path) in msg and words in msg
    assert exc.value.field is not None and exc.value.field.startswith(field)


def test_judged_metrics_accepted(agent_file: Callable[..., Path]) -> None:
    ro = load_agent(agent_file(rollout={"load_balancer": LB, "metrics": ["ttft_ms.p90", "goodput_fraction",
                                                                       "e2el_ms.p99"]})).spec.rollout
    assert ro is not None and ro.metrics == ["ttft_ms.p90", "goodput_fraction", "e2el_ms.p99"]
