"""A state dir the tuner does not control (issue 30): one that already exists with a loose mode is made 0700
and every file the tuner creates in it is 0600 (locks and the audit log included) whatever the umask; a shared
directory (1777: /tmp, a tmpfs mount point) is refused with what to give instead."""

from __future__ import annotations

import contextlib
import os
import random
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.support import agents
from tuner.champions.store import ChampionRecord, ChampionStore
from tuner.cli.main import app
from tuner.errors import StateError


def _cli(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, list(args))
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r.exit_code, " ".join(r.output.split())


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _loose(path: Path) -> list[str]:
    """Every file or directory under `path` (itself included) that group or others may use."""
    out = []
    for p in [path, *path.rglob("*")]:
        mode = stat.S_IMODE(p.lstat().st_mode)
        if not p.is_symlink() and mode & 0o077:
            out.append(f"{p.relative_to(path)}: {oct(mode)}")
    return out


@pytest.mark.parametrize("seed", range(3))
def test_an_existing_state_dir_is_made_private_and_every_file_in_it_0600(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    mode, umask = rng.choice([0o755, 0o775, 0o777, 0o750, 0o711]), rng.choice([0o022, 0o002, 0o000])
    sd = tmp_path / "state"
    sd.mkdir()
    os.chmod(sd, mode)
    agent = agents.write_agent(tmp_path / "agent.yaml", tracking={"enabled": False},
                               at={"workload.num_requests": 20})
    with _umask(umask):
        code, out = _cli("run", str(agent), "--trials", "1", "--state-dir", str(sd))
        assert code == 0, out
        store = ChampionStore(sd, "agent")
        with store.lock():
            store.write_champion(ChampionRecord(seq=1, agent="agent", config={"max_num_seqs": 16}))
            store.audit({"action": "promote", "seq": 1})
    assert stat.S_IMODE(sd.stat().st_mode) == 0o700
    assert (sd / "agent" / "audit.jsonl").exists() and store.lock_path.exists()
    assert _loose(sd) == [], _loose(sd)
    files = [p for p in sd.rglob("*") if p.is_file()]
    assert files and all(stat.S_IMODE(p.stat().st_mode) & 0o077 == 0 for p in files), \
        [f"{p}: {oct(stat.S_IMODE(p.stat().st_mode))}" for p in files if stat.S_IMODE(p.stat().st_mode) & 0o077]


def test_an_existing_loose_audit_log_is_tightened(tmp_path: Path) -> None:
    store = ChampionStore(tmp_path, "agent")
    store.audit_path.write_text("")
    os.chmod(store.audit_path, 0o644)
    store.audit({"action": "note"})
    assert stat.S_IMODE(store.audit_path.stat().st_mode) == 0o600


def _mount_tmpfs(d: Path, size: str) -> bool:
    d.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=1777", "tmpfs", str(d)],
                       capture_output=True, text=True, check=False)
    return r.returncode == 0


@pytest.mark.parametrize("where", ["sticky-dir", "tmpfs"])
def test_a_shared_directory_is_refused_as_the_state_dir(tmp_path: Path, where: str) -> None:
    sd = tmp_path / "shared"
    mounted = False
    if where == "tmpfs":
        mounted = _mount_tmpfs(sd, "4m")
        if not mounted:
            pytest.skip("cannot mount a tmpfs here (not root)")
    else:
        sd.mkdir()
        os.chmod(sd, 0o1777)
    try:
        agent = agents.write_agent(tmp_path / "agent.yaml", tracking={"enabled": False},
                                   at={"workload.num_requests": 20})
        code, out = _cli("run", str(agent), "--trials", "1", "--state-dir", str(sd))
        assert code == StateError.exit_code and "shared directory" in out and "tuner" in out, out
        assert stat.S_IMODE(sd.stat().st_mode) == 0o1777 and list(sd.iterdir()) == []
        code, out = _cli("run", str(agent), "--trials", "1", "--state-dir", str(sd / "tuner"))
        assert code == 0, out
        assert stat.S_IMODE((sd / "tuner").stat().st_mode) == 0o700
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(sd)], check=False)


@contextlib.contextmanager
def _tmpfs(d: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of `size` mounted at `d` (mode 0700 at its root), unmounted afterwards."""
    d.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(d)],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def _fill(d: Path, leave_bytes: int) -> None:
    """Fill the file system of `d` up to `leave_bytes` of free space."""
    free = os.statvfs(d).f_bavail * os.statvfs(d).f_frsize
    with open(d / "filler", "wb") as f:
        with contextlib.suppress(OSError):
            f.write(b"\0" * max(0, free - leave_bytes))


def _ran(tmp_path: Path, sd: Path) -> Path:
    agent = agents.write_agent(tmp_path / "agent.yaml", tracking={"enabled": False},
                               at={"workload.num_requests": 20})
    # in a process of its own: no SQLite handle of this one stays open on the file system (a remount would fail)
    r = subprocess.run([sys.executable, "-m", "tuner.cli", "run", str(agent), "--trials", "1", "--state-dir",
                        str(sd)], capture_output=True, text=True, timeout=300, check=False,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])})
    assert r.returncode == 0, r.stderr[-2000:]
    store = ChampionStore(sd, "agent")
    for seq, prev in ((1, None), (2, 1)):
        store.write_champion(ChampionRecord(seq=seq, agent="agent", config={"max_num_seqs": 16 * seq},
                                            previous_seq=prev))
        store.audit({"action": "promote", "seq": seq})
    return agent


@pytest.mark.parametrize("seed", range(3))
def test_a_full_disk_is_one_error_naming_the_directory(tmp_path: Path, seed: int) -> None:
    """The state dir's file system fills up (a random few KB left): run and rollback end with one error line
    naming the directory and exit 4, no traceback; what was recorded before is still there."""
    rng = random.Random(seed)
    with _tmpfs(tmp_path / "mnt", "3m") as mnt:
        sd = mnt / "state"
        agent = _ran(tmp_path, sd)
        _fill(mnt, rng.choice([0, 0, 512]))
        for cmd in (["run", "--trials", str(rng.randint(2, 4))], ["rollback", "--yes"]):
            code, out = _cli(cmd[0], str(agent), *cmd[1:], "--state-dir", str(sd))
            if code == 0:  # what it wrote fitted in the space left
                continue
            assert code == StateError.exit_code, (cmd, out)
            assert "no space left" in out and str(mnt) in out and "Traceback" not in out, (cmd, out)
        (mnt / "filler").unlink()
        code, out = _cli("status", str(agent), "--state-dir", str(sd))
        assert code == 0 and "agent" in out, out


def test_a_read_only_state_dir_is_named_as_read_only(tmp_path: Path) -> None:
    with _tmpfs(tmp_path / "mnt", "4m") as mnt:
        sd = mnt / "state"
        agent = _ran(tmp_path, sd)
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        for cmd in (["status"], ["status", "--json"], ["report", "--out", str(tmp_path / "r.html")],
                    ["run", "--trials", "1"], ["rollback", "--yes"]):
            code, out = _cli(cmd[0], str(agent), *cmd[1:], "--state-dir", str(sd))
            assert code == StateError.exit_code, (cmd, out)
            assert "read-only" in out and str(sd) in out and "max length" not in out, (cmd, out)
