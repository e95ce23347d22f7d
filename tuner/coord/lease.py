"""Trial leases: a running trial's owner beats its heartbeat; a trial whose beat is older than the lease is lost.

The beat is Optuna's own trial heartbeat (RDBStorage.record_heartbeat, stamped with the database's clock, so
hosts with skewed clocks agree); expiry is Optuna's grace period. One daemon thread per storage beats every
trial its process has in flight, every `heartbeat_s`. A beat that fails (the database restarting) is retried
at the next interval; the lease (several beats long) rides it out.

    beat = Heartbeat(storage, heartbeat_s=5)
    beat.add(trial_id)      # beats at once, then every 5 s
    ...
    beat.remove(trial_id)   # told: no more beats
"""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger(__name__)


class Heartbeat:
    """Beats the heartbeat of every trial added, from one daemon thread, until it is removed."""

    def __init__(self, storage: Any, heartbeat_s: float) -> None:
        self.storage = storage
        self.heartbeat_s = heartbeat_s
        self._trials: set[int] = set()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._failing = False

    def add(self, trial_id: int) -> None:
        if not hasattr(self.storage, "record_heartbeat"):  # an in-process store: nobody else to tell
            return
        self._beat(trial_id)
        with self._cond:
            self._trials.add(trial_id)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="trial-heartbeat", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def remove(self, trial_id: int) -> None:
        with self._cond:
            self._trials.discard(trial_id)

    @property
    def trials(self) -> frozenset[int]:
        with self._cond:
            return frozenset(self._trials)

    def _beat(self, trial_id: int) -> None:
        try:
            self.storage.record_heartbeat(trial_id)
        except Exception as exc:  # noqa: BLE001 - the database may be restarting: next interval
            if not self._failing:
                log.warning("heartbeat of trial id %d failed (%s); retrying every %.0f s", trial_id,
                            type(exc).__name__, self.heartbeat_s)
            self._failing = True
            return
        if self._failing:
            log.info("heartbeats recorded again")
        self._failing = False

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait(timeout=self.heartbeat_s)
                trials = sorted(self._trials)
            for trial_id in trials:
                if trial_id in self.trials:  # told meanwhile: a beat now would be harmless but useless
                    self._beat(trial_id)
