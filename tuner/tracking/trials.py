"""One trial's record: the Optuna tell and the trial's MLflow run, written by one object the loop calls once.

The loop hands a TrialRecorder what the trial produced (a TrialRecord) and the study's tell; the recorder
marks the trial as being written (a reconcile meanwhile must not write it too), tells Optuna first (the
source of truth), writes the nested MLflow run (tags, parameters, the key metrics first, config.yaml,
requests.csv, the latency plot, the server log) and, when the store answers again after an outage, has what
MLflow missed written (`on_recovered`).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from tuner.base.redact import redact_text
from tuner.tracking.review import log_latency_plot, trial_metrics, trial_run_name
from tuner.tracking.tracker import records_csv, redact

if TYPE_CHECKING:
    from tuner.measure.measurement import Measurement
    from tuner.spec import AgentSpec
    from tuner.study.objectives import Evaluation
    from tuner.tracking.tracker import Tracker

log = logging.getLogger(__name__)


@dataclass
class TrialRecord:
    """What one trial produced, as its MLflow run records it."""

    number: int
    baseline: bool
    config: dict[str, Any]
    evaluation: Evaluation
    metrics: dict[str, float]
    measurement: Measurement | None
    cause: str | None = None
    error: str | None = None
    log_path: Any = None
    gpus: tuple[int, ...] = ()
    cycle: int | None = None
    parent_run_id: str | None = None
    pruned: dict[str, Any] | None = None  # stopped early (tuner.measure.early_stop): Optuna holds it PRUNED


@dataclass
class TrialRecorder:
    tracker: Tracker
    spec: AgentSpec
    study_name: str
    description: Mapping[str, str]
    on_recovered: Callable[[], None] | None = None

    def record(self, rec: TrialRecord, tell: Callable[[TrialRecord], None]) -> None:
        """Tell Optuna (`tell(rec)`, which may amend rec's cause), then write the trial's MLflow run."""
        self.tracker.tracking_trials.add(rec.number)  # a reconcile meanwhile must not write this trial too
        try:
            tell(rec)
            self._write_run(rec)
        finally:
            self.tracker.tracking_trials.discard(rec.number)
        if self.on_recovered is not None and self.tracker.recovered():  # MLflow answers again
            self.on_recovered()

    def _write_run(self, rec: TrialRecord) -> None:
        tr = self.tracker
        if not tr.enabled:
            return
        ev = rec.evaluation
        tags: dict[str, Any] = {
            "kind": "trial", "trial": rec.number, "baseline": rec.baseline,
            "state": "PRUNED" if rec.pruned is not None else "COMPLETE",
            "feasible": ev.feasible, "failure_cause": rec.cause or "", "agent": self.spec.name,
            "study": self.study_name, **{f"target.{k}": v for k, v in self.description.items()}}
        if rec.error:
            tags["error"] = redact_text(rec.error)[:1000]
        if rec.gpus:
            tags["gpus"] = ",".join(map(str, rec.gpus))
        if rec.pruned is not None:
            tags["pruned"] = str(rec.pruned.get("reason", ""))[:1000]
        if rec.cycle is not None:
            tags["cycle"] = rec.cycle
        if rec.cause is None and not ev.feasible:
            tags["slo_broken"] = ",".join(k.split(":", 1)[1] for k, v in ev.constraints.items()
                                          if k.startswith("slo:") and v > 0)
        tags["host"], tags["pid"] = socket.gethostname(), os.getpid()
        name = trial_run_name(rec.number, baseline=rec.baseline, ev=ev, cause=rec.cause, pruned=rec.pruned is not None)
        run_id = tr.start_run(name, parent_run_id=rec.parent_run_id, tags=tags, params=rec.config)
        key, rest = trial_metrics(self.spec, ev, rec.metrics, measured=rec.measurement is not None)
        if key:  # first, in a batch of their own: the few columns the runs table should show
            tr.log(run_id, metrics=key)
        if rest:
            tr.log(run_id, metrics=rest)
        tr.log_text(run_id, yaml.safe_dump({"trial": rec.number, "config": redact(rec.config)}, sort_keys=True),
                    "config.yaml")
        m = rec.measurement
        if m is not None and m.capacity_search is not None:
            import json

            tr.log_text(run_id, json.dumps(m.capacity_search, indent=1, default=str), "capacity_search.json")
        if rec.pruned is not None:
            import json

            tr.log_text(run_id, json.dumps(rec.pruned, indent=1), "pruned.json")
        if m is not None and m.records:
            tr.log_text(run_id, records_csv(m.records), "requests.csv")
            log_latency_plot(tr, run_id, m.records, name)
        if rec.log_path is not None:
            tr.log_file(run_id, Path(rec.log_path))
        tr.end_run(run_id, "FINISHED" if rec.cause is None else "FAILED")
