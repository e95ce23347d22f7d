"""The answer to a performance anomaly: re-verify the champion against the baseline on the testbed (the
agent's target: tuner.promotion.verify, interleaved A/B runs and the paired test) and roll the champion back
(tuner.promotion.act.rollback) if it is no longer shown better than the baseline: the champion itself
regressed. A champion that still wins points at the environment (a throttled GPU, a noisy neighbour): an
alert, no change."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from tuner.champions.db import champion_store
from tuner.errors import PromotionError
from tuner.promotion.act import rollback
from tuner.promotion.verify import verify

if TYPE_CHECKING:
    from tuner.context import Session

log = logging.getLogger(__name__)


def reverify_champion(session: Session, *, reason: str, stop_event: threading.Event | None = None,
                      seed: int | None = None) -> dict[str, Any]:
    """Re-verify the champion against the baseline; roll back when it lost. The outcome: `action` (alert,
    rolled_back), `reason`, and the verdict's summary."""
    spec = session.agent.spec
    store = champion_store(session)
    champ = store.champion()
    if champ is None:
        return {"action": "alert", "reason": "no champion: the baseline serves, nothing to re-verify"}
    v = verify(session, champ.config, candidate_trial=champ.trial, store=store, stop_event=stop_event, seed=seed,
               against_baseline=True)
    out: dict[str, Any] = {"verdict": v.summary(), "champion_seq": champ.seq}
    if v.interrupted:
        return {**out, "action": "alert", "reason": "the re-verification was interrupted"}
    if v.passed:
        return {**out, "action": "alert", "reason": f"champion #{champ.seq} still beats the baseline "
                f"({v.reason}): the environment changed, not the champion"}
    try:
        res = rollback(store, session.tracker, apply_command=spec.promotion.apply_command,
                       cwd=session.agent.path.parent, reason=f"monitor: {reason}; re-verification: {v.reason}")
    except PromotionError as exc:
        return {**out, "action": "alert", "reason": f"champion #{champ.seq} regressed ({v.reason}) but cannot "
                f"be rolled back: {exc}"}
    log.warning("monitor: champion #%s regressed (%s): rolled back to #%s", champ.seq, v.reason, res.record.seq)
    return {**out, "action": "rolled_back", "reason": v.reason, "restored_seq": res.record.seq}
