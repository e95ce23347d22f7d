"""MLflow made eventually complete from the Optuna study, which stays the source of truth.

`reconcile` runs at every start (open_session), at the end of a run, cycle, verification or worker that
missed MLflow writes (tuner.loop.finish_tracking, which first asks a store marked down once more), and when
the store answers again after a failure. It
1. ends the runs a killed process left RUNNING (its owner, recorded in tag tuner.owner, is gone from this
   host), and the runs this process could not end itself (the store was down then): a cycle run FINISHED
   when the study recorded the cycle's end, else KILLED and tagged interrupted; a trial run with what Optuna
   has of the trial, then FINISHED/FAILED when Optuna finished the trial, KILLED when the trial was cut
   short; a verification run with its verdict when the champion store recorded it, else KILLED;
2. writes every cycle and trial Optuna has and MLflow lacks, and every verification the champion store
   holds and MLflow lacks (all tagged tuner.backfilled=true), trial runs under their cycle's run,
   verification runs under their candidate's.
Idempotent: runs are matched by their tags (study, cycle, trial number, verification key); a second pass
writes nothing.
One process at a time per state dir (an flock); another one reconciling means this one skips.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import math
import os
import socket
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from tuner.base.proc import pid_alive, process_start_ticks
from tuner.study.objectives import FAILURE_CONSTRAINT
from tuner.tracking.tracker import BACKFILLED_TAG, OWNER_TAG, VERIFICATION_KEY_TAG, Tracker

log = logging.getLogger(__name__)


@dataclass
class SyncReport:
    ended_killed: list[str] = field(default_factory=list)  # run ids of a dead process ended KILLED
    completed: list[str] = field(default_factory=list)  # stranded trial runs completed from Optuna
    backfilled_cycles: list[int] = field(default_factory=list)
    backfilled_trials: list[int] = field(default_factory=list)
    backfilled_verifications: list[str] = field(default_factory=list)  # verification keys
    skipped: str | None = None  # why nothing was done

    @property
    def changed(self) -> int:
        return (len(self.ended_killed) + len(self.completed) + len(self.backfilled_cycles)
                + len(self.backfilled_trials) + len(self.backfilled_verifications))


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


FLEET_RUN_ATTR = "fleet_run"  # tuner.fleet.worker's study attribute: the fleet run of a budget (run_id, ended)
OTHER_HOST_GRACE_S = 600.0  # a trial another host's process finished is its own to write for this long


def _writer_may_live(t: FrozenTrial) -> bool:
    """Whether another live process (the one that asked the trial: a worker next to this one, another
    host's) may still be writing the trial's run: then it is not this process's to backfill."""
    from tuner.study.study import OWNER_ATTR

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
        from tuner.base.files import private_file

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


# the states of a trial whose MLflow run is written (a pruned one holds its partial measurement)
FINISHED_STATES = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)


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
    if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and not cause:
        return "FINISHED"  # a pruned trial's run holds its partial measurement (tag state: PRUNED)
    if cause == "interrupted" or t.state == TrialState.FAIL and "interrupt" in str(t.user_attrs.get("error", "")):
        return "KILLED"
    return "FAILED"


def verification_key(entry: Mapping[str, Any]) -> str:
    """The key that matches a stored verification to its MLflow run (tag tuner.verification); an entry of an
    older tuner, without one, is known by its time."""
    return str(entry.get("uid") or f"time:{entry.get('time')}")


def reconcile(tracker: Tracker, study: Any, *, agent: str, objectives: list[str], state_dir: Path | None = None,
              description: Mapping[str, Any] | None = None,
              verifications: Sequence[Mapping[str, Any]] = ()) -> SyncReport:
    """Make MLflow hold what the Optuna study (and the champion store's `verifications`) hold (see the
    module's docstring). Never raises."""
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
            _reconcile(tracker, study, agent, objectives, description or {}, verifications, report)
        except Exception as exc:  # noqa: BLE001 - tracking must never break the loop
            log.warning("MLflow reconcile stopped: %s", exc)
            report.skipped = f"error: {exc}"
        if report.changed:
            log.warning("MLflow made complete from the Optuna study: %d run(s) of a killed process ended, %d "
                        "completed, %d cycle run(s), %d trial run(s) and %d verification run(s) backfilled",
                        len(report.ended_killed), len(report.completed), len(report.backfilled_cycles),
                        len(report.backfilled_trials), len(report.backfilled_verifications))
        tracker.failures = 0
    return report


def _abandoned(tracker: Tracker, run: Any) -> bool:
    """Whether a RUNNING run will never be ended by its writer: its process is dead, or it is this process
    and the run is no longer one it is writing (its end was skipped while the store was down)."""
    if run.info.run_id in tracker.active:
        return False
    owner = run.data.tags.get(OWNER_TAG)
    if owner == tracker.owner:
        trial = run.data.tags.get("trial")
        return not (run.data.tags.get("kind") == "trial" and trial is not None and trial.isdigit()
                    and int(trial) in tracker.tracking_trials)
    return owner_alive(owner) is False


def _cycle_summary(trials: list[FrozenTrial]) -> dict[str, float]:
    done = [t for t in trials if t.state in FINISHED_STATES]
    return {"trials_run": len(done), "trials_feasible": sum(bool(t.user_attrs.get("feasible")) for t in done),
            "trials_failed": sum(bool(t.user_attrs.get("cause")) for t in done)}


def _verification_payload(v: Mapping[str, Any]) -> tuple[dict[str, float], dict[str, list[float]]]:
    """The metrics and per-arm series (steps: the pairs) of a stored verification."""
    metrics = _finite({k: v.get(k) for k in ("improvement", "improvement_low", "p_value")})
    runs = [r for r in v.get("runs") or [] if isinstance(r, Mapping)]
    if v.get("pairs") is not None:
        metrics.update(_finite({"pairs": v.get("pairs")}))
    series: dict[str, list[float]] = {}
    for r in runs:
        for k in ("value", "error_rate", "quality"):
            x = r.get(k)
            if isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(float(x)):
                series.setdefault(f"{r.get('arm')}_{k}", []).append(float(x))
    return metrics, series


def _reconcile(tracker: Tracker, study: Any, agent: str, objectives: list[str], description: Mapping[str, Any],
               verifications: Sequence[Mapping[str, Any]], report: SyncReport) -> None:
    name = study.study_name
    runs = tracker._retry("read runs", lambda: tracker.runs(f"tags.study = '{_q(name)}'"))
    if runs is None:
        report.skipped = "MLflow did not answer"
        return
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    by_cycle: dict[int, list[FrozenTrial]] = {}
    for t in trials.values():
        c = t.user_attrs.get("cycle")
        if isinstance(c, int):
            by_cycle.setdefault(c, []).append(t)
    stored = [v for v in verifications if v.get("study") == name]
    stored_by_key = {verification_key(v): v for v in stored}
    stored_by_run = {str(v["run_id"]): v for v in stored if v.get("run_id")}
    cycle_runs: dict[int, Any] = {}
    trial_runs: dict[int, Any] = {}
    have_ids = {r.info.run_id for r in runs}
    have_keys: set[str] = set()
    for r in runs:
        tags = r.data.tags
        try:
            if tags.get("kind") == "cycle":
                cycle_runs.setdefault(int(tags.get("cycle", 0)), r)
            elif tags.get("kind") == "trial":
                trial_runs.setdefault(int(tags.get("trial", -1)), r)
            elif tags.get("kind") == "verification" and tags.get(VERIFICATION_KEY_TAG):
                have_keys.add(tags[VERIFICATION_KEY_TAG])
        except ValueError:
            continue
    user_attrs = study.user_attrs
    # 1. runs a dead process left RUNNING, and runs this process could not end
    for r in runs:
        if r.info.status != "RUNNING" or not _abandoned(tracker, r):
            continue
        kind = r.data.tags.get("kind")
        run_id = r.info.run_id
        t = trials.get(int(r.data.tags.get("trial", -1))) if kind == "trial" else None
        rec = user_attrs.get(f"cycle:{r.data.tags.get('cycle')}") if kind == "cycle" else None
        v = stored_by_run.get(run_id) or stored_by_key.get(r.data.tags.get(VERIFICATION_KEY_TAG, "")) \
            if kind == "verification" else None
        if t is not None and t.state in FINISHED_STATES:
            params, metrics, status = trial_payload(t, objectives)
            tracker.log(run_id, params=params, metrics=metrics, tags={BACKFILLED_TAG: "true", "state": t.state.name})
            tracker.end_run(run_id, status)
            (report.ended_killed if status == "KILLED" else report.completed).append(run_id)
        elif isinstance(rec, Mapping) and not rec.get("interrupted"):  # the cycle ended; its end was not written
            c = int(r.data.tags.get("cycle", 0))
            tracker.log(run_id, metrics=_cycle_summary(by_cycle.get(c, [])),
                        tags={BACKFILLED_TAG: "true", "interrupted": False})
            tracker.end_run(run_id, "FINISHED")
            report.completed.append(run_id)
        elif kind == "fleet" and isinstance(fleet := user_attrs.get(FLEET_RUN_ATTR), Mapping) and \
                fleet.get("run_id") == run_id and fleet.get("ended"):  # the fleet's budget was spent
            tracker.log(run_id, tags={BACKFILLED_TAG: "true"})
            tracker.end_run(run_id, "FINISHED")
            report.completed.append(run_id)
        elif v is not None:  # the verification finished; its end was not written
            metrics, series = _verification_payload(v)
            tracker.log(run_id, metrics=metrics, tags={BACKFILLED_TAG: "true", "interrupted": False})
            tracker.log_steps(run_id, series)
            tracker.end_run(run_id, "FINISHED")
            report.completed.append(run_id)
        else:
            tracker.log(run_id, tags={"interrupted": True, "ended_by": "next start (owner killed)"})
            tracker.end_run(run_id, "KILLED")
            report.ended_killed.append(run_id)
        if tracker.down:
            return
    # 2. cycles Optuna knows of (its trials carry their cycle number) that MLflow lacks
    for c in sorted(by_cycle):
        if c in cycle_runs:
            continue
        rec = user_attrs.get(f"cycle:{c}")
        interrupted = not isinstance(rec, Mapping) or bool(rec.get("interrupted"))
        run_id = tracker.start_run(f"cycle-{c}", tags={
            "kind": "cycle", "cycle": c, "agent": agent, "study": name, BACKFILLED_TAG: "true",
            "interrupted": interrupted, **{f"target.{k}": v for k, v in description.items()}})
        if run_id is None:
            return
        tracker.log(run_id, metrics=_cycle_summary(by_cycle[c]))
        tracker.end_run(run_id, "KILLED" if interrupted else "FINISHED")
        cycle_runs[c] = run_id
        report.backfilled_cycles.append(c)

    def parent_of(t: FrozenTrial | None) -> str | None:
        if t is None:
            return None
        c = t.user_attrs.get("cycle")
        parent = cycle_runs.get(c) if isinstance(c, int) else None
        if parent is None:  # a fleet worker's trial: the fleet run it was told under
            fleet = t.user_attrs.get("cycle_run_id")
            if fleet is None and not isinstance(c, int):  # told while its worker had no fleet run (MLflow was
                # down when it joined), or a copy told at the ask: the fleet's run of the budget
                attr = user_attrs.get(FLEET_RUN_ATTR)
                fleet = attr.get("run_id") if isinstance(attr, Mapping) else None
            return fleet if isinstance(fleet, str) and fleet in have_ids else None
        return parent if isinstance(parent, str) else str(parent.info.run_id)

    # 3. finished trials MLflow lacks
    for number in sorted(trials):
        t = trials[number]
        if number in trial_runs or number in tracker.tracking_trials or \
                t.state not in FINISHED_STATES or _writer_may_live(t):
            continue
        params, metrics, status = trial_payload(t, objectives)
        c = t.user_attrs.get("cycle")
        tags = {"kind": "trial", "trial": number, "study": name, "agent": agent, BACKFILLED_TAG: "true",
                "baseline": bool(t.user_attrs.get("baseline")), "state": t.state.name,
                "feasible": bool(t.user_attrs.get("feasible")), "failure_cause": t.user_attrs.get("cause") or ""}
        if isinstance(c, int):
            tags["cycle"] = c
        if t.user_attrs.get("error"):
            tags["error"] = str(t.user_attrs["error"])[:1000]
        run_id = tracker.start_run(f"trial-{number}", parent_run_id=parent_of(t), tags=tags, params=params)
        if run_id is None:
            return
        tracker.log(run_id, metrics=metrics)
        tracker.end_run(run_id, status)
        report.backfilled_trials.append(number)
    # 4. verifications the champion store holds and MLflow lacks (a stored entry's writer is done with MLflow)
    for v in stored:
        key = verification_key(v)
        if key in have_keys or (v.get("run_id") and str(v["run_id"]) in have_ids):
            continue
        cand = v.get("trial")
        passed = bool(v.get("passed"))
        parent = parent_of(trials.get(cand)) if isinstance(cand, int) else None
        run_id = tracker.start_run(
            f"verify-trial-{cand} {'pass' if passed else 'fail'}" if cand is not None else "verify",
            parent_run_id=parent,
            tags={"kind": "verification", "agent": agent, "study": name, VERIFICATION_KEY_TAG: key,
                  BACKFILLED_TAG: "true", "candidate_trial": "" if cand is None else cand,
                  "reference": v.get("reference", ""), "verdict": "pass" if passed else "fail",
                  "reason": str(v.get("reason", ""))[:4000], "interrupted": False},
            params={"method": v.get("method", "")} if v.get("method") else None)
        if run_id is None:
            return
        metrics, series = _verification_payload(v)
        tracker.log(run_id, metrics=metrics)
        tracker.log_steps(run_id, series)
        tracker.end_run(run_id, "FINISHED")
        have_keys.add(key)
        report.backfilled_verifications.append(key)
