"""The answer to a performance anomaly (tuner.monitor.respond): the champion re-verified against the baseline on
the testbed (a target whose throughput is known, passed in); one that still wins is an alert (the environment
changed), one that lost is rolled back to the champion before it."""

from __future__ import annotations

from pathlib import Path

from tests.support.promote_double import NoisyOptions, NoisyTarget, make_agent
from tuner.champions.db import champion_store
from tuner.loop import open_session
from tuner.monitor.respond import reverify_champion
from tuner.promotion.act import promote_config

GOOD = {"speed": 1.3, "ttft_ms": 100.0, "error_rate": 0.0, "flip": 0}  # 30 % over the baseline's throughput
WORSE = {"speed": 0.8, "ttft_ms": 100.0, "error_rate": 0.0, "flip": 0}  # 20 % under it


def test_a_champion_that_still_wins_is_an_alert_and_one_that_lost_is_rolled_back(tmp_path: Path) -> None:
    agent = make_agent(tmp_path, promotion={"verify_runs": 3})
    target = NoisyTarget(NoisyOptions(noise_cv=0.01))
    (tmp_path / "state").mkdir()
    session = open_session(agent, tmp_path / "state", target=target)
    out = reverify_champion(session, reason="latency anomaly", seed=1)
    assert out["action"] == "alert" and "no champion" in out["reason"] and target.deploys == []

    store = champion_store(session)
    first = promote_config(store, None, config=GOOD, apply_command=None, cwd=tmp_path, trial=1).record
    out = reverify_champion(session, reason="latency anomaly", seed=1)
    assert out["action"] == "alert" and "the environment changed" in out["reason"], out
    assert out["verdict"]["passed"] and out["champion_seq"] == first.seq
    assert {d["params"]["speed"] for d in target.deploys} == {1.0, 1.3}  # the baseline against the champion
    assert store.champion() is not None and store.champion().seq == first.seq  # nothing changed

    # a champion that no longer beats the baseline (here: one that never did) is rolled back to the one before it
    second = promote_config(store, None, config=WORSE, apply_command=None, cwd=tmp_path, trial=2).record
    out = reverify_champion(session, reason="latency anomaly", seed=2)
    assert out["action"] == "rolled_back" and out["champion_seq"] == second.seq, out
    assert out["restored_seq"] == first.seq and not out["verdict"]["passed"]
    now = store.champion()
    assert now is not None and now.config == GOOD and now.restored_from == second.seq
