"""The rollout journal: `<state-dir>/<agent>/rollout.journal`, written (atomically) before every step that
changes the load balancer, removed when the rollout has ended and the balancer is as it was.

It holds where the balancer is, the canary's server name, the stable servers' weights before the rollout and
the phase (starting, canary added, stage N, promoting, promoted). A rollout runs under the agent's promote
lock (tuner.champions.store.ChampionStore.lock, an flock released when its process dies), so a journal found by
whoever holds that lock belongs to a rollout whose owner is gone: `recover` reverts it (canary weight 0 and
its server removed, the stable weights restored, the canary's server process reaped) and audits that. A
promotion the dead owner had begun is settled by the champion store's own promote journal. Meanwhile the
balancer's health check has already taken the dead canary out of service: the canary's process dies with its
owner (tuner.targets.guard), so no traffic goes to it while nobody owns the rollout.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from tuner.base.files import atomic_write
from tuner.champions.store import ChampionStore
from tuner.rollout.lb import HAProxy, LoadBalancer, LoadBalancerError

log = logging.getLogger(__name__)


def journal_path(store: ChampionStore) -> Path:
    return store.dir / "rollout.journal"


def write(store: ChampionStore, entry: dict[str, Any]) -> None:
    atomic_write(journal_path(store), json.dumps({**entry, "pid": os.getpid(), "at": time.time()},
                                                 sort_keys=True, default=str))


def read(store: ChampionStore) -> dict[str, Any] | None:
    p = journal_path(store)
    if not p.is_file():
        return None
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        log.warning("%s is unreadable: treating it as an interrupted rollout of unknown state", p)
        return {"phase": "unknown"}
    return data if isinstance(data, dict) else {"phase": "unknown"}


def clear(store: ChampionStore) -> None:
    with contextlib.suppress(FileNotFoundError):
        journal_path(store).unlink()


def balancer_of(entry: dict[str, Any]) -> LoadBalancer | None:
    lb = entry.get("lb") or {}
    if lb.get("kind") == "haproxy" and lb.get("socket") and lb.get("backend"):
        return HAProxy(lb["socket"], lb["backend"])
    return None


def restore(lb: LoadBalancer, canary: str | None, stable_weights: dict[str, int]) -> None:
    """The balancer as before the rollout: the canary without traffic and gone, the stable weights back."""
    servers = lb.servers()
    if canary and canary in servers:
        lb.set_weight(canary, 0)  # first: no new request reaches the canary
    for name, w in stable_weights.items():
        if name in servers and servers[name].weight != w:
            lb.set_weight(name, int(w))
    if canary:
        lb.remove_server(canary)


def recover(store: ChampionStore, state_dir: Path, lb: LoadBalancer | None = None) -> dict[str, Any] | None:
    """Revert (or finish) the rollout a dead owner left. Call with the agent's promote lock held. Returns the
    audit entry written, or None when there was nothing to recover."""
    entry = read(store)
    if entry is None:
        return None
    from tuner.targets.process import reap_orphans

    reaped = reap_orphans(state_dir)  # the canary's server group, if its guard has not ended it yet
    lb = balancer_of(entry) or lb
    phase = str(entry.get("phase", "unknown"))
    finished = phase in ("promoting", "promoted")
    audit: dict[str, Any] = {"action": "rollout_recovered", "rollout": entry.get("id"), "phase": phase,
                             "stage": entry.get("stage"), "trial": entry.get("trial"), "study": entry.get("study"),
                             "interrupted_pid": entry.get("pid"), "reaped_groups": reaped,
                             "outcome": "settled" if finished else "reverted"}
    if lb is None:
        audit["reason"] = "no load balancer recorded: nothing to restore"
    else:
        try:
            restore(lb, entry.get("canary"), {k: int(v) for k, v in (entry.get("stable_weights") or {}).items()})
        except LoadBalancerError as exc:
            audit.update(action="rollout_recovery_failed", reason=str(exc))
            store.audit(audit)
            log.error("cannot restore the load balancer of an interrupted rollout of %s: %s (the journal stays; "
                      "the next start tries again)", store.agent, exc)
            raise
        champ = store.champion()
        done = ("promotion settled by the champion store's journal, canary removed" if finished
                else "reverted, canary removed, stable weights restored")
        audit["reason"] = (f"interrupted rollout ({phase}, pid {entry.get('pid')}): {done}"
                           + (f"; champion #{champ.seq}" if champ else "; no champion"))
        audit["champion_seq"] = champ.seq if champ else None
    store.audit(audit)
    log.warning("%s: %s", store.agent, audit["reason"])
    clear(store)
    return audit
