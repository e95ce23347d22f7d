"""Agent-spec validation: bad files of many kinds give located errors (file:line: field: rule (value))."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tuner.agent import load_agent
from tuner.cli.main import app
from tuner.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]

BASE = """\
name: t
target:
  kind: sim
  hardware: a100-80gb-sxm
search_space:
  params:
    max_num_seqs: {type: int, low: 8, high: 512, default: 256}
workload:
  arrival: {kind: poisson, rate_per_s: 10}
  num_requests: 50
objectives:
  - {metric: output_throughput, direction: maximize}
slos:
  - {metric: ttft_ms.p99, max: 2000}
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "agent.yaml"
    p.write_text(text)
    return p


def test_valid(tmp_path: Path) -> None:
    agent = load_agent(write(tmp_path, BASE))
    assert agent.name == "t"
    assert agent.space.defaults() == {"max_num_seqs": 256}
    assert agent.spec.sampler.name == "auto"  # issue 26: the default sampler chosen on experiments/search-suite


CASES = [
    (BASE.replace("name: t", "name: 'bad name!'"), 1, "name", "pattern"),
    (BASE + "colour: red\n", 15, "colour", "unknown field"),
    (BASE.replace("kind: sim", "kind: nope"), 3, "target.kind", "unknown target kind 'nope'"),
    (BASE.replace("hardware: a100-80gb-sxm", "gpus_total: 8"), 4, "target.gpus_total", "unknown field"),
    (BASE.replace("rate_per_s: 10", "rate_per_s: -1"), 9, "workload.arrival.rate_per_s", "greater than 0"),
    (BASE.replace("kind: poisson, rate_per_s: 10", "kind: closed"), 9, "workload.arrival", "needs concurrency"),
    (BASE.replace("  num_requests: 50\n", ""), 8, "workload", "set num_requests or duration_s"),
    (BASE.replace("direction: maximize", "direction: up"), 12, "objectives.0.direction", "maximize"),
    (BASE.replace("ttft_ms.p99", "ttft_ms.p42"), 14, "slos[0].metric", "ttft_ms needs a statistic"),
    (BASE.replace("metric: output_throughput", "metric: output_thruput"), 12, "objectives[0].metric",
     "unknown metric 'output_thruput' (did you mean 'output_throughput'?)"),
    (BASE.replace("ttft_ms.p99", "ttft_p99"), 14, "slos[0].metric", "unknown metric 'ttft_p99' (did you mean"),
    (BASE.replace("max: 2000", "max: 2000, min: 1"), 14, "slos.0", "exactly one of max or min"),
    (BASE.replace("objectives:\n  - {metric: output_throughput, direction: maximize}\n", "objectives: []\n"),
     11, "objectives", "at least 1"),
    (BASE + "sampler: annealing\n", 15, "sampler.name", "tpe"),
    (BASE + "schedule: {every: soon}\n", 15, "schedule.every", "30s, 15m, 6h"),
    (BASE + "budget: {trials: 0}\n", 15, "budget.trials", "greater than or equal to 1"),
    (BASE.replace("high: 512, default: 256", "high: 512, default: 1024"), 7, "search_space.params.max_num_seqs",
     "outside"),
    (BASE.replace("  num_requests: 50\n", "  num_requests: 50\n  dataset: missing.json\n"), 11, "workload.dataset",
     "file not found"),
    (BASE + "schedule: {every: 0s}\n", 15, "schedule.every", "longer than 0"),
    (BASE + "gpus: []\n", 15, "gpus", "at least 1"),
    (BASE.replace("metric: output_throughput", "metric: request_goodput").replace(
        "slos:\n  - {metric: ttft_ms.p99, max: 2000}\n", "slos: []\n"), 12, "objectives[0].metric",
     "add at least one slo"),
    ("- just\n- a list\n", 1, None, "must be a YAML mapping"),
    ("name: [unclosed\n", 2, None, "invalid YAML"),
]


@pytest.mark.parametrize(("text", "line", "field", "fragment"), CASES)
def test_located_errors(tmp_path: Path, text: str, line: int, field: str | None, fragment: str) -> None:
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as ei:
        load_agent(p)
    msg = str(ei.value)
    assert msg.startswith(f"{p}:{line}: "), msg
    if field:
        assert f": {field}: " in msg, msg
    assert fragment in msg, msg


def test_search_space_file_errors_name_that_file(tmp_path: Path) -> None:
    (tmp_path / "space.yaml").write_text("params:\n  a: {type: int, low: 1, high: 2, default: 9}\n")
    text = BASE.split("search_space:")[0] + "search_space: space.yaml\n" + BASE.split("default: 256}\n")[1]
    p = write(tmp_path, text)
    with pytest.raises(ConfigError, match=r"space\.yaml:2: params\.a: .*outside"):
        load_agent(p)


def test_cli_validate_exit_codes(tmp_path: Path) -> None:
    runner = CliRunner()
    good = write(tmp_path, BASE)
    res = runner.invoke(app, ["validate", str(good)])
    assert res.exit_code == 0, res.output
    bad = tmp_path / "bad.yaml"
    bad.write_text(BASE.replace("direction: maximize", "direction: up"))
    res = runner.invoke(app, ["validate", str(bad)])
    assert res.exit_code == 2
    assert "Traceback" not in res.output
    assert "bad.yaml:12" in res.output.replace("\n", "")


def test_shipped_agents_validate() -> None:
    agents = sorted((ROOT / "agents").glob("*.yaml"))
    assert agents, "agents/ holds the shipped agent specs"
    for p in agents:
        load_agent(p)
