"""A fleet worker: one of many processes, on any host, that feed one shared study until its budget is spent.

    tuner worker agents/fleet.yaml          # on every node; the agent's storage is a shared database

Every worker opens the agent's study (Optuna's RDB storage is the only coordinator: no scheduler), reaps the
trials of workers that went away (tuner.coord.lease), and loops: take a slot of the budget and ask a trial in one
step under the study's lock (tuner.coord.dblock), so the fleet never runs more trials than the budget however many
workers join; measure it; tell it. The baseline is queued once for the fleet (the first ask takes it). The
budget counts the study's trials that ran or run, except those lost with their process, which are redone. A
worker whose slots are all taken waits while other workers' trials run (one may be lost and re-open a slot)
and leaves when none runs. The trials of a budget are nested under one MLflow run, `fleet`, made once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from optuna.trial import TrialState

from tuner.loop import Session, TrialOutcome, finish_tracking, reap, run_trial
from tuner.study.study import SearchExhausted, with_db_retry
from tuner.tracking.sync import FLEET_RUN_ATTR

log = logging.getLogger(__name__)


@dataclass
class WorkerResult:
    budget: int | None
    run_id: str | None
    outcomes: list[TrialOutcome] = field(default_factory=list)
    counted: int = 0
    stopped: bool = False
    wall_s: float = 0.0


def fleet_run(session: Session, budget: int | None) -> str | None:
    """The MLflow run the fleet's trials of this budget nest under: made by the first worker, found by the rest."""
    study = session.study
    with study.lock("fleet-run"):
        attr = study.study.user_attrs.get(FLEET_RUN_ATTR)
        if isinstance(attr, dict) and attr.get("budget") == budget and attr.get("run_id") and not attr.get("ended"):
            return str(attr["run_id"])
        spec = session.agent.spec
        run_id = session.tracker.start_run(
            "fleet", tags={"kind": "fleet", "agent": spec.name, "study": study.name,
                           **{f"target.{k}": v for k, v in session.description.items()}},
            params={"trials_planned": budget if budget is not None else "unbounded", "sampler": spec.sampler.name,
                    "objectives": ",".join(f"{o.metric}:{o.direction}" for o in spec.objectives)})
        if run_id is not None:
            study.study.set_user_attr(FLEET_RUN_ATTR, {"run_id": run_id, "budget": budget, "ended": False,
                                                       "started_at": time.time()})
        return run_id


def _end_fleet_run(session: Session, run_id: str | None) -> None:
    study = session.study
    with study.lock("fleet-run"):
        attr = study.study.user_attrs.get(FLEET_RUN_ATTR)
        if not isinstance(attr, dict) or attr.get("run_id") != run_id or attr.get("ended"):
            return
        trials = study.trials()
        done = [t for t in trials if t.state == TrialState.COMPLETE]
        summary = {"trials_run": float(study.counted()), "trials_feasible": float(sum(
            bool(t.user_attrs.get("feasible")) for t in done)),
            "fleet_wall_s": time.time() - float(attr.get("started_at", time.time()))}
        best = study.best()
        if best:
            for i, v in enumerate(best[0].values):
                summary[f"best_value_{i}"] = v
            session.tracker.log(run_id, tags={"best_trial": best[0].number})
        session.tracker.log(run_id, metrics=summary)
        session.tracker.end_run(run_id, "FINISHED")
        study.study.set_user_attr(FLEET_RUN_ATTR, {**attr, "ended": True, "ended_at": time.time()})


def _others_running(session: Session) -> bool:
    return any(t.state == TrialState.RUNNING for t in session.study.trials())


def run_worker(session: Session, *, trials: int | None = None, wall_time_s: float | None = None,
               stop_event: threading.Event | None = None, on_trial: Callable[[TrialOutcome], None] | None = None,
               gpu_pool: Any = None, parallel: int | None = None) -> WorkerResult:
    """Run trials of the shared study until it holds `trials` (default: the agent's budget.trials)."""
    spec = session.agent.spec
    stop = stop_event or threading.Event()
    budget = trials if trials is not None else spec.budget.trials
    wall = wall_time_s if wall_time_s is not None else spec.budget.wall_time_s
    poll_s = float(spec.lease.heartbeat_s)
    study = session.study
    # every worker opens the study with the agent's seed: left so, their samplers would propose one sequence
    # between them, each configuration once per worker (Optuna reseeds its own parallel workers alike)
    study.study.sampler.reseed_rng()
    # a worker that joins while the database restarts waits for it, as its trials do (each step is idempotent:
    # reaping, the baseline's queueing and the fleet run's lookup under their locks)
    with_db_retry("reap lost trials and queue the baseline", lambda: reap(session))

    def join() -> str | None:
        return with_db_retry("join the fleet's MLflow run", lambda: fleet_run(session, budget))

    def others_running() -> bool:
        return with_db_retry("read the running trials", lambda: _others_running(session))

    run_id = join()
    if gpu_pool is None:
        from tuner.placement.gpupool import GpuPool

        gpu_pool = GpuPool(spec.gpus)
    t0 = time.monotonic()
    result = WorkerResult(budget=budget, run_id=run_id)
    lock = threading.Lock()
    last_reap = [time.monotonic()]  # reap() above has just run
    exhausted = threading.Event()  # the space has no configuration left: the budget can never be spent

    def out_of_time() -> bool:
        return stop.is_set() or (wall is not None and time.monotonic() - t0 >= wall)

    def take() -> tuple[tuple[Any, dict[str, Any]], float] | None:
        """A slot of the budget and its trial, with the time that took (the tuner's own), or None when the
        budget is spent and nobody else runs."""
        def slot() -> tuple[Any, dict[str, Any]] | None:
            with study.lock("budget"):
                if budget is None or study.counted() < budget:
                    return study.ask()
                return None

        while not out_of_time():  # every step retried while the database is unreachable (a restart)
            t_take = time.monotonic()
            if t_take - last_reap[0] >= poll_s:  # a lost trial is seen within a beat of its lease's end
                last_reap[0] = t_take
                with_db_retry("reap lost trials", study.reap_stale)
            try:
                asked = with_db_retry("take a slot of the budget", slot)
            except SearchExhausted as exc:  # every configuration ran: no trial left to spend the budget on
                log.warning("%s: this worker ends", exc)
                exhausted.set()
                return None
            if asked is not None:
                return asked, time.monotonic() - t_take
            if not others_running():
                return None
            stop.wait(poll_s)  # another worker's trial may yet be lost and re-open a slot
        return None

    def work() -> None:
        while True:
            taken = take()
            if taken is None:
                return
            asked, take_s = taken
            if result.run_id is None and session.tracker.enabled:  # MLflow was down when this worker joined
                result.run_id = join()
            outcome = run_trial(session, result.run_id, stop, gpu_pool, asked=asked)
            outcome.overhead_s += take_s  # reaping, the budget's lock and the ask
            with lock:
                result.outcomes.append(outcome)
            if on_trial is not None:
                on_trial(outcome)

    n = parallel or spec.parallel_trials
    if n <= 1:
        work()
    else:
        with ThreadPoolExecutor(max_workers=n, thread_name_prefix="trial") as ex:
            for f in [ex.submit(work) for _ in range(n)]:
                f.result()
    result.stopped = stop.is_set()
    result.counted = with_db_retry("count the study's trials", study.counted)
    result.wall_s = time.monotonic() - t0
    spent = budget is not None and result.counted >= budget
    if (spent or exhausted.is_set()) and not others_running():  # nothing more will join the fleet run
        with_db_retry("end the fleet's MLflow run", lambda: _end_fleet_run(session, result.run_id))
    finish_tracking(session, interrupted=result.stopped)
    result.outcomes.sort(key=lambda o: o.number)
    return result
