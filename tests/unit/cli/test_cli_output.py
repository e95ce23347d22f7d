"""CLI output an operator or a script reads: readable status text, --json everywhere, tables not cut in a pipe,
log lines plain or JSON when not on a terminal."""

from __future__ import annotations

import io
import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.support.agents import write_agent
from tuner.base.textfmt import JsonFormatter, fmt, log_handler
from tuner.cli.main import app

# the factory's sim agent with these changes
CLI_AGENT: dict[str, Any] = {
    "name": "cli-out",
    "slos": [{"metric": "ttft_ms.p99", "max": 5000}],
    "sampler": {"name": "tpe", "seed": 1},
    "budget": {"trials": 3},
    "at": {"search_space.params.max_num_seqs.default": 256,
           "search_space.params.tensor_parallel_size": {"type": "categorical", "choices": [1, 2, 4, 8], "default": 1},
           "workload.arrival": {"kind": "poisson", "rate_per_s": 20},
           "workload.prompt_tokens": {"dist": "uniform", "low": 64, "high": 512},
           "workload.num_requests": 40},
}


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    tmp = tmp_path_factory.mktemp("cli-out")
    agent = tmp / "agent.yaml"
    write_agent(agent, **CLI_AGENT)
    sd = tmp / "state"
    res = CliRunner().invoke(app, ["run", str(agent), "--trials", "3", "--state-dir", str(sd), "--json"])
    assert res.exit_code == 0, res.output
    return {"agent": agent, "sd": sd, "json": json.loads(res.stdout)}


@pytest.mark.slow  # a whole `tuner run`: not in `make test-fast`
def test_run_json_is_one_object_with_the_cycle(ran: dict[str, object]) -> None:
    data = ran["json"]
    assert isinstance(data, dict)
    assert [t["number"] for t in data["trials"]] == [0, 1, 2]
    assert data["baseline"]["number"] == 0 and data["best"] and data["cycle"] == 1
    assert all(t["values"] for t in data["trials"] if t["cause"] is None)


def test_status_text_is_tables_and_local_times_not_dicts(ran: dict[str, object]) -> None:
    res = CliRunner().invoke(app, ["status", str(ran["agent"]), "--state-dir", str(ran["sd"])])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "{'" not in out and "':" not in out  # no Python dict
    assert not re.search(r"\b1[7-9]\d{8}(\.\d+)?\b", out)  # no epoch timestamp
    assert re.search(r"last cycle: #1 ended \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", out)
    assert "┃ trial" in out or "trial ┃" in out  # a table


def test_validate_json_ok_and_error(ran: dict[str, object], tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["validate", str(ran["agent"]), "--json"])
    assert res.exit_code == 0
    assert json.loads(res.stdout) == {"file": str(ran["agent"]), "ok": True, "agent": "cli-out", "target": "sim",
                                      "parameters": 3, "constraints": 1}
    bad = tmp_path / "bad.yaml"
    write_agent(bad, **{**CLI_AGENT, "budget": {"trials": 0}})
    res = CliRunner().invoke(app, ["validate", str(bad), "--json"])
    assert res.exit_code == 2
    err = json.loads(res.stdout)
    assert err["ok"] is False and "trials" in err["error"]


def test_check_json_on_a_state_dir_without_daemon(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["check", "--state-dir", str(tmp_path), "--json"])
    assert res.exit_code == 1
    data = json.loads(res.stdout)
    assert data["ok"] is False and data["reason"]


def test_wide_tables_are_not_cut_in_a_pipe(ran: dict[str, object]) -> None:
    res = CliRunner().invoke(app, ["status", str(ran["agent"]), "--state-dir", str(ran["sd"])])
    assert res.exit_code == 0, res.output
    # the baseline's parameters on one line of the table (over 80 columns), neither wrapped nor cut with an ellipsis
    assert re.search(r"baseline .*max_num_seqs=256, max_num_batched_tokens=2048, tensor_parallel_size=1 ", res.output)
    assert "…" not in res.output
    assert "e+0" not in res.output  # 15,130 not 1.513e+04


def test_numbers_read_as_numbers() -> None:
    assert fmt(15130.4) == "15,130" and fmt(0.0123) == "0.0123" and fmt(938.24) == "938.2"
    assert fmt(3.0e-6) == "3e-06" and fmt(None) == "" and fmt(7) == "7"


def test_logs_are_plain_or_json_off_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = logging.LogRecord("tuner.loop", logging.INFO, __file__, 1, "trial %d failed (%s)", (3, "oom"), None)
    stream = io.StringIO()
    monkeypatch.delenv("TUNER_LOG_FORMAT", raising=False)
    h = log_handler(stream, rich_console=object())
    assert isinstance(h.formatter, logging.Formatter) and not isinstance(h.formatter, JsonFormatter)
    h.emit(rec)
    assert stream.getvalue().rstrip().endswith("INFO tuner.loop: trial 3 failed (oom)")
    monkeypatch.setenv("TUNER_LOG_FORMAT", "json")
    stream = io.StringIO()
    log_handler(stream).emit(rec)
    line = json.loads(stream.getvalue())
    assert line["message"] == "trial 3 failed (oom)" and line["level"] == "INFO" and line["logger"] == "tuner.loop"
    assert line["time"].endswith("Z")
