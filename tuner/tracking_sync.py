"""MLflow made eventually complete from the Optuna study, which stays the source of truth.

`reconcile` runs at every start (open_session), at the end of a cycle that missed MLflow writes, and when
the store answers again after a failure. It
1. ends the runs a killed process left RUNNING (its owner, recorded in tag tuner.owner, is gone from this
   host): a cycle run KILLED and tagged interrupted; a trial run with what Optuna has of the trial, then
   FINISHED/FAILED when Optuna finished the trial, KILLED when the trial was cut short;
2. writes every cycle and trial Optuna has and MLflow lacks (tagged tuner.backfilled=true), trial runs
   under their cycle's run.
Idempotent: runs are matched by their tags (study, cycle, trial number); a second pass writes nothing.
One process at a time per state dir (an flock); another one reconciling means this one skips.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import math
import os
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from tuner.objectives import FAILURE_CONSTRAINT
from tuner.proc import pid_alive, process_start_ticks
from tuner.tracking import BACKFILLED_TAG, OWNER_TAG, Tracker

log = logging.getLogger(__name__)


@dataclass
class SyncReport:
    ended_killed: list[str] = field(default_factory=list)  # run ids of a dead process ended KILLED
    completed: list[str] = field(default_factory=list)  # stranded trial runs completed from Optuna
    backfilled_cycles: list[int] = field(default_factory=list)
    backfilled_trials: list[int] = field(default_factory=list)
    skipped: str | None = None  # why nothing was done

    @property
    def changed(self) -> int:
        return len(self.ended_killed) + len(self.completed) + len(self.backfilled_cycles) + len(self.backfilled_trials)


def owner_alive(owner: str | None) -> bool | None:
    """Whether the process a tuner.owner tag names is alive; None when it ran on another host (or the
    tag is missing or unreadable): that is not this process's to decide."""
    if not owner:
        return None
    parts = owner.rsplit(":", 2)
    if len(parts) != 3 or parts[0] != socket.gethostname():
        return None
    try:
        pid = int(parts[1])
    except ValueError:
        return None
    start = parts[2]
    return pid_alive(pid) and str(process_start_ticks(pid)) == start


OTHER_HOST_GRACE_S = 600.0  # a trial another host's process finished is its own to write for this long


def _writer_may_live(t: FrozenTrial) -> bool:
    """Whether another live process (the one that asked the trial: a worker next to this one, another
    host's) may still be writing the trial's run: then it is not this process's to backfill."""
    from tuner.study import OWNER_ATTR

    owner = t.system_attrs.get(OWNER_ATTR)
    if not isinstance(owner, Mapping) or not isinstance(owner.get("pid"), int):
        return False
    if owner.get("host") != socket.gethostname():
        done = t.datetime_complete
        return done is None or (datetime.now() - done).total_seconds() < OTHER_HOST_GRACE_S
    pid = owner["pid"]
    if pid == os.getpid():
        return False  # this process: tracking_trials says which it is writing
    return pid_alive(pid) and process_start_ticks(pid) == owner.get("start_ticks")


@contextlib.contextmanager
def _sync_lock(state_dir: Path | None) -> Iterator[bool]:
    if state_dir is None:
        yield True
        return
    try:
        from tuner.files import private_file

        f = open(private_file(Path(state_dir) / "mlflow-sync.lock"), "a")  # noqa: SIM115 - closed below
    except OSError:
        yield True
        return
    with f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _q(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _finite(mapping: Mapping[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in mapping.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v))}


def trial_payload(t: FrozenTrial, objectives: list[str]) -> tuple[dict[str, Any], dict[str, float], str]:
    """Params, metrics and the MLflow status of a finished Optuna trial, as the loop logs them."""
    ua = t.user_attrs
    metrics = _finite(ua.get("metrics") or {})
    if not metrics:  # measured nothing: no placeholder objective values or violations (tags say why)
        return dict(ua.get("config") or t.params), {}, _status(t)
    if t.values is not None:
        for i, (name, v) in enumerate(zip(objectives, t.values, strict=False)):
            metrics[f"objective_{i}_{name}"] = v
    constraints = getattr(t, "constraints", None) or t.system_attrs.get("constraints") or {}
    if isinstance(constraints, Mapping):
        metrics.update(_finite({f"violation_{str(k).replace(':', '_').replace('.', '_')}": v
                                for k, v in constraints.items()}))
    metrics = {k: v for k, v in _finite(metrics).items() if FAILURE_CONSTRAINT not in k}
    return dict(ua.get("config") or t.params), metrics, _status(t)


def _status(t: FrozenTrial) -> str:
    cause = t.user_attrs.get("cause")
    if t.state == TrialState.COMPLETE and not cause:
        return "FINISHED"
    if cause == "interrupted" or t.state == TrialState.FAIL and "interrupt" in str(t.user_attrs.get("error", "")):
        return "KILLED"
    return "FAILED"


def reconcile(tracker: Tracker, study: Any, *, agent: str, objectives: list[str], state_dir: Path | None = None,
              description: Mapping[str, Any] | None = None) -> SyncReport:
    """Make MLflow hold what the Optuna study holds (see the module's docstring). Never raises."""
    report = SyncReport()
    if not tracker.enabled:
        report.skipped = "tracking disabled"
        return report
    if tracker.down:
        report.skipped = "MLflow is down"
        return report
    with _sync_lock(state_dir) as mine:
        if not mine:
            report.skipped = "another process is reconciling"
            return report
        try:
            _reconcile(tracker, study, agent, objectives, description or {}, report)
        except Exception as exc:  # noqa: BLE001 - tracking must never break the loop
            log.warning("MLflow reconcile stopped: %s", exc)
            report.skipped = f"error: {exc}"
        if report.changed:
            log.warning("MLflow made complete from the Optuna study: %d run(s) of a killed process ended, %d "
                        "completed, %d cycle run(s) and %d trial run(s) backfilled", len(report.ended_killed),
                        len(report.completed), len(report.backfilled_cycles), len(report.backfilled_trials))
        tracker.failures = 0
    return report


def _reconcile(tracker: Tracker, study: Any, agent: str, objectives: list[str], description: Mapping[str, Any],
               report: SyncReport) -> None:
    name = study.study_name
    runs = tracker._retry("read runs", lambda: tracker.runs(f"tags.study = '{_q(name)}'"))
    if runs is None:
        report.skipped = "MLflow did not answer"
        return
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    cycle_runs: dict[int, Any] = {}
    trial_runs: dict[int, Any] = {}
    for r in runs:
        tags = r.data.tags
        try:
            if tags.get("kind") == "cycle":
                cycle_runs.setdefault(int(tags.get("cycle", 0)), r)
            elif tags.get("kind") == "trial":
                trial_runs.setdefault(int(tags.get("trial", -1)), r)
        except ValueError:
            continue
    # 1. runs a dead process left RUNNING
    for r in runs:
        if r.info.status != "RUNNING" or r.info.run_id in tracker.active:
            continue
        if owner_alive(r.data.tags.get(OWNER_TAG)) is not False:
            continue  # alive, or not this host's to judge
        kind = r.data.tags.get("kind")
        run_id = r.info.run_id
        t = trials.get(int(r.data.tags.get("trial", -1))) if kind == "trial" else None
        if t is not None and t.state in (TrialState.COMPLETE, TrialState.FAIL):
            params, metrics, status = trial_payload(t, objectives)
            tracker.log(run_id, params=params, metrics=metrics, tags={BACKFILLED_TAG: "true", "state": t.state.name})
            tracker.end_run(run_id, status)
            (report.ended_killed if status == "KILLED" else report.completed).append(run_id)
        else:
            tracker.log(run_id, tags={"interrupted": True, "ended_by": "next start (owner killed)"})
            tracker.end_run(run_id, "KILLED")
            report.ended_killed.append(run_id)
        if tracker.down:
            return
    # 2. cycles Optuna knows of (its trials carry their cycle number) that MLflow lacks
    by_cycle: dict[int, list[FrozenTrial]] = {}
    for t in trials.values():
        c = t.user_attrs.get("cycle")
        if isinstance(c, int):
            by_cycle.setdefault(c, []).append(t)
    for c in sorted(by_cycle):
        if c in cycle_runs:
            continue
        rec = study.user_attrs.get(f"cycle:{c}")
        interrupted = not isinstance(rec, Mapping) or bool(rec.get("interrupted"))
        run_id = tracker.start_run(f"cycle-{c}", tags={
            "kind": "cycle", "cycle": c, "agent": agent, "study": name, BACKFILLED_TAG: "true",
            "interrupted": interrupted, **{f"target.{k}": v for k, v in description.items()}})
        if run_id is None:
            return
        done = [t for t in by_cycle[c] if t.state in (TrialState.COMPLETE, TrialState.FAIL)]
        tracker.log(run_id, metrics={"trials_run": len(done),
                                     "trials_feasible": sum(bool(t.user_attrs.get("feasible")) for t in done),
                                     "trials_failed": sum(bool(t.user_attrs.get("cause")) for t in done)})
        tracker.end_run(run_id, "KILLED" if interrupted else "FINISHED")
        cycle_runs[c] = run_id
        report.backfilled_cycles.append(c)
    # 3. finished trials MLflow lacks
    for number in sorted(trials):
        t = trials[number]
        if number in trial_runs or number in tracker.tracking_trials or \
                t.state not in (TrialState.COMPLETE, TrialState.FAIL) or _writer_may_live(t):
            continue
        params, metrics, status = trial_payload(t, objectives)
        c = t.user_attrs.get("cycle")
        parent = cycle_runs.get(c) if isinstance(c, int) else None
        parent_id = parent if isinstance(parent, str) or parent is None else parent.info.run_id
        tags = {"kind": "trial", "trial": number, "study": name, "agent": agent, BACKFILLED_TAG: "true",
                "baseline": bool(t.user_attrs.get("baseline")), "state": t.state.name,
                "feasible": bool(t.user_attrs.get("feasible")), "failure_cause": t.user_attrs.get("cause") or ""}
        if isinstance(c, int):
            tags["cycle"] = c
        if t.user_attrs.get("error"):
            tags["error"] = str(t.user_attrs["error"])[:1000]
        run_id = tracker.start_run(f"trial-{number}", parent_run_id=parent_id, tags=tags, params=params)
        if run_id is None:
            return
        tracker.log(run_id, metrics=metrics)
        tracker.end_run(run_id, status)
        report.backfilled_trials.append(number)
