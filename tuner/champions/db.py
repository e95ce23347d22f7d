"""The champion store of a fleet: the champion, its history, the pending candidate, the audit and verification
logs live in the shared study's database (Optuna study user attributes), so `tuner promote`, `tuner status`
and the daemon on any host see and change the same champion.

    champion               the record in force (the truth; champion.yaml is this host's copy of it)
    champion:<seq>         every champion record ever promoted (rollback walks `previous_seq`)
    champion_pending       a verified candidate waiting for an operator, or null
    champion_journal       set only while a promote or rollback is in flight (crash recovery), else null
    audit:<time>:<id>      one entry per promote / rollback / failure (time, user, host, trial, evidence)
    verification:<time>:<id>  one entry per verification

Promotes and rollbacks are serialised across hosts by the database's lock (tuner.coord.dblock). The local files
(champion.yaml, champions/<seq>.yaml) are still written on the host that promotes, for its apply hook.
Chosen by `champion_store(session)` when the study is not in a local SQLite file.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from tuner.champions.store import ChampionRecord, ChampionStore, current_user
from tuner.coord.dblock import LockTimeout
from tuner.errors import PromotionError

log = logging.getLogger(__name__)


class DbChampionStore(ChampionStore):
    """ChampionStore whose truth is the shared study's database (see the module docstring)."""

    def __init__(self, state_dir: Path, agent: str, study: Any, scenario: str | None = None) -> None:
        super().__init__(state_dir, agent, scenario)
        self.tuner_study = study

    # ------------------------------------------------------------ attributes
    def _attrs(self) -> dict[str, Any]:
        return dict(self.tuner_study.study.user_attrs)

    def _get(self, key: str) -> Any:
        return self._attrs().get(key)

    def _set(self, key: str, value: Any) -> None:
        self.tuner_study.study.set_user_attr(key, value)

    @staticmethod
    def _entry_key(kind: str) -> str:
        return f"{kind}:{time.time():017.6f}:{uuid.uuid4().hex[:8]}"

    # ------------------------------------------------------------ lock
    @contextlib.contextmanager
    def lock(self, timeout_s: float | None = None) -> Iterator[None]:
        """Serialise promotes and rollbacks of this agent across every host of the fleet."""
        try:
            with self.tuner_study.lock(f"promote:{self.agent}", timeout_s=timeout_s or 24 * 3600.0):
                self.recover()
                yield
        except LockTimeout:
            raise PromotionError(f"another promote or rollback of {self.agent!r} holds the fleet's lock") from None

    # ------------------------------------------------------------ champion
    def champion(self) -> ChampionRecord | None:
        data = self._get("champion")
        return ChampionRecord.from_dict(data) if isinstance(data, dict) else None

    def record(self, seq: int) -> ChampionRecord | None:
        data = self._get(f"champion:{seq:06d}")
        return ChampionRecord.from_dict(data) if isinstance(data, dict) else None

    def next_seq(self) -> int:
        seqs = [int(k.split(":")[1]) for k in self._attrs() if k.startswith("champion:") and k[9:].isdigit()]
        return max(seqs, default=0) + 1

    def champion_text(self) -> str | None:
        cur = self._get("champion")
        return yaml.safe_dump(cur, sort_keys=False) if isinstance(cur, dict) else None

    def _read_journal(self) -> dict[str, Any] | None:
        j = self._get("champion_journal")
        return j if isinstance(j, dict) else None

    def _write_journal(self, journal: dict[str, Any]) -> None:
        self._set("champion_journal", _plain(journal))

    def write_champion(self, rec: ChampionRecord) -> None:
        data = asdict(rec)
        self._set(f"champion:{rec.seq:06d}", data)
        self._set("champion", data)
        super().write_champion(rec)  # this host's copy, for its apply hook

    def set_current(self, rec: ChampionRecord) -> None:
        self._set("champion", asdict(rec))
        super().set_current(rec)

    def restore(self, old: str | None) -> None:
        self._set("champion", yaml.safe_load(old) if old else None)
        super().restore(old)

    def commit(self) -> None:
        self._set("champion_journal", None)
        super().commit()

    # ------------------------------------------------------------ pending
    def pending(self) -> dict[str, Any] | None:
        data = self._get("champion_pending")
        return data if isinstance(data, dict) else None

    def set_pending(self, data: dict[str, Any]) -> None:
        self._set("champion_pending", _plain(data))

    def clear_pending(self) -> None:
        self._set("champion_pending", None)

    # ------------------------------------------------------------ logs
    def audit(self, entry: dict[str, Any]) -> None:
        self._set(self._entry_key("audit"), _plain({"time": time.time(), "user": current_user(),
                                                    "host": socket.gethostname(), "agent": self.agent, **entry}))

    def audit_log(self) -> list[dict[str, Any]]:
        return [v for k, v in sorted(self._attrs().items()) if k.startswith("audit:")]

    def add_verification(self, entry: dict[str, Any]) -> None:
        self._set(self._entry_key("verification"), _plain({"time": time.time(), "agent": self.agent, **entry}))

    def verifications(self) -> list[dict[str, Any]]:
        return [v for k, v in sorted(self._attrs().items()) if k.startswith("verification:")]


def _plain(value: Any) -> Any:
    """JSON-able (Optuna stores attributes as JSON): tuples to lists, unknown objects to strings."""
    import json

    return json.loads(json.dumps(value, default=str))


def champion_store(session: Any) -> ChampionStore:
    """The champion store of a session: in the shared database, or files when the study is a local SQLite file."""
    scenario = getattr(session, "scenario", None)  # a scenario's session keeps that scenario's champion
    if session.study.storage_url.startswith("sqlite"):
        return ChampionStore(session.state_dir, session.agent.spec.name, scenario)
    return DbChampionStore(session.state_dir, session.agent.spec.name, session.study, scenario)


def champion_store_for(agent: Any, state_dir: Path, study: Any = None) -> ChampionStore:
    """The champion store of a loaded agent without a session (`tuner status`, `tuner rollback`)."""
    storage = agent.spec.storage
    if not storage or storage.startswith("sqlite"):
        return ChampionStore(state_dir, agent.name)
    if study is None:
        from tuner.study.study import TunerStudy

        study = TunerStudy(agent.spec, agent.space, storage_url=storage)
    return DbChampionStore(state_dir, agent.name, study)
