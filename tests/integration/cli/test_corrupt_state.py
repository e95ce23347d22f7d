"""A state dir damaged under the tuner (issue 30): a corrupt champion file (random bytes, a foreign mapping, a
truncated record, a special file) and a corrupt Optuna store (truncated, emptied, random bytes) are named as
corrupt by every command that reads them, with their exit code and what to do, never as "no champion" or
"no study yet"; rollback with a corrupt champion.yaml still finds the history record in force."""

from __future__ import annotations

import random
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.support import agents
from tests.support.spec_probe import special_file
from tuner.champions.store import ChampionRecord, ChampionStore
from tuner.cli.main import app
from tuner.errors import StateError


def _cli(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, list(args))
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r.exit_code, " ".join(r.output.split())


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A sim agent run by `tuner run` (2 trials, MLflow off) and two champions (#2 in force, #1 before it)."""
    d = tmp_path_factory.mktemp("state")
    agent = agents.write_agent(d / "agent.yaml", tracking={"enabled": False}, at={"workload.num_requests": 20})
    sd = d / "state"
    code, out = _cli("run", str(agent), "--trials", "2", "--state-dir", str(sd))  # records agent.json
    assert code == 0, out
    store = ChampionStore(sd, "agent")
    for seq, prev in ((1, None), (2, 1)):
        store.write_champion(ChampionRecord(seq=seq, agent="agent", config={"max_num_seqs": 16 * seq},
                                            study="agent", trial=seq - 1, previous_seq=prev))
        store.audit({"action": "promote", "seq": seq})
    return agent, sd


def _corruptions(seed: int) -> list[tuple[str, bytes | str]]:
    """Generated damage of a champion file: random bytes, a foreign mapping, a cut at a random offset, a list,
    nothing, a duplicate key; and special files."""
    rng = random.Random(seed)
    good = ChampionRecord(seq=2, agent="agent", config={"max_num_seqs": 32, "block_size": 16}, study="agent",
                          trial=1, previous_seq=1).to_yaml().encode()
    keys = ["name", "kind", "version", "foo", "seq"]
    return [
        ("random", bytes(rng.randrange(256) for _ in range(rng.randint(1, 400)))),
        ("foreign", "\n".join(f"{k}: {rng.randint(0, 9)}" for k in rng.sample(keys, 3)) + "\n"),
        ("truncated", good[:rng.randint(len(good) // 4, len(good) - 20)]),
        ("list", "- 1\n- 2\n"), ("empty", b""), ("dup", good.decode() + "seq: 3\n"),
        ("fifo", "fifo"), ("dir", "dir")]


CASES = [c for seed in range(2) for c in _corruptions(seed)]


def _damage(path: Path, kind: str, content: bytes | str) -> None:
    if path.is_dir():
        path.rmdir()
    else:
        path.unlink(missing_ok=True)
    if kind in ("fifo", "dir"):
        special_file(kind, path.parent, path.name)
    else:
        path.write_bytes(content if isinstance(content, bytes) else content.encode())


@pytest.mark.parametrize(("kind", "content"), CASES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(CASES)])
def test_a_corrupt_champion_file_is_named_by_status_and_report(ran: tuple[Path, Path], kind: str,
                                                                      content: bytes | str, tmp_path: Path) -> None:
    agent, sd = ran
    champ = sd / "agent" / "champion.yaml"
    saved = (sd / "agent" / "champions" / "000002.yaml").read_bytes()
    _damage(champ, kind, content)
    try:
        with pytest.raises(StateError, match="corrupt champion record"):
            ChampionStore(sd, "agent").champion()
        for cmd in (["status", str(agent)], ["status", str(agent), "--json"],
                    ["report", str(agent), "--out", str(tmp_path / "r.html")]):
            code, out = _cli(*cmd, "--state-dir", str(sd))
            assert code == StateError.exit_code, (cmd, out)
            assert "champion.yaml" in out and "corrupt champion record" in out, (cmd, out)
    finally:
        _damage(champ, "file", saved)


@pytest.mark.parametrize(("kind", "content"), CASES[:8], ids=[k for k, _ in CASES[:8]])
def test_rollback_with_a_corrupt_champion_file_finds_the_record_in_force(tmp_path: Path, kind: str,
                                                                        content: bytes | str) -> None:
    agent = agents.write_agent(tmp_path / "agent.yaml", tracking={"enabled": False})
    sd = tmp_path / "state"
    store = ChampionStore(sd, "agent")
    for seq, prev in ((1, None), (2, 1)):
        store.write_champion(ChampionRecord(seq=seq, agent="agent", config={"max_num_seqs": 16 * seq},
                                            previous_seq=prev))
        store.audit({"action": "promote", "seq": seq})
    _damage(store.champion_path, kind, content)
    code, out = _cli("rollback", str(agent), "--yes", "--state-dir", str(sd))
    if kind == "dir":  # nothing can be written where a directory stands: said so
        assert code == StateError.exit_code and "it is a directory" in out, out
        return
    assert code == 0, out
    rec = store.champion()
    assert rec is not None and rec.seq == 1 and rec.restored_from == 2


def test_rollback_says_what_is_wrong_when_the_history_cannot_help(tmp_path: Path) -> None:
    agent = agents.write_agent(tmp_path / "agent.yaml", tracking={"enabled": False})
    sd = tmp_path / "state"
    store = ChampionStore(sd, "agent")
    store.write_champion(ChampionRecord(seq=1, agent="agent", config={"max_num_seqs": 16}))
    store.audit({"action": "promote", "seq": 1})
    (store.history_dir / "000001.yaml").write_text("seq: [\n")
    store.champion_path.write_text("garbage: true\n")
    code, out = _cli("rollback", str(agent), "--yes", "--state-dir", str(sd))
    assert code == StateError.exit_code and "corrupt champion record" in out and "audit log" in out, out


def _store_damage(seed: int) -> list[tuple[str, Any]]:
    rng = random.Random(seed)
    return [("truncated", rng.uniform(0.1, 0.9)), ("emptied", 0), ("random", rng.randint(100, 5000)),
            ("foreign", "CREATE TABLE t (x)"), ("fifo", None), ("zeroed-head", rng.randint(16, 100))]


STORE_CASES = [c for seed in range(2) for c in _store_damage(seed)]


def _damaged_copy(sd: Path, dst: Path, kind: str, arg: Any) -> Path:
    """A copy of the state dir whose optuna.db (checkpointed, no -wal) is damaged as `kind` says."""
    con = sqlite3.connect(sd / "optuna.db")
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    shutil.copytree(sd, dst, ignore=shutil.ignore_patterns("*-wal", "*-shm"))
    db = dst / "optuna.db"
    data = db.read_bytes()
    rng = random.Random(len(data))
    db.unlink()
    if kind == "truncated":
        db.write_bytes(data[:int(len(data) * arg)])
    elif kind == "emptied":
        db.write_bytes(b"")
    elif kind == "random":
        db.write_bytes(bytes(rng.randrange(256) for _ in range(arg)))
    elif kind == "foreign":
        con = sqlite3.connect(db)
        con.execute(arg)
        con.close()
    elif kind == "fifo":
        special_file("fifo", dst, "optuna.db")
    elif kind == "zeroed-head":
        db.write_bytes(b"\0" * arg + data[arg:])
    return dst


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("kind", "arg"), STORE_CASES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(STORE_CASES)])
def test_a_corrupt_optuna_store_is_named_by_every_command(ran: tuple[Path, Path], tmp_path: Path, kind: str,
                                                         arg: Any) -> None:
    agent, sd = ran
    copy = _damaged_copy(sd, tmp_path / "state", kind, arg)
    before = (copy / "optuna.db").read_bytes() if kind != "fifo" else b""
    for cmd in (["status", "--json"], ["status"], ["report", "--out", str(tmp_path / "r.html")],
                ["run", "--trials", "1"], ["promote"], ["history"]):
        code, out = _cli(cmd[0], str(agent), *cmd[1:], "--state-dir", str(copy))
        if cmd[0] == "history" and code == 0:
            continue  # history reads the audit log, not the store
        assert code == StateError.exit_code, (cmd, out)
        assert "optuna.db" in out and ("corrupt Optuna store" in out or "not an Optuna store" in out), (cmd, out)
        assert "no study" not in out.replace("it holds no study", ""), (cmd, out)
    if kind != "fifo":
        assert (copy / "optuna.db").read_bytes() == before  # never replaced by a new study
