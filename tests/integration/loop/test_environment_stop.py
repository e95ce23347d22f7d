"""Issue 26: a cycle whose baseline and first trials fail with one cause of the environment stops early with
exit status 5 instead of spending its budget."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tuner.cli.main import app
from tuner.study.summary import ENVIRONMENT_STOP_AFTER, EXIT_ENVIRONMENT, environment_failure

pytestmark = pytest.mark.process

AGENT = """\
name: envstop
target:
  kind: command
  command: ["{python}", "-c", "import sys; sys.exit('cannot bind 127.0.0.1:{port}: address already in use')"]
  model: m
  startup_timeout_s: 20
  flags: {ttft: --ttft-ms}
search_space:
  params:
    ttft: {type: int, low: 1, high: 50, default: 5}
workload: {num_requests: 4}
objectives: [{metric: request_throughput, direction: maximize}]
budget: {trials: 10}
tracking: {enabled: false}
"""


def test_the_same_environment_failure_stops_the_cycle_with_exit_5(tmp_path: Path) -> None:
    (tmp_path / "agent.yaml").write_text(AGENT)
    r = CliRunner().invoke(app, ["run", str(tmp_path / "agent.yaml"), "--state-dir", str(tmp_path / "state"),
                                 "--json"])
    assert r.exit_code == EXIT_ENVIRONMENT, r.output
    import json

    out = json.loads(r.output.strip().splitlines()[-1])
    assert len(out["trials"]) == ENVIRONMENT_STOP_AFTER < 10  # not the whole budget
    assert {t["cause"] for t in out["trials"]} == {"crashed_at_startup"}
    assert "environment" in out["environment_stop"] and "address already in use" in out["environment_stop"]


class _O:
    def __init__(self, number: int, cause: str | None, error: str | None) -> None:
        self.number, self.cause, self.error = number, cause, error


def test_different_causes_or_texts_do_not_stop() -> None:
    same = [_O(i, "deploy_failed", f"server went\nport {8000 + i} in use") for i in range(3)]
    assert environment_failure(same) is not None  # digits aside, one text
    assert environment_failure(same[:2]) is None
    assert environment_failure([*same[:2], _O(2, "out_of_memory", "port 1 in use")]) is None
    assert environment_failure([*same[:2], _O(2, "deploy_failed", "server went\nflag --x refused")]) is None
    assert environment_failure([_O(i, None, None) for i in range(3)]) is None
