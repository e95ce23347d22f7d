"""The daemon's start reverts a rollout its killed predecessor left (the journal and a split HAProxy backend, as
test_rollout_kill.py shows a SIGKILL leaves them), before its first cycle: canary removed, stable weights
restored, `rollout_recovered` audited."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.support.agents import write_agent
from tests.support.haproxy import running_haproxy
from tests.support.logged_proc import finish, output, start_logged
from tuner.base.files import atomic_write
from tuner.champions.store import ChampionStore
from tuner.rollout.lb import HAProxy

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[3]


def test_daemon_start_reverts_an_ownerless_rollout(tmp_path: Path) -> None:
    with running_haproxy(tmp_path / "hx", {"stable0": "127.0.0.1:9"}) as bal:  # health is not the point here
        lb = HAProxy(bal.socket, bal.backend)
        lb.set_weight("stable0", 60)  # mid-stage: 40% on a canary whose owner is gone
        lb.add_server("canary", "127.0.0.1:10", weight=40, health_path="/health")
        agent = write_agent(tmp_path / "dsim.yaml", name="dsim", schedule={"every": "1d"}, budget={"trials": 1},
                            rollout={"load_balancer": {"socket": str(bal.socket), "backend": bal.backend}})
        state = tmp_path / "state"
        store = ChampionStore(state, "dsim")
        journal = store.dir / "rollout.journal"
        atomic_write(journal, json.dumps({"id": "dead", "lb": lb.describe(), "canary": "canary", "phase": "stage",
                                          "stage": 1, "stable_weights": {"stable0": 100}, "pid": 999999}))
        log = tmp_path / "daemon.log"
        proc = start_logged([sys.executable, "-m", "tuner.cli", "daemon", str(agent), "--state-dir", str(state),
                             "--port", "-1", "--grace-s", "20"], log, ROOT)
        try:
            deadline = time.monotonic() + 120
            while journal.exists():
                assert proc.poll() is None, output(log)
                assert time.monotonic() < deadline, output(log)
                time.sleep(0.25)
            servers = lb.servers()
            assert "canary" not in servers and servers["stable0"].weight == 100
            rec = [e for e in store.audit_log() if e["action"] == "rollout_recovered"]
            assert len(rec) == 1 and rec[0]["outcome"] == "reverted" and rec[0]["interrupted_pid"] == 999999
        finally:
            proc.send_signal(signal.SIGTERM)
            finish(proc, log, timeout=60)


def test_recovery_of_a_rollout_killed_while_promoting(tmp_path: Path) -> None:
    """Killed between the champion file and the end of the promotion: the champion store's own journal restores
    the former champion, the rollout's restores the balancer; neither leaves the other half-done."""
    from tuner.champions.store import ChampionRecord
    from tuner.promotion.act import promote_config
    from tuner.rollout import journal as rj

    with running_haproxy(tmp_path / "hx", {"stable0": "127.0.0.1:9"}) as bal:
        lb = HAProxy(bal.socket, bal.backend)
        lb.set_weight("stable0", 0)  # the last stage: all on the canary
        lb.add_server("canary", "127.0.0.1:10", weight=100, health_path="/health")
        store = ChampionStore(tmp_path / "state", "a")
        promote_config(store, None, config={"x": 1}, apply_command=None, cwd=tmp_path, reason="former")
        new = ChampionRecord(seq=2, agent="a", config={"x": 2}, previous_seq=1)
        store.begin(new, "promote")  # the promote journal, then the new file, then the kill
        store.write_champion(new)
        atomic_write(rj.journal_path(store), json.dumps({"id": "dead", "lb": lb.describe(), "canary": "canary",
                                                         "phase": "promoting", "stable_weights": {"stable0": 100},
                                                         "pid": 999999}))
        with store.lock():  # the next holder: the store's recovery first, then the rollout's
            entry = rj.recover(store, tmp_path / "state")
        assert entry is not None and entry["outcome"] == "settled" and entry["champion_seq"] == 1
        champ = store.champion()
        assert champ is not None and champ.config == {"x": 1}  # the interrupted promotion did not stick
        servers = lb.servers()
        assert "canary" not in servers and servers["stable0"].weight == 100
        assert not rj.journal_path(store).exists() and not store.journal_path.exists()
        assert rj.recover(store, tmp_path / "state") is None
