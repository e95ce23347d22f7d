"""A `tuner rollout` SIGKILLed mid-stage (a real process, a real SIGKILL) leaves no traffic split without an
owner: its canary replica dies with it and HAProxy's health check takes the canary out of service at once; the
next start (`tuner rollout --recover`, as the daemon's start and every `tuner rollout` do) reverts the rest
from the journal: canary server removed, stable weights back, champion unchanged, the recovery audited."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.rollout.conftest import rollout_agent, traffic
from tests.support.logged_proc import output, start_logged
from tuner.champions.store import ChampionStore
from tuner.context import open_context
from tuner.loop import run_cycle
from tuner.promotion.audit import history
from tuner.rollout.lb import HAProxy

pytestmark = [pytest.mark.process, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]


def _tuner(*args: str) -> list[str]:
    return [sys.executable, "-m", "tuner.cli", *args]


def test_sigkill_mid_rollout_is_reverted_at_the_next_start(tmp_path: Path, stack: Callable[..., Any]) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    state = tmp_path / "state"
    with stack() as (bal, _):
        agent = rollout_agent(tmp_path / "canary.yaml", bal.socket, max_stage_s=600, min_requests=10_000)
        spec_text = agent.read_text().replace("num_requests: 10", "num_requests: 6")
        agent.write_text(spec_text + "budget: {trials: 1}\n")
        session = open_context(agent, state).session(plan=True)  # a study with a feasible trial 0 to roll out
        result = run_cycle(session, trials=1)
        assert result.outcomes[0].number == 0 and session.study.trial(0).user_attrs.get("feasible")
        lb = HAProxy(bal.socket, bal.backend)
        journal = state / "canary" / "rollout.journal"
        log = tmp_path / "rollout.log"
        with traffic(bal.url) as counts:
            proc = start_logged(_tuner("rollout", str(agent), "--trial", "0", "--skip-verify", "--yes",
                                       "--state-dir", str(state)), log, tmp_path, env)
            deadline = time.monotonic() + 240
            while not (journal.is_file() and json.loads(journal.read_text()).get("phase") == "stage"):
                assert proc.poll() is None, output(log)
                assert time.monotonic() < deadline, output(log)
                time.sleep(0.2)
            time.sleep(2.0)  # mid-stage: traffic split between stable and canary
            split = lb.servers()
            assert split["canary"].weight > 0 and split["stable0"].weight > 0
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
            # no owner: the canary's replica died with its owner and the health check takes it out of service
            deadline = time.monotonic() + 60
            while lb.servers()["canary"].up:
                assert time.monotonic() < deadline, "the canary stayed in service after its owner died"
                time.sleep(0.2)
            ok_before = counts["ok"]
            time.sleep(3.0)
            assert counts["ok"] > ok_before  # the stable replica serves on
            assert json.loads(journal.read_text())["phase"] == "stage"
        rec = subprocess.run(_tuner("rollout", str(agent), "--recover", "--json", "--state-dir", str(state)),
                             env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert rec.returncode == 0, rec.stdout[-2000:] + rec.stderr[-2000:]
        entry = json.loads(rec.stdout.strip().splitlines()[-1])["recovered"]
        assert entry["outcome"] == "reverted" and entry["phase"] == "stage" and entry["interrupted_pid"] == proc.pid
        servers = lb.servers()
        assert "canary" not in servers and servers["stable0"].weight == 100
        assert not journal.exists()
        store = ChampionStore(state, "canary")
        assert store.champion() is None
        actions = [e["action"] for e in store.audit_log()]
        assert actions[0] == "rollout_started" and actions[-1] == "rollout_recovered"
        promotions = [e["action"] for e in history(state, "canary", store=store)["promotions"]]  # `tuner history`
        assert promotions[0] == "rollout_started" and promotions[-1] == "rollout_recovered"
