"""The champion store of one agent: champion file, champion history, pending candidate, audit log, lock.

Layout under <state-dir>/<agent>/:

    champion.yaml          the configuration in force (written atomically: temp file, fsync, rename)
    scenarios/<name>/      a scenario's own champion: the same files (tuner.scenarios)
    champions/<seq>.yaml   every champion record ever promoted (rollback walks `previous_seq`)
    pending.yaml           a verified candidate waiting for an operator (manual policy)
    verifications.jsonl    one line per verification (candidate, verdict, reason, evidence run id)
    audit.jsonl            one line per promote / rollback / failure (time, user, trial, evidence, reason)
    promote.journal        exists only while a promote or rollback is in flight or was killed: the former champion
                           (undone at the next start) until the commit point, then what the switch still owes
                           (its audit entry, the pending candidate to clear: completed at the next start)
    promote.lock           fcntl.flock: promotes and rollbacks of one agent are serialised

Pure file handling: no MLflow, no Optuna, no targets.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import json
import logging
import os
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tuner.base.files import atomic_write, private_dir, private_file, read_text_bounded
from tuner.base.proc import kill_point
from tuner.base.yamlio import parse_yaml
from tuner.errors import ConfigError, PromotionError, StateError

log = logging.getLogger(__name__)


def append_jsonl(path: Path, entry: dict[str, Any]) -> None:
    private_dir(path.parent, tighten=False)
    line = json.dumps(entry, sort_keys=True, default=str) + "\n"
    with open(private_file(path), "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every well-formed line (a torn last line from a crash is skipped)."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            log.warning("%s: skipping a malformed line", path)
    return out


def current_user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry in some containers
        return os.environ.get("USER", "unknown")


def scenario_dir(state_dir: Path, agent: str, scenario: str) -> Path:
    """Where a scenario's champion, lineage and fitted workload live: <state>/<agent>/scenarios/<scenario>."""
    return Path(state_dir) / agent / "scenarios" / scenario


def alias_part(name: str) -> str:
    """A scenario name as MLflow takes it in an alias (letters, digits, _ and -)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)


@dataclass
class ChampionRecord:
    """A configuration in force, with where it came from."""

    seq: int
    agent: str
    config: dict[str, Any]
    study: str | None = None
    trial: int | None = None
    values: list[float] | None = None
    promoted_at: float = field(default_factory=time.time)
    user: str = field(default_factory=current_user)
    reason: str = ""
    evidence: list[str] = field(default_factory=list)  # MLflow run ids (verification runs)
    verified: bool = True
    previous_seq: int | None = None
    model_name: str | None = None
    model_version: str | None = None
    restored_from: int | None = None  # set by rollback: the seq of the champion that was undone

    def to_yaml(self) -> str:
        return yaml.safe_dump(asdict(self), sort_keys=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChampionRecord:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    @classmethod
    def load(cls, path: Path) -> ChampionRecord:
        """The record of a champion file, checked whole: a StateError naming the file as corrupt when it is not
        a regular file of at most MAX_RECORD_BYTES, not YAML, not a mapping, lacks a field (a foreign mapping;
        a truncated file: the writer writes every field, the config first, so a cut loses the last ones) or holds
        a field of the wrong type."""
        def corrupt(why: str) -> StateError:
            return StateError(f"{path}: corrupt champion record: {why}. Restore it from a copy or from the "
                              "agent's history (champions/NNNNNN.yaml, one per promotion); `tuner rollback` finds "
                              "the champion in force in the audit log")

        try:
            data, _ = parse_yaml(read_text_bounded(path, MAX_RECORD_BYTES), str(path))  # no duplicate keys
        except ConfigError as exc:
            raise corrupt(exc.raw_message + (f" (line {exc.line})" if exc.line else "")) from None
        if not isinstance(data, dict):
            raise corrupt(f"it holds {type(data).__name__ if data is not None else 'nothing'}, not a mapping")
        missing = [k for k in cls.__dataclass_fields__ if k not in data]
        if missing:
            raise corrupt(f"field(s) {', '.join(missing)} missing (a truncated or foreign file)")
        for name, types in _FIELD_TYPES.items():
            value = data[name]
            if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
                raise corrupt(f"field {name} is a {type(value).__name__}")
        if data["seq"] < 1:
            raise corrupt(f"field seq is {data['seq']}, not a sequence number >= 1")
        return cls.from_dict(data)


MAX_RECORD_BYTES = 4 * 2**20  # a champion file (a configuration and its provenance)
_NONE = type(None)
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "seq": (int,), "agent": (str,), "config": (dict,), "study": (str, _NONE), "trial": (int, _NONE),
    "values": (list, _NONE), "promoted_at": (int, float), "user": (str,), "reason": (str,), "evidence": (list,),
    "verified": (bool,), "previous_seq": (int, _NONE), "model_name": (str, _NONE), "model_version": (str, _NONE),
    "restored_from": (int, _NONE)}


class ChampionStore:
    """Files of one agent's champion (see the module docstring)."""

    def __init__(self, state_dir: Path, agent: str, scenario: str | None = None) -> None:
        self.agent = agent
        self.scenario = scenario  # a scenario's own champion (tuner.scenarios), else the agent's in service
        self.dir = Path(state_dir) / agent if scenario is None else scenario_dir(state_dir, agent, scenario)
        private_dir(self.dir, tighten=False)

    @property
    def alias(self) -> str:
        """The MLflow alias of this store's champion on the agent's registered model."""
        return "champion" if self.scenario is None else f"scenario-{alias_part(self.scenario)}"

    @property
    def previous_alias(self) -> str:
        return "previous" if self.scenario is None else f"{self.alias}-previous"

    # ------------------------------------------------------------ paths
    @property
    def champion_path(self) -> Path:
        return self.dir / "champion.yaml"

    @property
    def history_dir(self) -> Path:
        return self.dir / "champions"

    @property
    def pending_path(self) -> Path:
        return self.dir / "pending.yaml"

    @property
    def audit_path(self) -> Path:
        return self.dir / "audit.jsonl"

    @property
    def verifications_path(self) -> Path:
        return self.dir / "verifications.jsonl"

    @property
    def journal_path(self) -> Path:
        return self.dir / "promote.journal"

    @property
    def lock_path(self) -> Path:
        return self.dir / "promote.lock"

    # ------------------------------------------------------------ lock
    @contextlib.contextmanager
    def lock(self, timeout_s: float | None = None) -> Iterator[None]:
        """Serialise promotes and rollbacks of this agent across processes (fcntl.flock)."""
        f = open(private_file(self.lock_path), "a+")  # noqa: SIM115 - closed below
        try:
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if deadline is not None and time.monotonic() >= deadline:
                        raise PromotionError(
                            f"another promote or rollback of {self.agent!r} holds {self.lock_path}") from None
                    time.sleep(0.05)
            try:
                self.recover()
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        finally:
            f.close()

    # ------------------------------------------------------------ champion
    def champion(self) -> ChampionRecord | None:
        """The champion in force; None when there is none; a StateError when its file is corrupt."""
        if not os.path.lexists(self.champion_path):
            return None
        return ChampionRecord.load(self.champion_path)

    def record(self, seq: int) -> ChampionRecord | None:
        """History record `seq`; None when it was never written; a StateError when its file is corrupt."""
        p = self.history_dir / f"{seq:06d}.yaml"
        if not os.path.lexists(p):
            return None
        return ChampionRecord.load(p)

    def champion_in_force(self) -> ChampionRecord | None:
        """`champion()`, or when champion.yaml is corrupt the record the audit log last put in force (a warning
        says so); a StateError naming both when neither can be read."""
        try:
            return self.champion()
        except StateError as exc:
            if self.champion_path.is_dir():  # nothing can be written in its place
                raise StateError(f"{exc}; it is a directory: move it away, then run the command again") from None
            cur = self.in_force_by_audit()
            if cur is None:
                raise StateError(f"{exc}; and the audit log names no readable history record in force") from None
            log.warning("%s; the audit log puts champion #%d in force", exc, cur.seq)
            return cur

    def in_force_by_audit(self) -> ChampionRecord | None:
        """When champion.yaml is corrupt: the history record the audit log last put in force (the last promote,
        rollback or apply entry's seq), if it is readable; None otherwise."""
        for entry in reversed(self.audit_log()):
            seq = entry.get("seq")
            if entry.get("action") in ("promote", "rollback") and isinstance(seq, int):
                try:
                    return self.record(seq)
                except StateError:
                    return None
        return None

    def next_seq(self) -> int:
        seqs = [int(p.stem) for p in self.history_dir.glob("*.yaml") if p.stem.isdigit()]
        return max(seqs, default=0) + 1

    def begin(self, new: ChampionRecord | None, action: str) -> str | None:
        """Write the journal (old content) before the champion file changes. Returns the old content."""
        old = self.champion_text()
        self._write_journal({"action": action, "old": old, "new_seq": new.seq if new else None, "phase": "switching",
                             "pid": os.getpid(), "host": socket.gethostname(), "at": time.time()})
        return old

    def champion_text(self) -> str | None:
        """The champion in force as the journal keeps it (None: no champion)."""
        path = self.champion_path  # a corrupt one as it is (undecodable bytes replaced)
        return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None

    def _read_journal(self) -> dict[str, Any] | None:
        """The journal of a switch in flight; {} when one is there but unreadable (torn), None when none is."""
        if not self.journal_path.is_file():
            return None
        try:
            j = json.loads(self.journal_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return {}
        return j if isinstance(j, dict) else {}

    def _write_journal(self, journal: dict[str, Any]) -> None:
        atomic_write(self.journal_path, json.dumps(journal, default=str))

    def in_flight(self) -> bool:
        """Whether a promote or rollback left its journal (in flight now, or killed)."""
        return self._read_journal() is not None

    def mark_committed(self, finish: dict[str, Any]) -> None:
        """The switch is done (champion file written, apply command run): from here on a crash completes it
        (`finish`: the audit entry, with its `uid`, and the pending candidate to clear) instead of undoing it."""
        self._write_journal({**(self._read_journal() or {}), "phase": "committed", "finish": finish})

    def complete(self, finish: dict[str, Any]) -> None:
        """Do what a committed switch still owes (each step once, whenever it is repeated) and end the journal."""
        entry = finish.get("audit")
        if isinstance(entry, dict) and not any(e.get("uid") == entry.get("uid") for e in self.audit_log()):
            self.audit(entry)
        kill_point("audited")
        clear = finish.get("clear_pending")
        if isinstance(clear, list) and len(clear) == 2:
            pending = self.pending()
            if pending is not None and [pending.get("study"), pending.get("trial")] == clear:
                self.clear_pending()
        self.commit()

    def aliases(self) -> dict[str, str | None]:
        """The MLflow aliases the champion in force implies: this store's alias -> the champion's registered
        version, its previous alias -> the version of the record before it (None: no alias). Empty when there
        is no champion."""
        cur = self.champion()
        if cur is None:
            return {}
        prev = self.record(cur.previous_seq) if cur.previous_seq is not None else None
        return {self.alias: cur.model_version, self.previous_alias: prev.model_version if prev else None}

    def write_champion(self, rec: ChampionRecord) -> None:
        text = rec.to_yaml()
        atomic_write(self.history_dir / f"{rec.seq:06d}.yaml", text)
        atomic_write(self.champion_path, text)

    def set_current(self, rec: ChampionRecord) -> None:
        """Put an existing record (a rollback's) in force, without a new history entry."""
        atomic_write(self.champion_path, rec.to_yaml())

    def restore(self, old: str | None) -> None:
        """Put the champion file back to `old` (None: no champion)."""
        if old is None:
            with contextlib.suppress(FileNotFoundError):
                self.champion_path.unlink()
        else:
            atomic_write(self.champion_path, old)

    def commit(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.journal_path.unlink()

    def recover(self) -> bool:
        """A promote or rollback killed half-way left its journal: before its commit point the champion it
        replaced is restored; after it, what the switch still owed is done (the audit entry, the pending
        candidate). Returns whether there was a journal."""
        j = self._read_journal()
        if j is None:
            return False
        finish = j.get("finish")
        if j.get("phase") == "committed" and isinstance(finish, dict):
            log.warning("an interrupted %s of %s (pid %s on %s) had switched the champion: completed it",
                        j.get("action"), self.agent, j.get("pid"), j.get("host"))
            self.complete(finish)
            return True
        if j:
            self.restore(j.get("old"))
            log.warning("an interrupted %s of %s (pid %s on %s) was rolled back to the former champion; "
                        "its apply command may have run partly", j.get("action"), self.agent, j.get("pid"),
                        j.get("host"))
            self.audit({"action": "recovered", "reason": f"interrupted {j.get('action')} rolled back",
                        "interrupted_pid": j.get("pid"), "interrupted_host": j.get("host"),
                        "new_seq": j.get("new_seq")})
        self.commit()
        return True

    # ------------------------------------------------------------ pending
    def pending(self) -> dict[str, Any] | None:
        if not self.pending_path.is_file():
            return None
        data = yaml.safe_load(self.pending_path.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else None

    def set_pending(self, data: dict[str, Any]) -> None:
        atomic_write(self.pending_path, yaml.safe_dump(data, sort_keys=False))

    def clear_pending(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.pending_path.unlink()

    # ------------------------------------------------------------ logs
    def audit(self, entry: dict[str, Any]) -> None:
        append_jsonl(self.audit_path, {"time": time.time(), "user": current_user(), "agent": self.agent, **entry})

    def audit_log(self) -> list[dict[str, Any]]:
        return read_jsonl(self.audit_path)

    def add_verification(self, entry: dict[str, Any]) -> None:
        append_jsonl(self.verifications_path, {"time": time.time(), "agent": self.agent, **entry})

    def verifications(self) -> list[dict[str, Any]]:
        return read_jsonl(self.verifications_path)

    def judged(self, study: str) -> set[int]:
        """Trials of `study` already verified (whatever the verdict)."""
        return {int(v["trial"]) for v in self.verifications()
                if v.get("study") == study and v.get("trial") is not None}
