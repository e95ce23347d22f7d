"""`tuner validate` runs every check `run` runs before its first trial: misspelled metrics and broken command
templates exit 2 with a located message (and --show-command says the same), and validate opens no store."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.support.agents import write_agent
from tuner.cli.main import app

COMMAND = {"kind": "command", "model": "m", "command": ["srv", "--port", "{port}", "--batch", "{max_num_seqs}"]}
SPACE = {"params": {"max_num_seqs": {"type": "int", "low": 8, "high": 64, "default": 16}}}


def line(path: Path, needle: str) -> int:
    return next(i for i, t in enumerate(path.read_text().splitlines(), 1) if needle in t)


def validate(path: Path, *extra: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, ["validate", str(path), *extra])
    return r.exit_code, " ".join(r.output.split())  # rich wraps long lines


@pytest.mark.parametrize(("changes", "needle", "expected"), [
    ({"objectives": [{"metric": "output_thruput", "direction": "maximize"}]},
     "output_thruput", "objectives[0].metric: unknown metric 'output_thruput' (did you mean 'output_throughput'?)"),
    ({"slos": [{"metric": "ttft_p99", "max": 100}]},
     "ttft_p99", "slos[0].metric: unknown metric 'ttft_p99' (did you mean 'ttft_ms.p99'?)"),
])
def test_a_misspelled_metric_exits_2_with_the_nearest_name(tmp_path: Path, changes: dict, needle: str,
                                                           expected: str) -> None:
    p = write_agent(tmp_path / "a.yaml", **changes)
    code, out = validate(p)
    assert code == 2, out
    assert f"{p}:{line(p, needle)}: {expected}" in out, out


@pytest.mark.parametrize(("command", "space", "needle", "field", "fragment"), [
    (["srv", "--port", "{port}", "--batch", "{max_num_seqs}", "--x", "{nope}"], SPACE, "command:", "target.command:",
     "command template names unknown parameter(s) ['nope']"),
    (["srv", "--port", "{port}"], SPACE, "max_num_seqs:", "search_space.params.max_num_seqs:",
     "are not passed to the server"),
    (COMMAND["command"], {"params": {
        "chunked": {"type": "categorical", "choices": [True, False], "default": False},
        "max_num_seqs": {"type": "int", "low": 8, "high": 64, "default": 16, "when": "chunked"}}},
     "max_num_seqs:", "search_space.params.max_num_seqs:", "have a `when` condition"),
])
@pytest.mark.parametrize("show", [False, True])
def test_a_broken_command_template_exits_2_where_run_would(tmp_path: Path, command: list[str], space: dict,
                                                           needle: str, field: str, fragment: str,
                                                           show: bool) -> None:
    if "chunked" in space["params"]:
        command = [*command, "--chunked", "{chunked}"]
    p = write_agent(tmp_path / "a.yaml", target={**COMMAND, "command": command}, search_space=space)
    code, out = validate(p, *(["--show-command"] if show else []))
    assert code == 2, out
    assert f"{p}:{line(p, needle)}: {field}" in out and fragment in out, out
    assert not (tmp_path / ".tuner").exists()


def test_a_cron_the_scheduler_rejects_exits_2(tmp_path: Path) -> None:
    p = write_agent(tmp_path / "a.yaml", schedule={"cron": "99 * * * *"})
    code, out = validate(p)
    assert code == 2, out
    assert f"{p}:{line(p, 'cron')}: schedule.cron: '99 * * * *' is not a valid cron expression" in out, out


def test_a_valid_command_agent_passes_and_creates_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    p = write_agent(tmp_path / "a.yaml", target=COMMAND, search_space=SPACE)
    code, out = validate(p, "--show-command")
    assert code == 0, out
    assert '"--batch", "16"' in out
    assert sorted(x.name for x in tmp_path.iterdir()) == ["a.yaml"]
