"""A worker whose space runs out before its budget ends the fleet's MLflow run instead of leaving it RUNNING."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.agents import fleet_sim_agent, write_spec
from tuner.agent import load_agent
from tuner.fleet.worker import run_worker
from tuner.loop import open_session

pytestmark = pytest.mark.timeout(300)


def test_a_worker_that_runs_out_of_configurations_ends_the_fleet_run(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = fleet_sim_agent(name="small", trials=8, storage=f"sqlite:///{tmp_path / 'study.db'}",
                           batched_tokens=False, tracking={"uri": store},
                           sampler={"name": "auto", "seed": 0}, noise={"baseline_repeats": 0})
    # three configurations in all, eight in the budget
    spec["search_space"]["params"] = {"tensor_parallel_size": {"type": "categorical", "choices": [1, 2, 4],
                                                               "default": 1}}
    session = open_session(load_agent(write_spec(tmp_path / "agent.yaml", spec)), tmp_path / "state")
    result = run_worker(session)
    assert result.counted == 3 < result.budget == 8
    client = MlflowClient(tracking_uri=store)
    runs = client.search_runs([client.get_experiment_by_name("small").experiment_id])
    fleet = [r for r in runs if r.data.tags.get("kind") == "fleet"]
    assert len(fleet) == 1 and fleet[0].info.status == "FINISHED", [(r.data.tags, r.info.status) for r in runs]
    assert fleet[0].data.metrics["trials_run"] == 3
