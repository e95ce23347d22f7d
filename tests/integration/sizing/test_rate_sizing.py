"""`rate_per_s: auto` and the run summary, end to end on the simulator with real SQLite Optuna and MLflow stores."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest
from typer.testing import CliRunner

from tuner.agent import load_agent
from tuner.cli.main import app
from tuner.loop import open_session, run_cycle
from tuner.study.sizing import RATE_ATTR, RateSizing, recorded
from tuner.study.summary import EXIT_NO_FEASIBLE

AGENT = """\
name: sizing-test
target: {{kind: sim, hardware: a100-80gb-sxm, model: llama-3-8b, num_gpus: 8, noise_cv: 0.0}}
search_space:
  params:
    max_num_seqs: {{type: int, low: 8, high: 512, log: true, default: 16}}
    tensor_parallel_size: {{type: categorical, choices: [1, 2, 4, 8], default: 1}}
workload:
  arrival: {arrival}
  prompt_tokens: {{dist: uniform, low: 64, high: 512}}
  output_tokens: {{dist: fixed, value: 64}}
  num_requests: 200
objectives:
  - {{metric: request_goodput, direction: maximize}}
slos:
  - {{metric: ttft_ms.p99, max: {ttft}}}
sampler: {{name: random, seed: 1}}
budget: {{trials: 3}}
"""


def write_agent(tmp_path: Path, *, arrival: str = "{kind: poisson, rate_per_s: auto, load: 0.8}",
                ttft: float = 500.0) -> Path:
    p = tmp_path / "agent.yaml"
    p.write_text(AGENT.format(arrival=arrival, ttft=ttft))
    return p


def test_auto_rate_is_sized_once_on_the_baseline_and_reused(tmp_path: Path) -> None:
    agent = load_agent(write_agent(tmp_path))
    sd = tmp_path / "state"
    steps: list[float] = []
    session = open_session(agent, sd)
    run_cycle(session, trials=2, on_sizing_step=lambda s, n: steps.append(s.rate_per_s))
    sized = recorded(session.study)
    assert sized is not None and sized.method == "capacity_search"
    assert len(steps) == sized.runs >= 2  # a progress call per run of the search
    assert sized.load == 0.8 and sized.rate_per_s == pytest.approx(0.8 * sized.capacity_rate_per_s, rel=1e-3)
    # the capacity is bracketed: a passing run at it, a failing one above it
    assert any(s["ok"] and s["rate_per_s"] == pytest.approx(sized.capacity_rate_per_s, abs=1e-3) for s in sized.steps)
    assert sized.upper_rate_per_s is not None and sized.upper_rate_per_s > sized.capacity_rate_per_s
    # every trial ran at the sized rate, and the baseline meets the SLOs at it
    trials = session.study.trials()
    base = trials[0]
    assert base.user_attrs["baseline"] and base.user_attrs["feasible"]
    assert base.user_attrs["metrics"]["request_throughput"] == pytest.approx(sized.rate_per_s, rel=0.25)
    for t in trials:
        assert t.user_attrs["metrics"]["request_throughput"] <= 1.25 * sized.rate_per_s

    # a new session and cycle of the same study reuse the figure: no search runs again
    steps.clear()
    session2 = open_session(load_agent(write_agent(tmp_path)), sd)
    assert session2.agent.spec.workload.arrival.rate_per_s == sized.rate_per_s  # applied at opening
    run_cycle(session2, trials=1, on_sizing_step=lambda s, n: steps.append(s.rate_per_s))
    assert steps == []
    assert recorded(session2.study) == sized

    # MLflow: both cycle runs carry the rate; the sizing cycle has the search's runs
    client = mlflow.MlflowClient(tracking_uri=session.tracker.uri)
    exp = client.get_experiment_by_name("sizing-test")
    runs = client.search_runs([exp.experiment_id], filter_string="tags.kind = 'cycle'")
    assert len(runs) == 2
    by_cycle = {r.data.tags["cycle"]: r for r in runs}
    for r in runs:
        assert float(r.data.params["workload_rate_per_s"]) == sized.rate_per_s
        assert r.data.metrics["baseline_capacity_rate_per_s"] == sized.capacity_rate_per_s
    assert by_cycle["1"].data.tags["workload_rate"] == "sized in this cycle"
    assert by_cycle["2"].data.tags["workload_rate"] == "reused"
    art = Path(client.download_artifacts(by_cycle["1"].info.run_id, "rate_sizing.json", str(tmp_path)))
    assert RateSizing.from_attr(json.loads(art.read_text())) == sized


def test_status_and_final_table_show_the_rate(tmp_path: Path) -> None:
    agent = write_agent(tmp_path)
    sd = tmp_path / "state"
    runner = CliRunner()
    res = runner.invoke(app, ["run", str(agent), "--trials", "2", "--state-dir", str(sd)])
    assert res.exit_code == 0, res.output
    assert "sizing run 1/" in res.output
    assert "workload rate" in res.output and "capacity_search" in res.output  # the table's caption
    st = runner.invoke(app, ["status", str(agent), "--state-dir", str(sd)])
    assert st.exit_code == 0, st.output
    assert "workload rate:" in st.output and "capacity_search" in st.output
    js = runner.invoke(app, ["status", str(agent), "--state-dir", str(sd), "--json"])
    data = json.loads(js.output)
    assert data["workload_rate"]["rate_per_s"] > 0 and data["workload_rate"]["method"] == "capacity_search"
    assert RATE_ATTR == "workload_rate"


def test_no_feasible_trial_prints_nearest_misses_and_exits_3(tmp_path: Path) -> None:
    # a fixed rate and a TTFT limit no configuration of the simulated A100s can meet
    agent = write_agent(tmp_path, arrival="{kind: poisson, rate_per_s: 20}", ttft=0.5)
    res = CliRunner().invoke(app, ["run", str(agent), "--trials", "3", "--state-dir", str(tmp_path / "s")])
    assert res.exit_code == EXIT_NO_FEASIBLE == 3, res.output
    assert "no feasible trial; nearest misses:" in res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip().startswith("trial ")]
    assert 1 <= len(lines) <= 3
    assert all("ttft_ms.p99" in ln and "> 0.5 ms" in ln for ln in lines), lines
    assert "what to change:" in res.output and "rate_per_s: auto" in res.output


def test_auto_rate_that_no_rate_satisfies_is_a_sizing_error(tmp_path: Path) -> None:
    agent = write_agent(tmp_path, ttft=0.5)
    res = CliRunner().invoke(app, ["run", str(agent), "--trials", "1", "--state-dir", str(tmp_path / "s")])
    assert res.exit_code == 4, res.output
    assert "rate_per_s: auto" in res.output and "at no rate tried" in res.output
