"""Check: the paired test, token agreement, interleaved verification, candidate choice, champion files."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.promote_double import NoisyOptions, NoisyTarget, make_agent
from tuner.champions.store import ChampionRecord, ChampionStore, atomic_write
from tuner.errors import PromotionError
from tuner.loop import open_session, run_cycle
from tuner.promotion.act import check_and_act, promote_config, promote_trial, rollback
from tuner.promotion.stats import paired_test, token_agreement
from tuner.promotion.verify import select_candidate, verify


# ---------------------------------------------------------------- statistics
def test_paired_test_passes_a_clear_gain_and_rejects_an_equal_one() -> None:
    a = [100.0, 103.0, 98.0, 101.0, 99.0]
    better = [x * 1.15 * f for x, f in zip(a, [1.01, 0.99, 1.0, 1.02, 0.98], strict=True)]
    res = paired_test(a, better, direction="maximize", min_improvement=0.02, confidence=0.95)
    assert res.passed and 0.13 < res.improvement < 0.17 and res.improvement_low > 0.02 and res.p_value < 0.05
    same = [x * f for x, f in zip(a, [1.01, 0.99, 1.0, 1.02, 0.98], strict=True)]
    res = paired_test(a, same, direction="maximize", min_improvement=0.02, confidence=0.95)
    assert not res.passed and res.improvement_low < 0.02 and res.p_value > 0.05


def test_paired_test_inverts_minimised_metrics_and_needs_positive_values() -> None:
    ref = [200.0, 210.0, 190.0]
    faster = [x / 1.3 for x in ref]  # latency 30% lower: better when minimised
    assert paired_test(ref, faster, direction="minimize", min_improvement=0.02, confidence=0.9).passed
    assert not paired_test(ref, faster, direction="maximize", min_improvement=0.02, confidence=0.9).passed
    bad = paired_test([1.0, 0.0], [1.0, 2.0], direction="maximize", min_improvement=0.0, confidence=0.9)
    assert not bad.passed and math.isnan(bad.improvement)
    boot = paired_test([100.0, 101.0, 99.0, 100.0], [120.0, 121.0, 118.0, 119.0], direction="maximize",
                       min_improvement=0.02, confidence=0.95, method="bootstrap")
    assert boot.passed and boot.method == "bootstrap"
    with pytest.raises(ValueError):
        paired_test([1.0], [1.0], direction="maximize", min_improvement=0.0, confidence=0.9)


def test_token_agreement_counts_positions_of_the_reference() -> None:
    ref = [[1, 2, 3, 4], [5, 6]]
    assert token_agreement(ref, ref) == 1.0
    assert token_agreement(ref, [[1, 2, 0, 4], [5, 6]]) == pytest.approx(5 / 6)
    assert token_agreement(ref, [[1, 2]]) == pytest.approx(2 / 6)  # missing tokens count as wrong


# ---------------------------------------------------------------- verification
def _session(tmp_path: Path, *, cv: float = 0.0, probe: bool = False, **promotion: object):
    agent = make_agent(tmp_path, promotion=dict(promotion))
    target = NoisyTarget(NoisyOptions(noise_cv=cv, probe=probe))
    (tmp_path / "state").mkdir(parents=True, exist_ok=True)
    return open_session(agent, tmp_path / "state", target=target), target


def test_verify_alternates_champion_and_candidate_with_distinct_seeds(tmp_path: Path) -> None:
    session, target = _session(tmp_path, cv=0.02, verify_runs=4)
    cand = {"speed": 1.3, "ttft_ms": 100.0, "error_rate": 0.0, "flip": 0}
    v = verify(session, cand, candidate_trial=7)
    labels = [d["label"] for d in target.deploys]
    assert labels == [f"verify-1-{i}-{arm}" for i in range(1, 5) for arm in "AB"]
    assert [d["params"]["speed"] for d in target.deploys] == [1.0, 1.3] * 4  # baseline stands in for A
    assert len({d["seed"] for d in target.deploys}) == 8
    assert v.passed and v.reference == "baseline" and v.test is not None and v.test.n == 4
    assert 0.25 < v.test.improvement < 0.35
    # recorded: a second verification numbers its runs on
    store = ChampionStore(session.state_dir, "noisy")
    assert store.judged(session.study.name) == {7}
    verify(session, cand, candidate_trial=8)
    assert target.deploys[8]["label"] == "verify-2-1-A"


@pytest.mark.parametrize(("cand", "word"), [
    ({"speed": 1.5, "ttft_ms": 900.0}, "SLO"),
    ({"speed": 1.5, "error_rate": 0.05}, "error rate"),
    ({"speed": 1.5, "flip": 3}, "token agreement"),
    ({"speed": 1.01}, "not shown better"),
])
def test_verify_guardrails(tmp_path: Path, cand: dict[str, float], word: str) -> None:
    session, target = _session(tmp_path, probe=True, verify_runs=3)
    v = verify(session, {"ttft_ms": 100.0, "error_rate": 0.0, "flip": 0, **cand}, candidate_trial=1)
    assert not v.passed and word in v.reason, v.reason


def test_verify_fails_when_the_candidate_cannot_deploy(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    target = NoisyTarget(fail_speed=1.7)
    (tmp_path / "state").mkdir()
    session = open_session(agent, tmp_path / "state", target=target)
    v = verify(session, {"speed": 1.7}, candidate_trial=3)
    assert not v.passed and "out_of_memory" in v.reason and len(v.runs) == 2


def test_verify_stops_when_asked(tmp_path: Path) -> None:
    import threading

    session, target = _session(tmp_path)
    stop = threading.Event()
    stop.set()
    v = verify(session, {"speed": 1.5}, candidate_trial=2, stop_event=stop)
    assert v.interrupted and not v.passed and target.deploys == []
    assert ChampionStore(session.state_dir, "noisy").judged(session.study.name) == set()  # judged again later


# ---------------------------------------------------------------- candidates and act
def test_candidate_is_the_best_unjudged_trial_better_than_the_reference(tmp_path: Path) -> None:
    session, _ = _session(tmp_path)
    run_cycle(session, trials=6)
    trials = session.study.trials()
    best = max((t for t in trials if t.user_attrs.get("feasible")), key=lambda t: t.values[0])
    cand = select_candidate(session)
    assert cand is not None and cand.number == best.number and cand.number != 0  # never the baseline itself
    out = check_and_act(session)  # manual policy: verified, left pending
    store = ChampionStore(session.state_dir, "noisy")
    assert out["action"] in ("pending", "none")
    assert best.number in store.judged(session.study.name)
    nxt = select_candidate(session)
    assert nxt is None or nxt.number != best.number
    if out["action"] == "pending":
        assert store.pending()["trial"] == best.number


def test_auto_policy_promotes_and_manual_promote_reuses_pending_evidence(tmp_path: Path) -> None:
    session, target = _session(tmp_path, policy="auto", verify_runs=3)
    t = session.study.study.enqueue_trial({"speed": 1.5, "ttft_ms": 100.0, "error_rate": 0.0, "flip": 0})
    assert t is None
    run_cycle(session, trials=2)  # baseline + the enqueued one
    out = check_and_act(session)
    assert out["action"] == "promoted", out
    champ = ChampionStore(session.state_dir, "noisy").champion()
    assert champ is not None and champ.config["speed"] == 1.5 and champ.verified and champ.previous_seq is None

    # manual: pending, then `tuner promote` reuses the evidence (no new deploys) after confirmation
    s2, t2 = _session(tmp_path / "m", verify_runs=3)
    s2.study.study.enqueue_trial({"speed": 1.6, "ttft_ms": 100.0, "error_rate": 0.0, "flip": 0})
    run_cycle(s2, trials=2)
    assert check_and_act(s2)["action"] == "pending"
    n = len(t2.deploys)
    asked: list[str] = []
    with pytest.raises(PromotionError, match="cancelled"):
        promote_trial(s2, confirm=lambda m: asked.append(m) is not None)
    res = promote_trial(s2, confirm=lambda m: True)
    assert len(t2.deploys) == n and asked and "speed: 1.6" in asked[0]
    speedy = next(t for t in s2.study.trials() if t.params["speed"] == 1.6)
    assert res.record.trial == speedy.number and "pending candidate verified" in res.record.reason
    assert ChampionStore(s2.state_dir, "noisy").pending() is None


def test_promote_rejects_a_candidate_that_fails_verification(tmp_path: Path) -> None:
    session, _ = _session(tmp_path, verify_runs=2)
    session.study.study.enqueue_trial({"speed": 1.0, "ttft_ms": 50.0, "error_rate": 0.0, "flip": 0})
    run_cycle(session, trials=2)
    worse = next(t for t in session.study.trials() if t.params["ttft_ms"] == 50.0).number
    with pytest.raises(PromotionError, match="failed verification"):
        promote_trial(session, trial=worse, confirm=lambda m: True)
    store = ChampionStore(session.state_dir, "noisy")
    assert store.champion() is None
    assert store.audit_log()[-1]["action"] == "promote_rejected"
    res = promote_trial(session, trial=worse, skip_verify=True, confirm=lambda m: True, reason="ops")
    assert not res.record.verified and "SKIPPED" in res.record.reason
    assert store.audit_log()[-1]["verified"] is False


# ---------------------------------------------------------------- files, apply, rollback (no MLflow)
@pytest.mark.process
def test_champion_file_apply_failure_and_rollback(tmp_path: Path) -> None:
    store = ChampionStore(tmp_path, "a")
    applied = tmp_path / "applied.txt"
    copy = f"import os,shutil;shutil.copy(os.environ['TUNER_CHAMPION_FILE'], {str(applied)!r})"
    ok_cmd = [sys.executable, "-c", copy]
    r1 = promote_config(store, None, config={"x": 1}, apply_command=ok_cmd, cwd=tmp_path, trial=1, reason="r1")
    assert yaml.safe_load(applied.read_text())["config"] == {"x": 1}
    r2 = promote_config(store, None, config={"x": 2}, apply_command=ok_cmd, cwd=tmp_path, trial=2)
    assert r2.record.previous_seq == r1.record.seq
    with pytest.raises(PromotionError, match="exited 3"):
        promote_config(store, None, config={"x": 3}, apply_command=[sys.executable, "-c", "import sys; sys.exit(3)"],
                       cwd=tmp_path, trial=3)
    assert store.champion().config == {"x": 2}  # the failed apply left the former champion
    assert not store.journal_path.exists()
    back = rollback(store, None, apply_command=ok_cmd, cwd=tmp_path)
    assert back.record.config == {"x": 1} and back.record.restored_from == r2.record.seq
    assert yaml.safe_load(applied.read_text())["config"] == {"x": 1}
    with pytest.raises(PromotionError, match="no previous champion"):
        rollback(store, None, apply_command=None, cwd=tmp_path)
    actions = [e["action"] for e in store.audit_log()]
    assert actions == ["promote", "promote", "promote_failed", "rollback"]


def test_an_interrupted_promote_is_rolled_back_by_the_next_lock_holder(tmp_path: Path) -> None:
    store = ChampionStore(tmp_path, "a")
    promote_config(store, None, config={"x": 1}, apply_command=None, cwd=tmp_path)
    old_text = store.champion_path.read_text()
    # what a promote killed between the file write and the end of its apply command leaves behind
    new = ChampionRecord(seq=2, agent="a", config={"x": 2}, previous_seq=1)
    store.begin(new, "promote")
    store.write_champion(new)
    assert store.champion().config == {"x": 2}
    with store.lock():
        pass
    assert store.champion_path.read_text() == old_text and not store.journal_path.exists()
    assert store.audit_log()[-1]["action"] == "recovered"


def test_atomic_write_leaves_no_temp_files(tmp_path: Path) -> None:
    p = tmp_path / "f.json"
    atomic_write(p, json.dumps({"a": 1}))
    atomic_write(p, json.dumps({"a": 2}))
    assert json.loads(p.read_text()) == {"a": 2} and [x.name for x in tmp_path.iterdir()] == ["f.json"]


def test_act_through_an_injected_promote_records_a_rolled_back_canary(tmp_path: Path) -> None:
    """The daemon's Act with a rollout: check_and_act promotes through the promote it is given (tuner.rollout's
    canary promoter); one that declines with an action (a canary rolled back) is an outcome, the champion stays."""
    from tuner.rollout.rollout import RolledBack, RolloutResult

    session, _ = _session(tmp_path, policy="auto", verify_runs=2)
    session.study.study.enqueue_trial({"speed": 1.5, "ttft_ms": 100.0, "error_rate": 0.0, "flip": 0})
    run_cycle(session, trials=2)
    calls: list[dict[str, object]] = []

    def rolled_back(store: ChampionStore, tracker: object, **kw: object) -> object:
        calls.append(kw)
        raise RolledBack("canary rolled back: stage 1 (5%) regressed", RolloutResult("x", "rolled_back", "r"))

    out = check_and_act(session, promote=rolled_back)
    assert out["action"] == "rolled_back" and "regressed" in out["reason"]
    assert calls and calls[0]["config"]["speed"] == 1.5 and calls[0]["_locked"] is True
    assert ChampionStore(session.state_dir, "noisy").champion() is None
    assert check_and_act(session, promote=rolled_back)["action"] == "none"  # judged: not rolled out again
