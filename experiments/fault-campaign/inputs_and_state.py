"""The fault campaign's parts for issue 30's classes 1, 3, 6, 7, 14 (`inputs`) and 8-12 (`state`), run by
campaign.py (`--only inputs,state`), each on generated variants (tests/support/spec_probe.py's generators,
shared with the spec fuzz test):

- inputs: a generated spec with one hostile input, through `tuner validate` in a process of its own: an
  expression whose values nest past the size limit or whose work adds up past the work limit; the agent file,
  its search space, dataset or trace a FIFO, a directory, a device or a socket; a key written twice; a count,
  duration or period past its bound; a storage or tracking URL whose password holds '/', '@', '?' or '#'.
  Counted: an exit other than 2, a traceback, no answer in 60 s, the password in the output.
- state: the state dir of an agent that ran 2 trials and has two champions, damaged one way: champion.yaml
  (random bytes, a foreign mapping, a cut at a random offset), optuna.db (cut, emptied, random bytes), loose
  modes (the dir 0755/0775/0777, the audit log 0644), a full disk (a real tmpfs filled to a random few KB
  left), a read-only disk (the tmpfs remounted ro); then status --json, report, run and rollback. Counted: a
  traceback or a hang; a corrupt store a command calls fine or empty; a disk fault not named (exit 4 with
  "no space left" / "read-only"); modes not tightened to 0700/0600 by a run.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

PY = sys.executable
REPO = Path(__file__).resolve().parents[2]
BOUNDED = ["workload.num_requests", "workload.warmup_requests", "workload.duration_s", "workload.timeout_s",
           "workload.arrival.concurrency", "budget.trials", "budget.wall_time_s", "lease.timeout_s",
           "workload.prompt_tokens.value", "parallel_trials", "target.num_gpus", "schedule.every"]


def _tuner(args: list[str], timeout_s: float = 60) -> tuple[int | str, str]:
    """The tuner CLI in a process of its own: (exit code, or "hung" past `timeout_s`; stdout + stderr)."""
    try:
        r = subprocess.run([PY, "-m", "tuner.cli", *args], cwd=REPO, capture_output=True, text=True,
                           timeout=timeout_s, env={**os.environ, "PYTHONPATH": str(REPO)})
    except subprocess.TimeoutExpired as exc:
        return "hung", str(exc.stdout or "") + str(exc.stderr or "")
    return r.returncode, r.stdout + r.stderr


def _count(out: dict[str, Any], kind: str, bad: bool) -> None:
    out["variants"] += 1
    out["mishandled"] += int(bad)
    c = out["by_class"].setdefault(kind, [0, 0])
    c[0] += 1
    c[1] += int(bad)


def _hostile_spec(d: Path, kind: str, rng: random.Random) -> tuple[Path, str | None]:
    """The agent file of one variant of `kind` under `d`, and the secret it must not print (or None)."""
    import yaml

    from tests.support.agents import agent_spec
    from tests.support.spec_probe import (
        HUGE_NUMBERS,
        SPECIAL_KINDS,
        nested_tower,
        special_file,
        with_duplicate_key,
        work_chain,
    )

    spec = agent_spec(tracking={"enabled": False})
    path, secret = d / "agent.yaml", None
    if kind == "expression":
        spec["search_space"]["constraints"].append(nested_tower(rng) if rng.random() < 0.6 else work_chain(rng))
    elif kind == "special_file":
        target = special_file(rng.choice(SPECIAL_KINDS), d)
        where = rng.choice(["agent", "search_space", "dataset", "trace"])
        if where == "agent":
            return target, None
        if where == "search_space":
            spec["search_space"] = str(target)
        elif where == "dataset":
            spec["workload"]["dataset"] = str(target)
        else:
            spec["workload"]["arrival"] = {"kind": "trace", "trace": str(target)}
    elif kind == "huge_number":
        field = rng.choice(BOUNDED)
        if field == "schedule.every":
            spec["schedule"] = {"every": f"{rng.choice([10**20, 10**9, 99999])}{rng.choice('smhd')}"}
        else:
            node = spec
            keys = field.split(".")
            for k in keys[:-1]:
                node = node.setdefault(k, {})
            value = rng.choice(HUGE_NUMBERS)
            node[keys[-1]] = value if not isinstance(value, str) else 10**20
    elif kind == "password":
        secret = ("".join(rng.choice("abcdefgh0123456789") for _ in range(6)) + rng.choice("/@?#")
                  + "".join(rng.choice("ABCDEFGH0123456789") for _ in range(6)))
        url = f"postgresql://tuner:{secret}@db.example:5432/optuna"
        if rng.random() < 0.5:
            spec["storage"] = url
        else:
            spec["tracking"] = {"uri": url.replace("postgresql", "http"), "enabled": True}
    text = yaml.safe_dump(spec, sort_keys=False)
    if kind == "duplicate_key":
        text = with_duplicate_key(text, rng)[0]
    path.write_text(text)
    return path, secret


def hostile_inputs(work: Path, n: int, rng: random.Random) -> dict[str, Any]:
    """n generated hostile specs through `tuner validate` (see the module docstring)."""
    out: dict[str, Any] = {"variants": 0, "mishandled": 0, "by_class": {}}
    kinds = ["expression", "special_file", "duplicate_key", "huge_number", "password"]
    for i in range(n):
        d = work / f"in-{i}"
        d.mkdir()
        kind = kinds[i % len(kinds)]
        path, secret = _hostile_spec(d, kind, rng)
        code, output = _tuner(["validate", str(path)])
        leaked = secret is not None and (secret[:6] in output or secret[7:] in output)
        bad = code != 2 or "Traceback" in output or leaked
        _count(out, kind, bad)
        if bad:
            print(f"  mishandled {kind}: {path}: exit {code}: {output[-300:]!r}", flush=True)
    return out


def _mount_tmpfs(d: Path, size: str) -> bool:
    d.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(d)],
                          capture_output=True, check=False).returncode == 0


def _prepare(agent: Path, sd: Path) -> None:
    """2 trials by `tuner run` and two champions (#2 in force, #1 before it)."""
    from tuner.champions.store import ChampionRecord, ChampionStore

    code, output = _tuner(["run", str(agent), "--trials", "2", "--state-dir", str(sd)], 300)
    assert code == 0, output[-2000:]
    store = ChampionStore(sd, "agent")
    for seq, prev in ((1, None), (2, 1)):
        store.write_champion(ChampionRecord(seq=seq, agent="agent", config={"max_num_seqs": 16 * seq},
                                            previous_seq=prev))
        store.audit({"action": "promote", "seq": seq})


def _damage(kind: str, sd: Path, mnt: Path, rng: random.Random) -> None:
    if kind == "champion":
        cp = sd / "agent" / "champion.yaml"
        good = cp.read_bytes()
        cp.write_bytes(rng.choice([bytes(rng.randrange(256) for _ in range(rng.randint(1, 300))),
                                   f"name: {rng.randint(0, 99)}\nkind: x\n".encode(),
                                   good[:rng.randint(len(good) // 4, len(good) - 20)]]))
    elif kind == "optuna":
        db = sd / "optuna.db"
        data = db.read_bytes()
        db.write_bytes(rng.choice([data[:int(len(data) * rng.uniform(0.1, 0.9))], b"",
                                   bytes(rng.randrange(256) for _ in range(rng.randint(100, 4000)))]))
    elif kind == "modes":
        os.chmod(sd, rng.choice([0o755, 0o775, 0o777]))
        os.chmod(sd / "agent" / "audit.jsonl", 0o644)
    elif kind == "full":
        free = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
        with open(mnt / "filler", "wb") as f, contextlib.suppress(OSError):
            f.write(b"\0" * max(0, free - rng.choice([0, 256, 2048])))
    elif kind == "read_only":
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)


def _judge(kind: str, cmd: str, code: int | str, output: str) -> bool:
    """Whether the command handled the damage of `kind` (see the module docstring)."""
    flat = " ".join(output.split())
    if code == "hung" or "Traceback" in output:
        return False
    if kind == "champion" and cmd in ("status", "report"):
        return code == 4 and "corrupt champion record" in flat
    if kind == "champion" and cmd == "rollback":
        return code == 0  # the record in force comes from the audit log and the history
    if kind == "optuna" and cmd == "rollback":
        return code in (0, 4)  # rollback reads the champion files, not the Optuna store
    if kind == "optuna":
        return code == 4 and "Optuna store" in flat
    if kind == "modes":
        return code == 0 or cmd == "rollback"
    if kind == "full" and cmd in ("run", "rollback"):
        return code == 0 or (code == 4 and "no space left" in flat)
    if kind == "read_only":
        return code == 4 and "read-only" in flat
    return True


def damaged_state(work: Path, n: int, rng: random.Random) -> dict[str, Any]:
    """n damaged state dirs, each read and written by four commands (see the module docstring)."""
    from tests.support.agents import write_agent

    agent = write_agent(work / "agent.yaml", tracking={"enabled": False}, at={"workload.num_requests": 20})
    base = work / "base"
    _prepare(agent, base)
    con = sqlite3.connect(base / "optuna.db")  # the copies below leave the -wal out: its pages go in first
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    out: dict[str, Any] = {"variants": 0, "mishandled": 0, "by_class": {}, "skipped": 0}
    kinds = ["champion", "optuna", "modes", "full", "read_only"]
    for i in range(n):
        kind = kinds[i % len(kinds)]
        d = work / f"st-{i}"
        mnt = d / "mnt"
        mounted = False
        if kind in ("full", "read_only"):
            mounted = _mount_tmpfs(mnt, "3m")
            if not mounted:
                out["skipped"] += 1
                continue
            sd = mnt / "state"
            _prepare(agent, sd)
        else:
            sd = d / "state"
            shutil.copytree(base, sd, ignore=shutil.ignore_patterns("*-wal", "*-shm"))
        bad: list[str] = []
        try:
            _damage(kind, sd, mnt, rng)
            for cmd in (["status", "--json"], ["report", "--out", str(d / "r.html")], ["run", "--trials", "1"],
                        ["rollback", "--yes"]):
                code, output = _tuner([cmd[0], str(agent), *cmd[1:], "--state-dir", str(sd)], 120)
                if not _judge(kind, cmd[0], code, output):
                    bad.append(f"{cmd[0]}: exit {code}: {output[-200:]!r}")
            if kind == "modes":
                loose = [p for p in [sd, *sd.rglob("*")] if not p.is_symlink()
                         and stat.S_IMODE(p.lstat().st_mode) & 0o077]
                if loose:
                    bad.append(f"loose modes: {[str(p.relative_to(sd)) for p in loose][:5]}")
        finally:
            if mounted:
                subprocess.run(["umount", "-l", str(mnt)], check=False)
        _count(out, kind, bool(bad))
        if bad:
            print(f"  mishandled {kind} (st-{i}): {bad}", flush=True)
    return out
