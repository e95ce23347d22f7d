"""Canary rollouts through a real HAProxy in front of real reference-engine replicas, judged on live traffic:
a better canary reaches 100% and becomes the champion; a worse one is rolled back at its first stage with the
champion unchanged; unhealthy stable replicas refuse the rollout. In every case the balancer ends as it began."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.rollout.conftest import CONFIG, engine_target, rollout_agent, traffic
from tuner.agent import load_agent
from tuner.champions.store import ChampionStore
from tuner.rollout import journal
from tuner.rollout.lb import HAProxy
from tuner.rollout.rollout import Rollout, RolloutRefused
from tuner.tracking.tracker import Tracker

pytestmark = [pytest.mark.process, pytest.mark.slow]


def _rollout(tmp_path: Path, bal: Any, canary_delay_ms: float, tracker: Any = None,
             **rollout: Any) -> tuple[Rollout, ChampionStore]:
    agent = load_agent(rollout_agent(tmp_path / "canary.yaml", bal.socket, **rollout))
    state = tmp_path / "state"
    store = ChampionStore(state, agent.name)
    ro = Rollout(spec=agent.spec, store=store, tracker=tracker, target=engine_target(tmp_path, canary_delay_ms),
                 lb=HAProxy(bal.socket, bal.backend), state_dir=state, agent_dir=tmp_path)
    return ro, store


def _wait_up(lb: HAProxy, name: str) -> None:
    deadline = time.monotonic() + 30
    while not lb.servers()[name].up:
        assert time.monotonic() < deadline
        time.sleep(0.2)


def _actions(store: ChampionStore) -> list[str]:
    return [e["action"] for e in store.audit_log()]


def test_better_canary_reaches_full_traffic_and_is_promoted(tmp_path: Path, stack: Callable[..., Any]) -> None:
    with stack(step_delay_ms=25) as (bal, _):  # the stable replica is the slower configuration
        tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "canary", artifact_dir=tmp_path / "mlartifacts")
        ro, store = _rollout(tmp_path, bal, canary_delay_ms=0, tracker=tracker)
        lb = HAProxy(bal.socket, bal.backend)
        _wait_up(lb, "stable0")
        with traffic(bal.url) as counts, store.lock():
            res = ro.run(CONFIG, trial=3, study="s", values=[1.0])
        assert res.outcome == "promoted", res.reason
        assert [s.outcome for s in res.stages] == ["passed", "passed", "passed"]
        assert [s.percent for s in res.stages] == [20, 50, 100]
        assert all(s.canary_requests >= 6 and s.routed_canary > 0 for s in res.stages)
        first = res.stages[0]
        assert 0.1 < first.routed_canary / (first.routed_canary + first.routed_stable) < 0.35  # ~20% of the traffic
        assert res.stages[-1].routed_stable == 0  # 100%: the stable replica drained
        ttft = next(m for m in res.stages[1].metrics if m["metric"] == "ttft_ms.mean")
        assert ttft["improvement"] > 0 and ttft["passed"]
        champ = store.champion()
        assert champ is not None and champ.config == CONFIG and champ.trial == 3
        assert _actions(store) == ["rollout_started", "rollout_stage", "rollout_stage", "rollout_stage", "promote",
                                   "rollout_promoted"]
        servers = lb.servers()
        assert "canary" not in servers and servers["stable0"].weight == 100  # the balancer as it began
        assert not journal.journal_path(store).exists()
        assert counts["ok"] > 0
        runs = tracker.runs("tags.kind = 'rollout'")  # MLflow: one run, a step per stage with its figures
        assert [r.info.run_id for r in runs] == [res.run_id] and runs[0].info.status == "FINISHED"
        steps = tracker.client.get_metric_history(res.run_id, "stage_percent")
        assert [m.value for m in sorted(steps, key=lambda m: m.step)] == [20, 50, 100]
        gains = tracker.client.get_metric_history(res.run_id, "ttft_ms.mean_improvement")
        assert sorted(m.step for m in gains) == [0, 1]  # the judged stages (100% is judged on guardrails alone)
        assert champ.evidence == [res.run_id] and tracker.alias_version("canary", "champion") is not None


def test_worse_canary_is_rolled_back_at_its_first_stage(tmp_path: Path, stack: Callable[..., Any]) -> None:
    with stack(step_delay_ms=0) as (bal, _):
        ro, store = _rollout(tmp_path, bal, canary_delay_ms=40)  # every engine step 40 ms slower
        lb = HAProxy(bal.socket, bal.backend)
        _wait_up(lb, "stable0")
        with traffic(bal.url), store.lock():
            res = ro.run(CONFIG, trial=4, study="s")
        assert res.outcome == "rolled_back"
        assert len(res.stages) == 1 and res.stages[0].outcome in ("regressed", "breach"), res.reason
        assert res.stages[0].percent == 20  # the most a bad canary ever got
        assert res.canary_requests > 0
        assert store.champion() is None  # the champion unchanged
        assert _actions(store)[-1] == "rollout_rolled_back"
        servers = lb.servers()
        assert "canary" not in servers and servers["stable0"].weight == 100
        assert not journal.journal_path(store).exists()


def test_unhealthy_stable_replicas_refuse_the_rollout(tmp_path: Path, stack: Callable[..., Any]) -> None:
    with stack() as (bal, dep):
        ro, store = _rollout(tmp_path, bal, canary_delay_ms=0)
        lb = HAProxy(bal.socket, bal.backend)
        _wait_up(lb, "stable0")
        dep.server.stop()  # type: ignore[attr-defined]  # the stable replica dies
        deadline = time.monotonic() + 30
        while lb.servers()["stable0"].up:  # HAProxy's health check notices
            assert time.monotonic() < deadline
            time.sleep(0.2)
        with store.lock(), pytest.raises(RolloutRefused, match=r"stable0 \(DOWN"):
            ro.run(CONFIG, trial=5)
        assert _actions(store) == ["rollout_refused"]
        assert "canary" not in lb.servers() and not (tmp_path / "state" / "logs").exists()  # no canary started
