"""A promote or rollback SIGKILLed at any step boundary is undone or completed at the next start (issue 30):
afterwards champion.yaml, audit.jsonl, `tuner history` and MLflow's aliases agree. The switch runs as a real
`tuner rollback` / `tuner promote` subprocess which a kill point ($TUNER_KILL_AT, tuner.base.proc.kill_point)
SIGKILLs; each boundary in turn, on a copy of one prepared state dir."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.integration.promote.test_promote_cli import aliases, app, setup
from tests.support.champion_check import disagreements
from tuner.base.proc import KILL_AT_ENV
from tuner.champions.store import ChampionRecord, ChampionStore
from tuner.context import open_context
from tuner.promotion.act import SWITCH_POINTS

pytestmark = [pytest.mark.process, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
BEFORE_COMMIT = SWITCH_POINTS[:SWITCH_POINTS.index("committed")]  # killed here, the switch is undone


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[int, int]]:
    """Trials with max_num_seqs 16, 32, 64; 32 then 64 promoted (MLflow versions 1 and 2)."""
    tmp = tmp_path_factory.mktemp("switch")
    agent, sd, n = setup(tmp)
    for size in (32, 64):
        r = CliRunner().invoke(app(), ["promote", str(agent), "--trial", str(n[size]), "--yes", "--skip-verify",
                                       "--state-dir", str(sd)])
        assert r.exit_code == 0, r.output
    assert aliases(sd) == ("2", "1")
    return agent, sd, n


def _killed(argv: list[str], point: str) -> None:
    env = {**os.environ, KILL_AT_ENV: point}
    proc = subprocess.run([sys.executable, "-m", "tuner.cli", *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == -9, f"not killed at {point}: rc {proc.returncode}\n{proc.stderr[-2000:]}"


def _agree(agent: Path, sd: Path) -> ChampionStore:
    """What every store says matches (tests/support/champion_check.py)."""
    r = CliRunner().invoke(app(), ["history", str(agent), "--json", "--state-dir", str(sd)])
    assert r.exit_code == 0, r.output
    assert disagreements(sd, "promo", history=json.loads(r.output)["promotions"]) == []
    return ChampionStore(sd, "promo")


def _next_start(agent: Path, sd: Path) -> None:
    """A read-only command's start, then a session's (tuner run, the daemon, promote, worker)."""
    open_context(agent, sd, create=False)
    assert not ChampionStore(sd, "promo").journal_path.exists(), "a read-only start left the journal"
    open_context(agent, sd).session()


def _kill_then_start(prepared: tuple[Path, Path, dict[int, int]], tmp_path: Path, argv: list[str],
                     point: str) -> tuple[Path, ChampionRecord, list[str]]:
    """On a copy of the prepared state: `tuner ARGV` killed at `point`, the next start, the stores' agreement.
    Returns the state dir, the champion in force and the audit log's actions."""
    agent, template, _ = prepared
    sd = tmp_path / "state"
    shutil.copytree(template, sd)
    _killed([*argv, str(agent), "--yes", "--state-dir", str(sd)], point)
    _next_start(agent, sd)
    store = _agree(agent, sd)
    champ = store.champion()
    assert champ is not None
    return sd, champ, [e["action"] for e in store.audit_log()]


@pytest.mark.parametrize("point", SWITCH_POINTS)
def test_a_rollback_killed_at_any_step_is_undone_or_completed(prepared: tuple[Path, Path, dict[int, int]],
                                                              tmp_path: Path, point: str) -> None:
    sd, champ, actions = _kill_then_start(prepared, tmp_path, ["rollback"], point)
    if point in BEFORE_COMMIT:
        assert champ.config == {"max_num_seqs": 64} and champ.restored_from is None
        assert actions[-1] == "recovered" and "rollback" not in actions
    else:
        assert champ.config == {"max_num_seqs": 32} and champ.restored_from == 2
        assert actions.count("rollback") == 1 and actions[-1] == "rollback"
    assert aliases(sd) == (("2", "1") if point in BEFORE_COMMIT else ("1", None))


@pytest.mark.parametrize("point", SWITCH_POINTS)
def test_a_promote_killed_at_any_step_is_undone_or_completed(prepared: tuple[Path, Path, dict[int, int]],
                                                             tmp_path: Path, point: str) -> None:
    n = prepared[2]
    _, champ, actions = _kill_then_start(prepared, tmp_path, ["promote", "--trial", str(n[16]), "--skip-verify"],
                                         point)
    if point in BEFORE_COMMIT:
        assert champ.config == {"max_num_seqs": 64} and actions[-1] == "recovered"
        assert actions.count("promote") == 2
    else:
        assert champ.config == {"max_num_seqs": 16} and champ.seq == 3
        assert actions.count("promote") == 3 and actions[-1] == "promote"
