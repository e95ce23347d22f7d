"""What the champion store and the audit log say: the champion, a pending candidate, the history."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.champions.store import ChampionStore

if TYPE_CHECKING:
    from tuner.tracking.tracker import Tracker

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- summaries (tuner status, history)
def champion_summary(state_dir: Path | str, agent_name: str, store: ChampionStore | None = None
                     ) -> dict[str, Any] | None:
    rec = (store or ChampionStore(Path(state_dir), agent_name)).champion()
    if rec is None:
        return None
    return {"seq": rec.seq, "trial": rec.trial, "study": rec.study, "config": rec.config, "values": rec.values,
            "promoted_at": rec.promoted_at, "age_s": max(0.0, time.time() - rec.promoted_at), "user": rec.user,
            "verified": rec.verified, "evidence": rec.evidence, "model_version": rec.model_version,
            "previous_seq": rec.previous_seq, "restored_from": rec.restored_from}


def pending_summary(state_dir: Path | str, agent_name: str, store: ChampionStore | None = None
                    ) -> dict[str, Any] | None:
    return (store or ChampionStore(Path(state_dir), agent_name)).pending()


def history(state_dir: Path | str, agent_name: str, tracker: Tracker | None = None,
            store: ChampionStore | None = None) -> dict[str, list[Any]]:
    """Cycles (MLflow cycle runs, else the daemon's journal), verifications and promotions of an agent."""
    store = store or ChampionStore(Path(state_dir), agent_name)
    cycles: list[dict[str, Any]] = []
    if tracker is not None and tracker.enabled:
        try:
            runs = tracker.runs("tags.kind = 'cycle'")
        except Exception as exc:  # noqa: BLE001 - history still lists what the files hold
            log.warning("cannot read cycle runs from MLflow: %s", exc)
            runs = []
        for r in runs:
            m, tg = r.data.metrics, r.data.tags
            if tg.get("agent") not in (None, agent_name):
                continue
            cycles.append({"cycle": int(tg.get("cycle", 0) or 0), "run_id": r.info.run_id,
                           "status": r.info.status, "study": tg.get("study"),
                           "start_time": r.info.start_time / 1000, "trials_run": int(m.get("trials_run", 0)),
                           "trials_feasible": int(m.get("trials_feasible", 0)),
                           "best_value": m.get("best_value_0"), "interrupted": tg.get("interrupted") == "True",
                           # which traffic it tuned for (the daemon's cycles: tuner.daemon.cycle.record_tuned_for)
                           "scenario": tg.get("scenario") or None, "workload_source": tg.get("workload_source"),
                           "observed": {"source": tg.get("observed_source"),
                                        "stats": {k[9:]: float(v) for k, v in tg.items()
                                                  if k.startswith("observed.")}}
                           if tg.get("observed_source") else None})
    if not cycles:
        from tuner.champions.store import read_jsonl

        cycles = [c for c in read_jsonl(store.dir / "cycles.jsonl")]
    cycles.sort(key=lambda c: (c.get("start_time") or 0, c.get("cycle") or 0))
    promotions = [e for e in store.audit_log() if str(e.get("action", "")).startswith(("promote", "rollback",
                                                                                     "recovered", "rollout"))]
    return {"cycles": cycles, "verifications": store.verifications(), "promotions": promotions}
