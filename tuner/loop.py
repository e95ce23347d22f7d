"""One tuning cycle: Plan (ask Optuna), Do (deploy + measure), record (tell + MLflow).

Check and Act (verification and promotion) are composed on top by the daemon and `tuner promote`.
A failing trial is recorded with its classified cause and the loop goes on; a stop request ends the
cycle after tearing the running deployment down and recording the running trial as interrupted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from tuner.agent import Agent, bind_target
from tuner.base.files import private_dir
from tuner.base.redact import redact_text
from tuner.champions.store import ChampionStore
from tuner.errors import InfeasibleConfig, Interrupted, PromotionError, TrialError
from tuner.measure.failures import error_rate_slo, request_failure
from tuner.measure.measurement import Measurement
from tuner.study.objectives import (
    FAILURE_CONSTRAINT,
    Evaluation,
    early_stop_rule,
    evaluate,
    failed_evaluation,
    goodput_thresholds_ms,
    pruned_evaluation,
)
from tuner.study.rate_objective import measure_max_rate, search_spec
from tuner.study.study import (
    DatabaseUnreachable,
    LeaseLost,
    SearchExhausted,
    TunerStudy,
    default_storage,
    with_db_retry,
)
from tuner.study.summary import environment_failure
from tuner.targets.base import Target, TrialContext
from tuner.targets.process import reap_orphans
from tuner.targets.registry import make_target
from tuner.tracking.review import log_cycle_plots
from tuner.tracking.tracker import Tracker
from tuner.tracking.trials import TrialRecord, TrialRecorder

log = logging.getLogger(__name__)


@dataclass
class TrialOutcome:
    number: int
    params: dict[str, Any]
    values: list[float]
    feasible: bool
    cause: str | None = None
    error: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    overhead_s: float = 0.0  # the tuner's own time (ask, tell, tracking, bookkeeping)
    repeat_of: int | None = None  # a re-proposed configuration measured as a repeat of that trial (no budget)
    duration_s: float = 0.0
    gpus: tuple[int, ...] = ()
    interrupted: bool = False
    pruned: str | None = None  # why the run was stopped early (tuner.measure.early_stop): recorded PRUNED
    capacity: dict[str, Any] | None = None  # the trial's capacity search (max_rate_under_slo): runs, seconds


@dataclass
class CycleResult:
    cycle: int
    run_id: str | None
    outcomes: list[TrialOutcome]
    interrupted: bool
    wall_s: float
    repeats: list[TrialOutcome] = field(default_factory=list)  # re-proposals measured as repeats (no budget)
    environment_stop: str | None = None  # why the cycle stopped early (tuner.study.summary.environment_failure)


@dataclass
class Session:
    """Everything a cycle needs, built once: agent, target, study, tracker, state dir."""

    agent: Agent
    state_dir: Path
    target: Target
    study: TunerStudy
    tracker: Tracker
    executor: Any = None  # tuner.placement.ray_executor.RayExecutor, or None: this host's GPU pool
    scenario: str | None = None  # the scenario whose study and champion this is (tuner.scenarios), else None

    @cached_property
    def description(self) -> dict[str, str]:
        """The target's describe() (engine version, hardware), read once per session: it may probe NVML."""
        return self.target.describe()

    @cached_property
    def recorder(self) -> TrialRecorder:
        """Writes each trial's record (Optuna's tell, then its MLflow run): the loop calls it once a trial."""
        return TrialRecorder(self.tracker, self.agent.spec, self.study.name, self.description,
                             on_recovered=lambda: sync_mlflow(self))

    @property
    def agent_dir(self) -> Path:
        return private_dir(self.state_dir / self.agent.name, tighten=False)


def open_session(agent: Agent, state_dir: Path, *, target: Target | None = None,
                 study_name: str | None = None, tracker: Tracker | None = None) -> Session:
    """Build the target (or take the one passed in), bind host facts, open study and tracker."""
    spec = agent.spec
    private_dir(state_dir)
    if target is None:
        target = make_target(spec.target.kind, agent.target_options, agent.path.parent)
    space = bind_target(agent, target)  # the checks `validate` runs too
    agent = agent.model_copy(update={"space": space})
    storage = spec.storage or default_storage(state_dir)
    study = TunerStudy(spec, space, storage_url=storage, study_name=study_name)
    if tracker is None:
        tracker = Tracker.for_agent(spec, state_dir)
    from tuner.study import sizing

    agent = sizing.apply(agent, sizing.recorded(study))  # an `auto` rate the study was sized at
    from tuner.placement.ray_executor import make_executor

    session = Session(agent=agent, state_dir=state_dir, target=target, study=study, tracker=tracker,
                      executor=make_executor(spec))
    reap(session)  # trial 0 is the baseline: queue it before anything else can be enqueued
    sync_mlflow(session)  # runs a killed process left RUNNING ended KILLED; what MLflow missed written
    return session


CHAMPION_LOCK_WAIT_S = 5.0  # how long a start waits for a promote or rollback in flight before leaving its journal


def recover_champion(store: ChampionStore, tracker: Tracker | None) -> None:
    """Make the champion store and MLflow agree at a start: a promote or rollback killed half-way is undone or
    completed (ChampionStore.recover, which taking the store's lock runs), then MLflow's champion aliases are
    made to name the champion in force (sync_champion_aliases)."""
    try:
        if store.in_flight():
            with store.lock(timeout_s=CHAMPION_LOCK_WAIT_S):
                pass
    except PromotionError as exc:  # a live promote holds it: that process finishes its own switch
        log.info("%s", exc)
    except OSError as exc:
        log.warning("cannot recover the interrupted promote or rollback of %s: %s", store.agent, exc)
        return
    if tracker is not None:
        sync_champion_aliases(store, tracker)


def sync_champion_aliases(store: ChampionStore, tracker: Tracker) -> None:
    """MLflow's aliases of the agent's registered model name what the champion file has in force (a switch
    killed before it moved them, or MLflow down then); each alias is read first and written only when it
    differs. Bounded by the tracker's timeout; nothing when there is no champion or MLflow is off or down."""
    if not tracker.enabled or tracker.down:
        return
    try:
        want = store.aliases()
    except Exception as exc:  # noqa: BLE001 - a champion file that does not parse is reported where it is read
        log.debug("champion aliases not checked: %s", exc)
        return
    for alias, version in want.items():
        now = tracker.alias_target(store.agent, alias)
        if now is None:
            return  # MLflow does not answer (now marked down): the next start does it
        if now[0] != version:
            log.info("MLflow alias %s@%s moved to %s (the champion in force)", store.agent, alias, version)
            tracker.set_alias(store.agent, alias, version)


def sync_mlflow(session: Session) -> None:
    """Make MLflow hold what the Optuna study and the champion store's verifications hold
    (tuner.tracking.sync); bounded by the tracker's timeout."""
    from tuner.champions.db import champion_store
    from tuner.tracking.sync import reconcile

    spec = session.agent.spec
    recover_champion(champion_store(session), session.tracker)
    if not session.tracker.enabled or session.tracker.down:
        return  # nothing can be written now; the store's return (recovered()) or the next start does it
    try:
        verifications = champion_store(session).verifications()
    except Exception as exc:  # noqa: BLE001 - the trials and cycles are still made complete
        log.warning("cannot read the verifications to make MLflow complete: %s", redact_text(str(exc)))
        verifications = []
    # one reconciler at a time for the whole fleet (workers have state dirs of their own): two at once both
    # found a trial's run missing and both wrote it
    try:
        with session.study.lock("mlflow-sync"):
            reconcile(session.tracker, session.study.study, agent=spec.name,
                      objectives=[o.metric for o in spec.objectives], state_dir=session.state_dir,
                      description=session.description, verifications=verifications)
    except Exception as exc:  # noqa: BLE001 - the lock's database is down or held too long: the next sync does it
        log.warning("MLflow not made complete now (%s); the next start or recovery does it",
                    redact_text(str(exc)) or type(exc).__name__)


def finish_tracking(session: Session, *, interrupted: bool = False) -> None:
    """At the end of a run, cycle, verification or worker: a store marked down is asked once more (at most
    the tracker's end_probe_s), and what MLflow missed is written when it answers; a store still down is
    left to the next start (Optuna and the champion store keep everything meanwhile)."""
    tracker = session.tracker
    if not tracker.enabled:
        return
    if tracker.down:
        tracker.probe_now()
    if interrupted or tracker.failures or tracker.recovered():
        sync_mlflow(session)


def reap(session: Session) -> None:
    """Before new trials: kill orphan servers of a killed tuner, fail its RUNNING trials, queue the baseline
    and the candidates."""
    reap_orphans(session.state_dir)
    session.study.reap_stale()
    session.study.ensure_baseline()


def run_cycle(
    session: Session,
    *,
    trials: int | None = None,
    wall_time_s: float | None = None,
    stop_event: threading.Event | None = None,
    on_trial: Callable[[TrialOutcome], None] | None = None,
    gpu_pool: Any = None,
    parallel: int | None = None,
    on_sizing_step: Callable[[Any, int], None] | None = None,
    finish: bool = True,
) -> CycleResult:
    """Run up to `trials` trials (default: the agent's budget) as one cycle under an MLflow parent run.

    A study whose workload has `rate_per_s: auto` is sized first, once (tuner.study.sizing; `on_sizing_step` gets
    each run of the capacity search). `finish`: end with finish_tracking (the daemon does it after its Check
    instead, so that one probe covers the cycle and its verification)."""
    from tuner.study import sizing as rate_sizing

    stop = stop_event or threading.Event()
    reap(session)
    sized_before = rate_sizing.recorded(session.study) is not None
    sizing = rate_sizing.ensure(session, on_step=on_sizing_step, stop=stop)
    spec = session.agent.spec
    if spec.sampler.screen is not None and session.study.screener is None:  # predicts at the sized workload
        from tuner.study.screen import Screener

        session.study.screener = Screener.for_agent(session.agent, session.target)
    n_trials = trials if trials is not None else (spec.schedule.trials_per_cycle if spec.schedule and
                                                  spec.schedule.trials_per_cycle else spec.budget.trials)
    wall = wall_time_s if wall_time_s is not None else spec.budget.wall_time_s
    study = session.study.study
    cycle = int(study.user_attrs.get("cycles", 0)) + 1
    study.set_user_attr("cycles", cycle)
    desc = session.description
    study.set_user_attr("target", desc)  # the hardware and engine the trials ran on (tuner report)
    run_id = session.tracker.start_run(
        f"cycle-{cycle}",
        tags={"kind": "cycle", "cycle": cycle, "agent": spec.name, "study": session.study.name,
              **{f"target.{k}": v for k, v in desc.items()}},
        params={"trials_planned": n_trials, "sampler": spec.sampler.name,
                "objectives": ",".join(f"{o.metric}:{o.direction}" for o in spec.objectives),
                "slos": ",".join(s.key for s in spec.slos) or "none",
                "workload": yaml.safe_dump(spec.workload.model_dump(mode="json"), sort_keys=True)[:5000],
                **({"workload_rate_per_s": sizing.rate_per_s, "workload_rate_method": sizing.describe()}
                   if sizing else {})},
    )
    if sizing is not None:
        session.tracker.log(run_id, metrics={"workload_rate_per_s": sizing.rate_per_s,
                                             "baseline_capacity_rate_per_s": sizing.capacity_rate_per_s},
                            tags={"workload_rate": "sized in this cycle" if not sized_before else "reused"})
        if not sized_before:
            import json

            session.tracker.log_text(run_id, json.dumps(sizing.to_attr(), indent=1), "rate_sizing.json")
    if gpu_pool is None:
        from tuner.placement.gpupool import GpuPool

        gpu_pool = GpuPool(spec.gpus)
    workers = parallel or spec.parallel_trials
    t0 = time.monotonic()
    outcomes: list[TrialOutcome] = []
    repeats: list[TrialOutcome] = []
    env_stop: dict[str, str | None] = {"why": None}
    lock = threading.Lock()
    budget = {"left": n_trials}

    def take() -> bool:
        with lock:
            if stop.is_set():
                return False
            if wall is not None and time.monotonic() - t0 >= wall:
                return False
            if budget["left"] is not None:
                if budget["left"] <= 0:
                    return False
                budget["left"] -= 1
            return True

    def worker() -> None:
        while take():
            try:
                outcome = run_trial(session, run_id, stop, gpu_pool, cycle=cycle)
            except SearchExhausted as exc:
                log.warning("%s: the cycle ends after %d trial(s)", exc, len(outcomes))
                with lock:
                    budget["left"] = 0
                return
            with lock:
                if outcome.repeat_of is not None:  # a noise sample of an earlier trial: no budget trial
                    repeats.append(outcome)
                    if budget["left"] is not None:
                        budget["left"] += 1
                    continue
                outcomes.append(outcome)
                why = environment_failure(outcomes) if env_stop["why"] is None else None
                if why is not None:
                    env_stop["why"] = why
                    log.warning("%s", why)
                    budget["left"] = 0
            if on_trial is not None:
                on_trial(outcome)

    try:
        if workers <= 1:
            worker()
        else:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="trial") as ex:
                futures = [ex.submit(worker) for _ in range(workers)]
                for f in futures:
                    f.result()
    except BaseException:
        session.tracker.end_run(run_id, "FAILED")  # not left RUNNING in MLflow forever
        raise
    interrupted = stop.is_set()
    wall_s = time.monotonic() - t0
    best = session.study.best()
    summary: dict[str, float] = {"trials_run": len(outcomes), "trials_repeated": len(repeats),
                                 "trials_feasible": sum(o.feasible for o in outcomes),
                                 "trials_failed": sum(o.cause is not None for o in outcomes),
                                 "trials_pruned": sum(o.pruned is not None for o in outcomes),
                                 "cycle_wall_s": wall_s}
    cost = [o.capacity for o in outcomes if o.capacity]
    if cost:  # what the capacity searches of max_rate_under_slo cost, in all
        summary["capacity_probe_runs"] = float(sum(int(c.get("runs") or 0) for c in cost))
        summary["capacity_probe_load_s"] = sum(float(c.get("load_s") or 0.0) for c in cost)
        summary["capacity_probe_wall_s"] = sum(float(c.get("wall_s") or 0.0) for c in cost)
    if best:
        for i, v in enumerate(best[0].values):
            summary[f"best_value_{i}"] = v
        session.tracker.log(run_id, tags={"best_trial": best[0].number})
    noise = session.study.noise_report()
    if noise and noise.get("cv") is not None:
        summary["noise_cv"] = noise["cv"]
        if "best" in noise:
            summary["best_ci_low_0"], summary["best_ci_high_0"] = noise["best"]["low"], noise["best"]["high"]
    session.tracker.log(run_id, metrics=summary, tags={"interrupted": interrupted})
    log_cycle_plots(session.tracker, run_id, session.study.trials(), spec)
    session.tracker.end_run(run_id, "KILLED" if interrupted else "FINISHED")
    study.set_user_attr(f"cycle:{cycle}", {"interrupted": interrupted, "trials": len(outcomes)})
    if finish:
        finish_tracking(session, interrupted=interrupted)
    log.info("cycle %d of %s (study %s): %d trial(s) in %.1fs, %d feasible, %d failed%s%s", cycle, spec.name,
             session.study.name, len(outcomes), wall_s, summary["trials_feasible"], summary["trials_failed"],
             f", best trial {best[0].number}: {spec.objectives[0].metric}={best[0].values[0]:.4g}" if best else "",
             " (interrupted)" if interrupted else "")
    study.set_user_attr("last_cycle", {"cycle": cycle, "run_id": run_id, "trials": len(outcomes),
                                       "interrupted": interrupted, "wall_s": round(wall_s, 3),
                                       "ended_at": time.time()})
    return CycleResult(cycle=cycle, run_id=run_id, outcomes=sorted(outcomes, key=lambda o: o.number),
                       interrupted=interrupted, wall_s=wall_s, repeats=repeats, environment_stop=env_stop["why"])


def measure_config(session: Session, config: dict[str, Any], ctx: TrialContext, *,
                   on_deployment: Callable[[Any], None] | None = None) -> tuple[Measurement, Any]:
    """Deploy `config`, measure the agent's workload once (with a `max_rate_under_slo` objective: its capacity
    search, tuner.study.rate_objective), tear down. Returns (measurement, log path).

    `on_deployment(dep)` runs after the measurement, before teardown (verification reads the quality probe).
    """
    spec = session.agent.spec
    goodput = goodput_thresholds_ms(spec.slos)
    with session.target.deploy(config, ctx) as dep:
        if search_spec(spec) is not None:  # max_rate_under_slo: a bounded capacity search on this deployment
            m = measure_max_rate(dep, spec, seed=ctx.seed, base_dir=session.agent.path.parent,
                                 stop=ctx.stop_event, goodput_ms=goodput)
        else:
            m = dep.measure(spec.workload, goodput_ms=goodput, seed=ctx.seed)
        if on_deployment is not None:
            on_deployment(dep)
        return m, dep.log_path


def run_trial(session: Session, parent_run_id: str | None, stop: threading.Event, gpu_pool: Any, *,
              asked: tuple[Any, dict[str, Any]] | None = None, cycle: int | None = None) -> TrialOutcome:
    """Measure one trial (asked here, or `asked` by the caller) and record it in Optuna and MLflow.

    Whatever fails after the ask is the trial's: an error nobody foresaw (a bug, a database call that broke)
    fails the trial with cause `internal_error` and the loop goes on; only a database that stays unreachable
    (DatabaseUnreachable, one line) ends it."""
    ts = time.monotonic()
    trial, params = asked if asked is not None else session.study.ask()
    overhead = time.monotonic() - ts
    try:
        return _measure_and_record(session, parent_run_id, stop, gpu_pool, trial, params, overhead, cycle)
    except (DatabaseUnreachable, SearchExhausted):
        raise
    except Exception as exc:  # noqa: BLE001 - a failing trial is recorded with its cause, never a dead loop
        error = redact_text(f"{type(exc).__name__}: {exc}")
        log.exception("trial %d could not be completed", trial.number)
        session.study.tell_interrupted(trial, "internal_error", error=error)
        return TrialOutcome(trial.number, params, [], False, cause="internal_error", error=error)


def _measure_and_record(session: Session, parent_run_id: str | None, stop: threading.Event, gpu_pool: Any,
                        trial: Any, params: dict[str, Any], overhead: float, cycle: int | None) -> TrialOutcome:
    spec = session.agent.spec
    space = session.agent.space
    number = trial.number
    config = space.full_config(params)
    baseline = bool(trial.user_attrs.get("baseline"))
    attrs: dict[str, Any] = {"config": config, "label": f"trial-{number}"}
    if parent_run_id is not None:
        attrs["cycle_run_id"] = parent_run_id  # verification runs nest under the cycle of their candidate
    if cycle is not None:
        attrs["cycle"] = cycle
    m: Measurement | None = None
    log_path = None
    gpus: tuple[int, ...] = ()
    cause = error = None
    t_run = time.monotonic()
    started_at = time.time()
    try:
        # the baseline is the user's: the target's own start judges its resources
        bad = space.violations(params, resources=not baseline)
        if bad:
            raise InfeasibleConfig(f"violates constraint(s): {'; '.join(bad)}")
        need = session.target.gpus_needed(config)
        # the baseline is measured whole (the reference of the run's table and of the noise); a capacity
        # search has its own early stop (a saturated probe)
        prune = None if baseline or search_spec(spec) is not None else early_stop_rule(spec)
        ctx = TrialContext(trial_number=number, state_dir=session.state_dir, seed=spec.workload.seed + number,
                           stop_event=stop, label=f"trial-{number}", early_stop=prune)
        if session.executor is not None:  # Ray places the trial on a node and gives it the GPUs
            m, log_path, placement = session.executor.measure(session, config, ctx, need,
                                                                goodput_thresholds_ms(session.agent.spec.slos))
            gpus = placement.gpus
            attrs.update(placement.attrs())
        elif need > 0 and gpu_pool is not None and gpu_pool.total > 0:
            with gpu_pool.claim(need, stop, label=f"trial-{number}") as claimed:
                gpus = tuple(claimed)
                ctx.gpus = gpus
                m, log_path = measure_config(session, config, ctx)
        else:
            m, log_path = measure_config(session, config, ctx)
        if stop.is_set() and m is None:
            raise Interrupted("stopped")
    except Interrupted as exc:
        session.study.tell_interrupted(trial)
        log.warning("trial %d interrupted: %s", number, exc)
        return TrialOutcome(number, params, [], False, cause="interrupted", error=str(exc), interrupted=True)
    except TrialError as exc:  # the study, the logs and MLflow get the cause with any URL's secrets hidden
        cause, error = exc.cause, redact_text(str(exc))
        if exc.log_tail:
            attrs["log_tail"] = redact_text(exc.log_tail[-2000:])
        log.info("trial %d failed (%s): %s", number, cause, error)
    except Exception as exc:  # noqa: BLE001 - a bug in a target must not kill the loop
        cause, error = "internal_error", redact_text(f"{type(exc).__name__}: {exc}")
        log.exception("trial %d raised an unexpected error", number)
    run_s = time.monotonic() - t_run
    ts = time.monotonic()
    pruned: dict[str, Any] | None = None
    if m is not None:
        ev: Evaluation = evaluate(m, spec.objectives, spec.slos)
        metrics = m.metrics()
        attrs["metrics"] = metrics
        if m.capacity_search is not None:
            attrs["capacity_search"] = m.capacity_search
        failed = request_failure(m, error_rate_slo(spec.slos))
        if failed is None and m.early_stop is not None:  # stopped early: PRUNED, its partial measurement kept
            pruned = m.early_stop
            ev = pruned_evaluation(m, spec)
            attrs["pruned"] = pruned
            attrs["error"] = f"pruned: {pruned.get('reason')}"
        if failed is not None:  # measured, but the server refused or broke the requests: say why
            cause, error = failed[0], redact_text(failed[1])
            # infeasible whatever the SLOs: nothing was served (the constraint of trials never measured)
            ev = Evaluation(values=ev.values, constraints={**ev.constraints,
                                                           FAILURE_CONSTRAINT: failed_evaluation(spec, cause)
                                                           .constraints[FAILURE_CONSTRAINT]})
            attrs["cause"] = cause
            attrs["error"] = error[:2000]
            log.info("trial %d failed (%s): %s", number, cause, error)
    else:
        ev = failed_evaluation(spec, cause)
        metrics = {}
        attrs["cause"] = cause
        attrs["error"] = (error or "")[:2000]
        failed_log = session.state_dir / "logs" / f"trial-{number}.log"
        # the evidence of the failure, not only its cause (a log this trial wrote, not an older namesake's)
        if log_path is None and failed_log.is_file() and failed_log.stat().st_mtime >= started_at - 1:
            log_path = failed_log
    if gpus:
        attrs["gpus"] = list(gpus)
    attrs["duration_s"] = round(run_s, 4)
    repeat_of = trial.user_attrs.get("repeat_of")
    n_repeats = spec.noise.repeats if repeat_of is None and (baseline or (ev.feasible and with_db_retry(
        "read the best trial", lambda: _beats_best(session, ev)))) else 0
    if baseline:
        n_repeats = max(n_repeats, spec.noise.baseline_repeats)
    if n_repeats and m is not None and cause is None and pruned is None and not stop.is_set():
        overhead += time.monotonic() - ts
        attrs["repeats"] = repeat_trial(session, number, config, stop, gpu_pool, n_repeats)
        ts = time.monotonic()
    rec = TrialRecord(number=number, baseline=baseline, config=config, evaluation=ev, metrics=metrics,
                      measurement=m, cause=cause, error=error, log_path=log_path, gpus=gpus, cycle=cycle,
                      parent_run_id=parent_run_id, pruned=pruned)

    def tell(r: TrialRecord) -> None:
        try:
            session.study.tell(trial, ev, attrs=attrs,
                               pruned_at=int(pruned["completed"]) if pruned is not None else None)
        except LeaseLost as exc:  # failed by another process meanwhile: the measurement still goes to MLflow
            log.warning("%s; its measurement is kept in MLflow only", exc)
            r.cause = r.cause or "worker_lost"
            r.error = r.error or str(exc)

    session.recorder.record(rec, tell)
    cause, error = rec.cause, rec.error
    overhead += time.monotonic() - ts
    if cause is None and pruned is not None:
        log.info("trial %d pruned after %.1fs: %s", number, run_s, pruned.get("reason"))
    elif cause is None:
        log.info("trial %d finished in %.1fs: %s%s", number, run_s,
                 ", ".join(f"{o.metric}={v:.4g}" for o, v in zip(spec.objectives, ev.values, strict=True)),
                 "" if ev.feasible else " (violates an SLO)")
    return TrialOutcome(number, params, ev.values, ev.feasible, cause=cause, error=error, metrics=metrics,
                        overhead_s=overhead, duration_s=run_s, gpus=gpus,
                        repeat_of=repeat_of if isinstance(repeat_of, int) else None,
                        pruned=str(pruned.get("reason")) if pruned is not None and cause is None else None,
                        capacity=_capacity_cost(m))


def _capacity_cost(m: Measurement | None) -> dict[str, Any] | None:
    """What a trial's capacity search cost (probe runs, seconds of load, wall seconds), or None without one."""
    c = m.capacity_search if m is not None else None
    if not c:
        return None
    return {k: c.get(k) for k in ("runs", "load_s", "wall_s", "rate_per_s", "converged")}


def _beats_best(session: Session, ev: Evaluation) -> bool:
    """True when `ev` (of a trial not told yet) is better than the best feasible trial's first value."""
    best = session.study.best()
    if not best or len(session.agent.spec.objectives) != 1:
        return not best
    sign = 1 if session.agent.spec.objectives[0].direction == "maximize" else -1
    return sign * ev.values[0] > sign * best[0].values[0]


def repeat_trial(session: Session, number: int, config: dict[str, Any], stop: threading.Event,
                 gpu_pool: Any, n: int | None = None) -> list[float]:
    """Measure trial `number`'s configuration `n` (default `noise.repeats`) more times (new seeds): the first
    objective's values, recorded as the trial's `repeats` (tuner.search.noise reads them). A failed repeat is
    logged and skipped: the trial's own measurement stands."""
    spec = session.agent.spec
    values: list[float] = []
    for i in range(1, (spec.noise.repeats if n is None else n) + 1):
        if stop.is_set():
            break
        label = f"trial-{number}-repeat-{i}"
        ctx = TrialContext(trial_number=number, state_dir=session.state_dir, stop_event=stop, label=label,
                           seed=spec.workload.seed + number + 100_003 * i)
        try:
            need = session.target.gpus_needed(config)
            if need > 0 and gpu_pool is not None and gpu_pool.total > 0:
                with gpu_pool.claim(need, stop, label=label) as claimed:
                    ctx.gpus = tuple(claimed)
                    m, _ = measure_config(session, config, ctx)
            else:
                m, _ = measure_config(session, config, ctx)
        except (TrialError, Interrupted) as exc:
            log.warning("%s failed (%s); the trial's own measurement stands", label, exc)
            continue
        values.append(evaluate(m, spec.objectives, spec.slos).values[0])
    return values
