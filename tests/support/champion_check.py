"""Whether an agent's champion stores agree after a crash: champion.yaml, the audit log, `tuner history` and MLflow's
aliases (used by tests/integration/promote/test_switch_crash.py and the fault campaign's switch part)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuner.champions.store import ChampionStore
from tuner.tracking.tracker import Tracker, default_tracking_uri


def aliases(state_dir: Path, agent: str) -> tuple[str | None, str | None]:
    """MLflow's `champion` and `previous` aliases of the agent's registered model (the local SQLite store)."""
    tr = Tracker(default_tracking_uri(state_dir), agent)
    return tr.alias_version(agent, "champion"), tr.alias_version(agent, "previous")


def disagreements(state_dir: Path, agent: str, *, history: list[dict[str, Any]] | None = None,
                  check_aliases: bool = True) -> list[str]:
    """What does not agree (empty: all of it does): a journal left behind, the audit log's last promote or rollback
    not naming the champion in force, an audit entry written twice, `tuner history`'s promotions (when given) not
    the audit log's, MLflow's aliases not naming the champion's version and the one before it."""
    store = ChampionStore(state_dir, agent)
    out: list[str] = []
    if store.journal_path.exists():
        out.append("the journal is still there")
    champ = store.champion()
    if champ is None:
        return [*out, "no champion"]
    log = store.audit_log()
    switches = [e for e in log if e.get("action") in ("promote", "rollback")]
    if not switches or switches[-1].get("seq") != champ.seq:
        out.append(f"the audit log's last switch names #{switches[-1].get('seq') if switches else None}, "
                   f"champion.yaml holds #{champ.seq}")
    uids = [e["uid"] for e in switches if "uid" in e]
    if len(uids) != len(set(uids)):
        out.append("an audit entry was written twice")
    if history is not None and history != log:
        out.append("tuner history's promotions are not the audit log")
    if check_aliases:
        prev = store.record(champ.previous_seq) if champ.previous_seq is not None else None
        want = (champ.model_version, prev.model_version if prev else None)
        got = aliases(state_dir, agent)
        if got != want:
            out.append(f"MLflow's aliases are {got}, the champion in force implies {want}")
    return out
