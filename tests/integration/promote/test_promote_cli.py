"""`tuner promote`, `rollback`, `history` end to end on the simulator with a real MLflow store (SQLite)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from tests.support import agents
from tuner.agent import load_agent
from tuner.champions.store import ChampionStore
from tuner.cli import ops as cli_ops
from tuner.loop import open_session, run_cycle
from tuner.tracking.tracker import Tracker, default_tracking_uri

REPO = Path(__file__).resolve().parents[3]
def _promo_agent(path: Path, apply: list[str] | None) -> Path:
    return agents.write_agent(
        path, name="promo", search_space={"params": {"max_num_seqs": {"type": "int", "low": 8, "high": 1024,
                                                                      "log": True, "default": 12}}},
        promotion={"verify_runs": 2, "min_improvement": 0.05, "apply_command": apply},
        at={"target.noise_cv": 0.01, "workload.num_requests": 120})


def app() -> typer.Typer:
    a = typer.Typer()
    cli_ops.register(a)
    return a


def setup(tmp_path: Path, apply: list[str] | None = None) -> tuple[Path, Path, dict[int, int]]:
    """An agent, a state dir, and trials with max_num_seqs 16, 32, 64 (trial number by max_num_seqs)."""
    agent_path = _promo_agent(tmp_path / "promo.yaml", apply)
    sd = tmp_path / "state"
    sd.mkdir()
    session = open_session(load_agent(agent_path), sd)
    for n in (16, 32, 64):
        session.study.study.enqueue_trial({"max_num_seqs": n})
    run_cycle(session, trials=4)
    numbers = {t.params["max_num_seqs"]: t.number for t in session.study.trials()}
    return agent_path, sd, numbers


def champion_config(sd: Path) -> dict:
    data = yaml.safe_load((sd / "promo" / "champion.yaml").read_text())
    return data["config"]


def aliases(sd: Path) -> tuple[str | None, str | None]:
    tr = Tracker(default_tracking_uri(sd), "promo")
    return tr.alias_version("promo", "champion"), tr.alias_version("promo", "previous")


def test_promote_rollback_history_move_the_aliases(tmp_path: Path) -> None:
    applied = tmp_path / "applied.yaml"
    copy = [sys.executable, "-c", "import os,shutil,sys; shutil.copy(os.environ['TUNER_CHAMPION_FILE'], sys.argv[1])",
            str(applied)]
    agent, sd, n = setup(tmp_path, copy)
    run = CliRunner().invoke
    r = run(app(), ["promote", str(agent), "--trial", str(n[32]), "--yes", "--state-dir", str(sd)])
    assert r.exit_code == 0, r.output
    assert champion_config(sd) == {"max_num_seqs": 32}
    assert yaml.safe_load(applied.read_text())["config"] == {"max_num_seqs": 32}
    assert aliases(sd) == ("1", None)

    r = run(app(), ["promote", str(agent), "--trial", str(n[64]), "--yes", "--state-dir", str(sd)])
    assert r.exit_code == 0, r.output
    assert champion_config(sd) == {"max_num_seqs": 64} and aliases(sd) == ("2", "1")

    # a candidate worse than the champion fails verification: nothing changes
    r = run(app(), ["promote", str(agent), "--trial", str(n[16]), "--yes", "--state-dir", str(sd)])
    assert r.exit_code != 0 and "failed verification" in r.output
    assert champion_config(sd) == {"max_num_seqs": 64} and aliases(sd) == ("2", "1")

    r = run(app(), ["rollback", str(agent), "--yes", "--state-dir", str(sd)])
    assert r.exit_code == 0, r.output
    assert champion_config(sd) == {"max_num_seqs": 32} and aliases(sd) == ("1", None)
    assert yaml.safe_load(applied.read_text())["config"] == {"max_num_seqs": 32}

    r = run(app(), ["history", str(agent), "--json", "--state-dir", str(sd)])
    assert r.exit_code == 0, r.output
    h = json.loads(r.output)
    assert set(h) == {"cycles", "verifications", "promotions", "events", "switches"}
    assert len(h["cycles"]) == 1 and h["cycles"][0]["trials_run"] == 4
    assert [(v["trial"], v["passed"]) for v in h["verifications"]] == [(n[32], True), (n[64], True), (n[16], False)]
    assert [p["action"] for p in h["promotions"]] == ["promote", "promote", "promote_rejected", "rollback"]
    assert all(p["user"] for p in h["promotions"])
    # the evidence of a promotion is the MLflow verification run, which holds both arms and the verdict
    ev = h["promotions"][1]["evidence"]
    tr = Tracker(default_tracking_uri(sd), "promo")
    vrun = tr.client.get_run(ev[0])
    assert vrun.data.tags["verdict"] == "pass" and vrun.data.tags["kind"] == "verification"
    assert {"A_output_throughput", "B_output_throughput", "improvement_low"} <= set(vrun.data.metrics)
    r = run(app(), ["history", str(agent), "--state-dir", str(sd)])
    assert r.exit_code == 0 and "rollback" in r.output


def test_a_failing_apply_command_leaves_the_old_champion(tmp_path: Path) -> None:
    agent, sd, n = setup(tmp_path)
    r = CliRunner().invoke(app(), ["promote", str(agent), "--trial", str(n[32]), "--yes", "--state-dir", str(sd)])
    assert r.exit_code == 0, r.output
    # now the operator adds an apply command that fails
    fail = json.dumps([sys.executable, "-c", "import sys; sys.exit(4)"])
    text = agent.read_text().replace("apply_command: null", f"apply_command: {fail}")
    agent.write_text(text)
    r = CliRunner().invoke(app(), ["promote", str(agent), "--trial", str(n[64]), "--yes", "--skip-verify",
                                   "--state-dir", str(sd)])
    assert r.exit_code != 0 and "exited 4" in r.output
    assert champion_config(sd) == {"max_num_seqs": 32}
    assert aliases(sd)[0] == "1"
    audit = ChampionStore(sd, "promo").audit_log()
    assert [a["action"] for a in audit] == ["promote", "promote_failed"]


def test_killed_mid_promote_the_champion_file_still_parses(tmp_path: Path) -> None:
    marker = tmp_path / "apply-started"
    slow = [sys.executable, "-c",
            "import os,sys,time; open(sys.argv[1],'w').write(str(os.getpid())); time.sleep(120)", str(marker)]
    agent, sd, n = setup(tmp_path)
    r = CliRunner().invoke(app(), ["promote", str(agent), "--trial", str(n[32]), "--yes", "--state-dir", str(sd)])
    assert r.exit_code == 0, r.output
    agent.write_text(agent.read_text().replace("apply_command: null", f"apply_command: {json.dumps(slow)}"))
    proc = subprocess.Popen([sys.executable, "-m", "tuner.cli", "promote", str(agent), "--trial", str(n[64]),
                             "--yes", "--skip-verify", "--state-dir", str(sd)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        assert proc.poll() is None, "promote ended before its apply command started"
        time.sleep(0.05)
    time.sleep(0.2)
    apply_pid = int(marker.read_text())
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    # whatever moment it died at, the file parses and holds the old or the new champion
    assert champion_config(sd) in ({"max_num_seqs": 32}, {"max_num_seqs": 64})
    # the apply command died with it (parent-death signal)
    deadline = time.monotonic() + 10
    while _alive(apply_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(apply_pid)
    # the next promote/rollback/lock holder restores the former champion and says so in the audit log
    store = ChampionStore(sd, "promo")
    with store.lock(timeout_s=5):
        pass
    assert champion_config(sd) == {"max_num_seqs": 32}
    assert store.audit_log()[-1]["action"] == "recovered"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_two_promotes_at_once_are_serialised(tmp_path: Path) -> None:
    store = ChampionStore(tmp_path, "a")
    with store.lock():
        with pytest.raises(Exception, match="holds"):
            with ChampionStore(tmp_path, "a").lock(timeout_s=0.3):
                pass
