"""The Optuna study of an agent: sampler, storage, baseline, reaping, ask/tell with constraints.

Optuna's storage is the source of truth for trials. Trial user attributes written here:
`baseline` (bool), `feasible` (bool), `cause` (failure cause, absent when measured), `error` (message),
`metrics` (the measurement's numbers), `config` (what the target received), `label`, `gpus`.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import math
import os
import socket
import statistics
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from tuner.base.redact import redact_text, redact_url
from tuner.coord.dblock import LockTimeout, study_lock
from tuner.coord.lease import Heartbeat
from tuner.errors import ConfigError, TunerError
from tuner.search.samplers import make_sampler
from tuner.search.space import SearchSpace
from tuner.spec import AgentSpec
from tuner.study.objectives import Evaluation, failed_evaluation, pessimistic

log = logging.getLogger(__name__)

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
# the tuner beats its trials' heartbeats itself (tuner.coord.lease) around ask and tell
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
T = TypeVar("T")
DB_RETRY_S = 120.0  # how long a worker waits for an unreachable database before it gives up
# causes of trials that were not measured because their process went away (not counted in a fleet's budget)
LOST_CAUSES = ("interrupted", "worker_lost")
# re-proposals of configurations already run, answered in a row, before ask() draws one no trial ran
DUPLICATE_LIMIT = 20
# proposals per trial the failure model may skip before one is deployed anyway
MAX_PREDICTED_FAILURES = 10


def not_budget(t: FrozenTrial) -> bool:
    """Whether `t` is no budget trial: never deployed (rejected, screened, a copy) or a repeat."""
    u = t.user_attrs
    return bool(u.get("rejected") or u.get("screened")) or u.get("repeat_of") is not None \
        or u.get("duplicate_of") is not None


def _ran(t: FrozenTrial) -> bool:
    """Whether `t` stands for a run of its configuration (not a prediction, a rejection or a copy)."""
    u = t.user_attrs
    return not (u.get("rejected") or u.get("screened") or u.get("duplicate_of") is not None) and "config" in u


# system attribute of a trial: the process that asked it (reap_stale spares the trials of live owners)
OWNER_ATTR = "tuner:owner"


def _this_process() -> dict[str, Any]:
    from tuner.base.proc import process_start_ticks

    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "start_ticks": process_start_ticks(pid)}


# trials this process asked and has not told yet: (storage URL, trial id)
_IN_FLIGHT: set[tuple[str, int]] = set()
_IN_FLIGHT_LOCK = threading.Lock()


def _owner_may_live(owner: Any, key: tuple[str, int]) -> bool:
    """False when `owner` (OWNER_ATTR) is a process of this host that is gone (or none was recorded).

    This process's own trials live only while asked and not told (one that an error left behind is reaped).
    """
    if not isinstance(owner, dict) or not isinstance(owner.get("pid"), int):
        return False
    if owner.get("host") != socket.gethostname():
        return True  # another host's tuner (a shared database): its own next start reaps its trials
    from tuner.base.proc import pid_alive, process_start_ticks

    pid = owner["pid"]
    if process_start_ticks(pid) != owner.get("start_ticks") or not pid_alive(pid):
        return False
    if pid == os.getpid():
        with _IN_FLIGHT_LOCK:
            return key in _IN_FLIGHT
    return True


def default_storage(state_dir: Path) -> str:
    return f"sqlite:///{(state_dir / 'optuna.db').resolve()}"


def study_exists(url: str, name: str) -> bool:
    """Whether the storage holds the study, creating nothing (a SQLite file that is not there is no study)."""
    if url.startswith("sqlite:"):
        path = url.split(":///", 1)[-1]
        if not path or path == ":memory:" or not os.path.lexists(path):
            return False
        _check_sqlite(url)  # a damaged store is named as such, never as "no study yet"
    try:
        names = optuna.study.get_all_study_names(storage=open_storage(url))
    except Exception as exc:  # noqa: BLE001 - an unreachable or foreign database holds no study of ours
        log.debug("cannot list the studies of the storage: %s", exc)
        return False
    return name in names


def _check_sqlite(url: str, *, new_ok: bool = False) -> None:
    """A StateError for a damaged SQLite store or a read-only state dir (tuner.coord.sqlite). `new_ok`: an
    empty file is a store about to be made (the study's opener checked it before making it)."""
    from tuner.coord.sqlite import check_store, read_only_problem
    from tuner.errors import StateError

    check_store(url, new_ok=new_ok)
    problem = read_only_problem(url)
    if problem:
        raise StateError(problem)


def open_storage(url: str, *, heartbeat_s: int | None = None, lease_s: int | None = None
                 ) -> optuna.storages.RDBStorage:
    """The study's storage. Opening it creates its tables when the database is new: on SQLite one process
    at a time (tuner.coord.sqlite.init_lock); elsewhere a process that loses the race to create them retries.

    With `heartbeat_s`, running trials carry Optuna's heartbeat and a trial not beaten for `lease_s` is stale
    (see tuner.coord.lease). Off SQLite, pooled connections are checked before use (a restarted server).
    `memory:` is a new in-process store that lives as long as the study object (experiments, tests)."""
    if url == "memory:":
        return optuna.storages.InMemoryStorage()  # type: ignore[return-value]
    beat: dict[str, Any] = {}
    if heartbeat_s is not None:
        beat = {"heartbeat_interval": int(heartbeat_s), "grace_period": int(lease_s or 2 * heartbeat_s)}
    if url.startswith("sqlite:"):
        from tuner.coord.sqlite import init_lock, tune_engine

        _check_sqlite(url, new_ok=True)
        with init_lock(url):
            storage = optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 30}}, **beat)
        tune_engine(storage.engine)
        return storage
    for attempt in range(3):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True}, **beat)
        except Exception as exc:  # noqa: BLE001 - re-raised unless another process was creating the tables
            text = str(exc).lower()
            if attempt == 2 or ("already exists" not in text and "duplicate key" not in text):
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


class SearchExhausted(TunerError):
    """Every configuration the sampler proposes ran already and no configuration that did not can be found:
    another trial would spend one twice, so the cycle ends."""


class DatabaseUnreachable(TunerError):
    """The study's database did not answer for DB_RETRY_S: said in one line, never as a traceback."""


class LeaseLost(TunerError):
    """The trial was failed by another process (its lease expired) before its owner told it."""


# a database error that a retry may get past: the server restarting, a dropped connection
# (Optuna wraps a failed commit's error in StorageInternalError: the chain is searched)
def _transient(exc: BaseException) -> bool:
    from sqlalchemy.exc import DBAPIError, OperationalError

    if isinstance(exc, DatabaseUnreachable):
        return False  # an inner retry gave up already
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, OperationalError):
            return True
        if isinstance(seen, DBAPIError) and getattr(seen, "connection_invalidated", False):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _last_line(exc: BaseException) -> str:
    """The driver's own words (the innermost error's first line): `connection refused`, not SQLAlchemy's
    wrapping of it."""
    inner = exc
    for _ in range(8):
        inner = inner.__cause__ or inner.__context__ or inner
    lines = str(inner).strip().splitlines()
    return f"{type(inner).__name__}: {lines[0] if lines else ''}"


def with_db_retry(what: str, fn: Callable[[], T], *, deadline_s: float = DB_RETRY_S) -> T:
    """Run `fn`, retrying while the database is unreachable (up to `deadline_s`), then raise."""
    t_end = time.monotonic() + deadline_s
    delay = 0.2
    while True:
        try:
            return fn()
        except Exception as exc:
            from tuner.base.files import state_fault

            if state_fault(exc, ".") is not None:  # a full or read-only disk does not heal by waiting: at once
                raise
            if not _transient(exc):
                raise
            if time.monotonic() + delay > t_end:
                raise DatabaseUnreachable(f"{what}: the study's database did not answer for {deadline_s:.0f} s "
                                          f"({redact_text(_last_line(exc))})") from exc
            log.warning("%s: database unreachable (%s); retrying in %.1f s", what, type(exc).__name__, delay)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


class TunerStudy:
    """Wraps an Optuna study for one agent (thread-safe enough for parallel workers: one storage)."""

    def __init__(self, spec: AgentSpec, space: SearchSpace, *, storage_url: str,
                 study_name: str | None = None) -> None:
        self.spec = spec
        self.space = space
        self.storage_url = storage_url
        self.name = study_name or spec.name
        self._ask_lock = threading.Lock()
        self.screener: Any = None  # tuner.study.screen.Screener, set once the workload is sized (run_cycle)
        # where configurations fail (tuner.search.feasibility), learned from this study's trials: the default
        # sampler skips a proposal it expects to fail
        self.failure_model: Any = None
        if spec.sampler.name == "auto":
            from tuner.search.feasibility import FailureModel

            self.failure_model = FailureModel(space, seed=spec.sampler.seed or 0)
        directions = [o.direction for o in spec.objectives]
        from tuner.coord.sqlite import sqlite_path

        db = sqlite_path(storage_url)
        if db is not None:
            _check_sqlite(storage_url)  # before an empty file is made: an emptied store is damage, not new
        if db is not None and db.parent.is_dir():
            from tuner.base.files import private_file

            private_file(db)  # 0600 before SQLite creates it (an empty file is a new database to SQLite)
        try:
            self.storage = open_storage(storage_url, heartbeat_s=spec.lease.heartbeat_s, lease_s=spec.lease.timeout_s)
            self.study = with_db_retry("open the study", lambda: optuna.create_study(
                storage=self.storage, sampler=make_sampler(spec.sampler, space), study_name=self.name,
                directions=directions, load_if_exists=True,
            ), deadline_s=10)
        except DatabaseUnreachable as exc:  # named with the storage, as every other fault of opening it
            raise ConfigError(f"cannot open the Optuna storage {redact_url(storage_url)!r}: {exc}",
                              field="storage") from None
        except TunerError:  # a damaged store, a read-only or full state dir: said as it is
            raise
        except Exception as exc:  # noqa: BLE001 - bad URL, missing driver, unreachable database
            hint = ""
            if storage_url.startswith("postgresql") and "import" in str(exc):
                hint = " (install the driver: pip install 'tuner[postgres]', and use postgresql+psycopg://...)"
            msg = redact_text(str(exc).replace(storage_url, redact_url(storage_url)))
            raise ConfigError(f"cannot open the Optuna storage {redact_url(storage_url)!r}: {msg}{hint}",
                              field="storage") from None
        # A new session continues the study: re-seed the sampler past the trials already run, or a seeded
        # sampler would propose the same start-up configurations again in every cycle.
        n_done = len(self.study.get_trials(deepcopy=False))
        if n_done and spec.sampler.seed is not None:
            self.study.sampler = make_sampler(
                spec.sampler.model_copy(update={"seed": spec.sampler.seed + n_done}), space)
        if list(self.study.directions) != [optuna.study.StudyDirection[d.upper()] for d in directions]:
            raise ConfigError(
                f"study {self.name!r} in {redact_url(storage_url)} has other objective directions; "
                "use another storage or study name", field="objectives")

    # ------------------------------------------------------------ lifecycle
    @property
    def heartbeat(self) -> Heartbeat:
        """The heartbeat of this process's trials in this study's storage (one per storage URL)."""
        return _heartbeat_for(self.storage_url, self.storage, self.spec.lease.heartbeat_s)

    @contextlib.contextmanager
    def lock(self, purpose: str, *, timeout_s: float = 120.0) -> Iterator[None]:
        """A lock of this study shared by every process of the fleet (tuner.coord.dblock)."""
        engine = getattr(self.storage, "engine", None)  # None: an in-process store, one process
        with study_lock(engine, f"tuner:{self.name}:{purpose}", timeout_s=timeout_s):
            yield

    def reap_stale(self) -> list[int]:
        """Tell FAIL every trial whose process went away, on any host.

        A trial whose lease expired (no heartbeat for lease.timeout_s, whatever host it ran on) gets cause
        `worker_lost`; a trial of this host whose owner is dead (or was never recorded) `interrupted`, at
        once. A live owner's trial with a fresh lease is running: `tuner promote` or `tuner status` next to a
        working daemon or worker must not fail its trials.
        """
        storage = self.study._storage

        def stale_ids() -> set[int]:
            # Optuna's own query (what optuna.storages.fail_stale_trials uses): RUNNING trials whose last
            # heartbeat, by the database's clock, is older than the grace period; here the cause is ours
            if not isinstance(self.storage, optuna.storages.RDBStorage):
                return set()  # an in-process store: no other process, no lease
            return set(self.storage._get_stale_trial_ids(self.study._study_id))

        expired = with_db_retry("read the trials' leases", stale_ids)
        reaped = []
        now = datetime.datetime.now()
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            owner = t.system_attrs.get(OWNER_ATTR)
            if t._trial_id in expired:
                cause = "worker_lost"
            elif owner is None and t.datetime_start is not None:
                # asked a moment ago, its owner not recorded yet (or never: the asker died or lost the
                # database in between): lost once a lease has passed since it started; on SQLite, at once
                # when no asker is between its two steps (the ask lock) and it still has no owner
                if (now - t.datetime_start).total_seconds() > self.spec.lease.timeout_s:
                    cause = "worker_lost"
                elif self.storage_url.startswith("sqlite") and self._orphaned(t._trial_id):
                    cause = "interrupted"
                else:
                    continue
            elif _owner_may_live(owner, (self.storage_url, t._trial_id)):
                continue
            else:
                cause = "interrupted"
            with self.lock("tell"):  # its owner may be telling it right now
                if storage.get_trial(t._trial_id).state != TrialState.RUNNING:
                    continue
                storage.set_trial_user_attr(t._trial_id, "cause", cause)
                storage.set_trial_user_attr(t._trial_id, "feasible", False)
                self.study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
            who = owner if isinstance(owner, dict) else {}
            log.warning("trial %d failed (%s): its process %s on %s went away", t.number, cause,
                        who.get("pid", "?"), who.get("host", "?"))
            reaped.append(t.number)
        return reaped

    def _orphaned(self, trial_id: int) -> bool:
        """Whether a RUNNING trial has no owner while no process of this (SQLite) study is asking."""
        try:
            with self.lock("ask", timeout_s=10.0):
                t = self.study._storage.get_trial(trial_id)
                return t.state == TrialState.RUNNING and t.system_attrs.get(OWNER_ATTR) is None
        except LockTimeout:
            return False

    def ensure_baseline(self) -> None:
        """Enqueue the baseline (all defaults) unless it already ran or waits, then the agent's candidates (known
        profiles), each once: once for the whole fleet, under one lock and one read of the trials."""
        with self.lock("baseline"):
            trials = self.study.get_trials(deepcopy=False)
            if not any(t.user_attrs.get("baseline") and t.state in (TrialState.COMPLETE, TrialState.WAITING,
                                                                    TrialState.RUNNING) for t in trials):
                self.study.enqueue_trial(self.space.defaults(), user_attrs={"baseline": True})
                trials = self.study.get_trials(deepcopy=False)
            queued = self._queue_candidates(trials)
        if queued:
            log.info("candidates queued after the baseline: %s", ", ".join(queued))

    def _queue_candidates(self, trials: list[FrozenTrial]) -> list[str]:
        """Enqueue each candidate not yet tried: not again once it ran (or failed for a cause of its own), waits
        or runs, and not when a trial of the study already has its configuration. The names enqueued now."""
        kept = [t for t in trials if not (t.state == TrialState.FAIL and t.user_attrs.get("cause") in LOST_CAUSES)]
        names = {t.user_attrs.get("candidate") for t in kept}
        configs = [t.params or t.system_attrs.get("fixed_params") for t in kept]
        queued: list[str] = []
        for cand in self.spec.candidates:
            params, problems = self.space.point(cand.params)
            if problems or cand.name in names or params in configs:
                continue  # the loader refused bad ones; this one ran, waits, or is another trial's
            self.study.enqueue_trial(params, user_attrs={"candidate": cand.name}, skip_if_exists=False)
            configs.append(params)
            queued.append(cand.name)
        return queued

    def counted(self) -> int:
        """Trials that count against a fleet's budget: running or told, except those whose process went away."""
        n = 0
        for t in self.study.get_trials(deepcopy=False):
            if t.state == TrialState.WAITING:
                continue
            if t.state == TrialState.FAIL and t.user_attrs.get("cause") in LOST_CAUSES:
                continue
            if not_budget(t):
                continue  # never deployed, or a repeat of an earlier trial's configuration
            n += 1
        return n

    # ------------------------------------------------------------ ask / tell
    def ask(self) -> tuple[Trial, dict[str, Any]]:
        """A new trial and its sampled active parameters (define-by-run, conditions applied).

        A proposal that breaks a declared constraint or the target's resources (SearchSpace.violations) is told
        as a rejected trial (COMPLETE, infeasible at the failure tier of tuner.study.objectives, user attribute
        `rejected`: the sampler learns from it; nothing is deployed and the loop's budget is not charged) and the
        sampler is asked again, up to `sampler.resample_violations` times (after that it is spent as an
        infeasible trial). A proposal whose configuration an earlier trial already ran is never a second budget
        trial: while that configuration has fewer than `max_repeats()` repeats it is returned as a repeat (user
        attribute `repeat_of`: the loop measures it as a noise sample of the earlier trial, no budget trial);
        after that it is told at once with the earlier trial's result (`duplicate_of`, never deployed) and the
        sampler is asked again; after DUPLICATE_LIMIT such answers in a row a configuration no trial ran is
        drawn from the space's design instead. A configuration another worker (or thread) runs now is treated
        alike: a repeat of that trial while it has fewer than `max_repeats()`, else set aside (told FAIL as a
        copy, `duplicate_of`) and the sampler asked again. With a screener (`sampler.screen`, tuner.study.screen), a
        proposal the simulator predicts far outside the SLOs or far worse than the best is told as screened (the
        prediction, infeasible, `screened`; never deployed, no budget trial), up to `max_per_trial` times. An
        enqueued trial (the baseline, `tuner` A/B points) is returned as it is.

        A trial this asked whose ask then failed (the database went away mid-ask: the caller retries, asking
        a new one) is released: no more heartbeats, failed as `interrupted` when the database answers (else
        by the next reaper), so it never holds a slot of the budget while its owner lives.
        """
        held: list[Trial] = []
        try:
            return self._ask(held)
        except BaseException:
            if held:
                self._abandon(held[-1])
            raise

    def _ask(self, held: list[Trial]) -> tuple[Trial, dict[str, Any]]:
        limit = self.resample_limit()
        screen = self.spec.sampler.screen
        rejected = screened = duplicates = predicted = 0
        while True:
            trial, chosen = self._ask_once(held)
            if self._enqueued(trial) and not trial.user_attrs.get("unseen"):
                return trial, chosen
            bad = self.space.violations(chosen)
            if bad:
                if rejected >= limit and (limit == 0 or not self._enqueue_unseen()):
                    return trial, chosen  # spent as an infeasible trial
                rejected += 1
                self._reject(trial, chosen, bad)
                continue
            earlier = self.same_config(self.space.full_config(chosen), told=True)
            # or another worker (or thread) runs it now: a second budget trial of it would be waste
            running = None if earlier is not None else self._running_with(self.space.full_config(chosen), trial)
            if earlier is not None or running is not None:
                of = earlier or running
                assert of is not None
                measured = running is not None or (_ran(of) and bool(of.values) and "cause" not in of.user_attrs
                                                   and of.state == TrialState.COMPLETE)
                if measured and self.repeats_of(of) < self.max_repeats():
                    trial.set_user_attr("repeat_of", of.number)
                    log.info("proposal %d is trial %d's configuration again%s: measured as its repeat",
                             trial.number, of.number, " (running now)" if running is not None else "")
                    return trial, chosen
                duplicates += 1
                if earlier is not None:
                    self._duplicate(trial, earlier)
                else:
                    self._set_aside(trial, of)
                if duplicates >= DUPLICATE_LIMIT and not self._enqueue_unseen():
                    raise SearchExhausted(f"study {self.name!r}: every configuration the sampler proposes ran "
                                          "already and the space's design finds none that did not")
                continue
            if self.failure_model is not None and predicted < MAX_PREDICTED_FAILURES:
                p_fail = self._predicts_failure(self.space.full_config(chosen))
                if p_fail is not None:
                    predicted += 1
                    self._predicted_failure(trial, chosen, p_fail)
                    continue
            if self.screener is None or screen is None or screened >= screen.max_per_trial:
                return trial, chosen
            verdict = self.screener.judge(self.space.full_config(chosen), self._incumbent())
            if verdict is None:
                return trial, chosen
            screened += 1
            self._screen(trial, chosen, verdict)

    def _predicts_failure(self, config: Mapping[str, Any]) -> float | None:
        """The failure model's probability that `config` fails, when it is high enough to skip it."""
        assert self.failure_model is not None
        ran = [t for t in self.trials() if t.state == TrialState.COMPLETE and _ran(t)
               and t.user_attrs.get("cause") not in LOST_CAUSES]
        self.failure_model.fit([t.user_attrs["config"] for t in ran], ["cause" in t.user_attrs for t in ran])
        return self.failure_model.rejects(config)

    def _predicted_failure(self, trial: Trial, chosen: Mapping[str, Any], p_fail: float) -> None:
        """Tell a proposal the failure model expects to fail: at the failure tier, never deployed, no budget."""
        ev = failed_evaluation(self.spec, "predicted_failure")
        attrs = {"screened": True, "cause": "predicted_failure", "config": self.space.full_config(chosen),
                 "error": f"predicted to fail (p = {p_fail:.2f}) by the classifier of the study's failed trials"}
        log.info("proposal %d skipped: predicted to fail (p = %.2f)", trial.number, p_fail)
        self.tell(trial, Evaluation(values=ev.values, constraints={**ev.constraints, "feasibility:predicted": 1.0}),
                  attrs=attrs)

    def resample_limit(self) -> int:
        """How many constraint-breaking proposals a trial may reject before one is spent."""
        from tuner.search.samplers import default_resample

        n = self.spec.sampler.resample_violations
        return default_resample(self.spec.sampler) if n is None else n

    def max_repeats(self) -> int:
        """How many times a re-proposed configuration is measured again (as noise samples) before a
        re-proposal is answered from what was measured."""
        return max(1, self.spec.noise.repeats)

    def same_config(self, config: Mapping[str, Any], *, told: bool = False) -> FrozenTrial | None:
        """The first earlier trial (finished, measured or failed) that ran exactly `config`, or None; with
        `told`, also one that was only told (rejected, screened: a prediction)."""
        for t in self.trials():
            if t.state not in (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED) or "config" not in t.user_attrs:
                continue
            if not told and not _ran(t):
                continue
            if t.user_attrs.get("cause") in LOST_CAUSES:
                continue
            if t.user_attrs.get("config") == _jsonable(dict(config)):
                return t
        return None

    def repeats_of(self, t: FrozenTrial) -> int:
        """Repeat trials (`repeat_of`) of trial `t`, finished or running."""
        return sum(1 for r in self.trials() if r.user_attrs.get("repeat_of") == t.number
                   and r.state in (TrialState.COMPLETE, TrialState.RUNNING))

    def _duplicate(self, trial: Trial, earlier: FrozenTrial) -> None:
        """Tell `trial` with `earlier`'s result: its configuration ran already (never deployed, no budget)."""
        values = list(earlier.values) if earlier.values else [pessimistic(o) for o in self.spec.objectives]
        ev = Evaluation(values=values, constraints=dict(earlier.constraints) or
                        failed_evaluation(self.spec, earlier.user_attrs.get("cause")).constraints)
        attrs = {"duplicate_of": earlier.number, "cause": "duplicate", "config": earlier.user_attrs.get("config"),
                 "error": f"trial {earlier.number} had this configuration already"}
        self.tell(trial, ev, attrs=attrs)

    def _running_with(self, config: Mapping[str, Any], trial: Trial) -> FrozenTrial | None:
        """A running trial other than `trial` (another worker's, or another thread's) whose configuration is
        `config`, not a repeat itself; None when none runs it."""
        want = _jsonable(dict(config))
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if t.number == trial.number or t.user_attrs.get("repeat_of") is not None:
                continue
            if _jsonable(self.space.full_config(t.params)) == want:
                return t
        return None

    def _set_aside(self, trial: Trial, running: FrozenTrial) -> None:
        """Tell `trial` FAIL as a copy of `running` (its configuration runs now, with its repeats: there is
        no result to answer it with yet; never deployed, no budget trial; a failed trial teaches the sampler
        nothing, so it is asked again)."""
        def go() -> None:
            with self.lock("tell"):
                storage = self.study._storage
                for key, value in {"duplicate_of": running.number, "cause": "duplicate", "feasible": False,
                                   "config": self.space.full_config(trial.params),
                                   "error": f"trial {running.number} runs this configuration now"}.items():
                    storage.set_trial_user_attr(trial._trial_id, key, _jsonable(value))
                self.study.tell(trial, state=TrialState.FAIL)

        try:
            with_db_retry(f"tell trial {trial.number}", go)
        finally:
            self._told(trial)

    def _enqueue_unseen(self) -> bool:
        """Queue the first configuration of the space's design (around the defaults) that no trial ran and
        that breaks nothing; False when none is found."""
        from tuner.search.design import SpaceDesign

        design = SpaceDesign(self.space, seed=len(self.trials()), around_defaults=True)
        for i in range(200):
            try:
                cfg = design.config(i)
            except ValueError:
                return False
            if self._seen(self.space.full_config(cfg)):
                continue
            self.study.enqueue_trial(cfg, user_attrs={"unseen": True}, skip_if_exists=False)
            return True
        return False

    def _seen(self, config: Mapping[str, Any]) -> bool:
        """Whether any trial (run, rejected, screened or waiting) holds `config`."""
        want = _jsonable(dict(config))
        for t in self.trials():
            if t.user_attrs.get("config") == want:
                return True
            if t.state == TrialState.WAITING and self.space.full_config(t.params) == want:
                return True
        return False

    def _incumbent(self) -> float | None:
        best = self.best() if len(self.spec.objectives) == 1 else []
        return best[0].values[0] if best else None

    def _screen(self, trial: Trial, chosen: Mapping[str, Any], verdict: Any) -> None:
        attrs = {"screened": True, "cause": "screened", "config": self.space.full_config(chosen),
                 "error": f"screened by the simulator: {verdict.reason}",
                 "predicted": {k: round(v, 6) for k, v in verdict.predicted.items()}}
        log.info("proposal %d screened out: %s", trial.number, verdict.reason)
        self.tell(trial, verdict.evaluation, attrs=attrs)

    def _enqueued(self, trial: Trial) -> bool:
        return "fixed_params" in self.study._storage.get_trial(trial._trial_id).system_attrs

    def _reject(self, trial: Trial, chosen: Mapping[str, Any], bad: list[str]) -> None:
        """Tell a proposal never deployed: it ranks with the trials that produced no measurement (the failure
        tier, cause `constraint`), plus 1 per broken constraint, below every measured SLO miss."""
        ev = failed_evaluation(self.spec, "constraint")
        constraints = {**ev.constraints, **{f"space:{c}": 1.0 for c in bad}}
        attrs = {"rejected": True, "cause": "constraint", "config": self.space.full_config(chosen),
                 "error": f"violates constraint(s): {'; '.join(bad)}"}
        self.tell(trial, Evaluation(values=ev.values, constraints=constraints), attrs=attrs)

    def _owning_lock(self) -> contextlib.AbstractContextManager[None]:
        """On a SQLite study (one host), the lock under which a trial is asked and its owner recorded: a reaper
        that holds it sees no trial mid-ask, so an owner-less RUNNING trial is one whose asker died in between
        (a SIGKILL there left it RUNNING until its lease ran out). A shared database keeps the lease for that:
        another host's asker may be between its two steps."""
        if self.storage_url.startswith("sqlite"):
            return self.lock("ask")
        return contextlib.nullcontext()

    def _ask_once(self, held: list[Trial]) -> tuple[Trial, dict[str, Any]]:
        """A new trial (appended to `held` as soon as it exists) and its sampled active parameters."""
        # two threads asking at once on SQLite can both pop the same queued trial: _ask_lock
        with self._ask_lock, self._owning_lock():
            trial = with_db_retry("ask a trial", self.study.ask)
            held.append(trial)
            with _IN_FLIGHT_LOCK:
                _IN_FLIGHT.add((self.storage_url, trial._trial_id))
            owner = _this_process()
            with_db_retry("record the trial's owner", lambda: (
                self.study._storage.set_trial_system_attr(trial._trial_id, OWNER_ATTR, owner),
                self.study._storage.set_trial_user_attr(trial._trial_id, "host", owner["host"]),
                self.study._storage.set_trial_user_attr(trial._trial_id, "pid", owner["pid"])))
        self.heartbeat.add(trial._trial_id)
        chosen: dict[str, Any] = {}
        for p in self.space.params:
            if not self.space.active(p, chosen):
                continue
            s = p.spec
            if s.type == "int":
                assert s.low is not None and s.high is not None
                v: Any = trial.suggest_int(p.name, int(s.low), int(s.high), step=int(s.step or 1), log=s.log)
            elif s.type == "float":
                assert s.low is not None and s.high is not None
                v = trial.suggest_float(p.name, float(s.low), float(s.high), step=s.step, log=s.log)
            elif s.type == "bool":
                v = trial.suggest_categorical(p.name, [False, True])
            else:
                assert s.choices is not None
                v = trial.suggest_categorical(p.name, list(s.choices))
            chosen[p.name] = v
        return trial, chosen

    def tell(self, trial: Trial, ev: Evaluation, *, attrs: Mapping[str, Any],
             pruned_at: int | None = None) -> FrozenTrial:
        """Record the measurement. Raises LeaseLost when another process failed the trial meanwhile.

        `pruned_at`: the trial was stopped early after that many completed requests (tuner.measure.early_stop):
        it is told PRUNED, never feasible, with its partial measurement's constraints; a single-objective study
        gets the partial value as the intermediate value at that step (Optuna's trial.report), which Optuna
        makes the pruned trial's value."""
        def go() -> FrozenTrial:
            with self.lock("tell"):
                self._check_running(trial)
                for key, value in ev.constraints.items():
                    trial.set_constraint(key, float(value))
                for key, value in attrs.items():
                    trial.set_user_attr(key, _jsonable(value))
                trial.set_user_attr("feasible", ev.feasible and pruned_at is None)
                if pruned_at is None:
                    return self.study.tell(trial, ev.values)
                if len(self.study.directions) == 1 and math.isfinite(ev.values[0]):
                    trial.report(ev.values[0], pruned_at)
                return self.study.tell(trial, state=TrialState.PRUNED)

        try:
            return with_db_retry(f"tell trial {trial.number}", go)
        finally:
            self._told(trial)

    def tell_interrupted(self, trial: Trial, reason: str = "interrupted", *, error: str | None = None) -> None:
        """Tell `trial` FAIL with cause `reason` (and `error`), unless it is no longer running."""
        def go() -> None:
            with self.lock("tell"):
                if self.study._storage.get_trial(trial._trial_id).state != TrialState.RUNNING:
                    return  # already failed by a reaper
                trial.set_user_attr("cause", reason)
                if error is not None:
                    trial.set_user_attr("error", error[:2000])
                trial.set_user_attr("feasible", False)
                self.study.tell(trial, state=TrialState.FAIL)

        try:
            with_db_retry(f"tell trial {trial.number}", go)
        finally:
            self._told(trial)

    def _check_running(self, trial: Trial) -> None:
        t = self.study._storage.get_trial(trial._trial_id)
        if t.state != TrialState.RUNNING:
            raise LeaseLost(f"trial {trial.number} was failed by another process "
                            f"(cause {t.user_attrs.get('cause')!r}) before it was told: its lease expired")

    def _abandon(self, trial: Trial) -> None:
        """Release a trial whose ask failed: stop beating it and fail it (`interrupted`, a lost trial: its slot
        is redone) if it is still running. One try: with the database down the reaper fails it later (this
        host's reaper at once, as it is no longer in flight here; another host's when its lease runs out)."""
        self._told(trial)
        try:
            with self.lock("tell", timeout_s=10.0):
                storage = self.study._storage
                t = storage.get_trial(trial._trial_id)
                if t.state != TrialState.RUNNING:
                    return
                storage.set_trial_user_attr(trial._trial_id, "cause", "interrupted")
                storage.set_trial_user_attr(trial._trial_id, "feasible", False)
                self.study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
                fixed = t.system_attrs.get("fixed_params")
                if isinstance(fixed, dict):  # an enqueued trial (the baseline): queued again, for the next ask
                    self.study.enqueue_trial(fixed, user_attrs={k: v for k, v in t.user_attrs.items()
                                                                if k not in ("host", "pid")}, skip_if_exists=False)
            log.warning("trial %d failed (interrupted): its ask did not complete", trial.number)
        except Exception as exc:  # noqa: BLE001 - the database may be down: a reaper fails it later
            log.warning("trial %d: its ask did not complete and it cannot be failed now (%s); a reaper fails "
                        "it", trial.number, type(exc).__name__)

    def _told(self, trial: Trial) -> None:
        self.heartbeat.remove(trial._trial_id)
        with _IN_FLIGHT_LOCK:
            _IN_FLIGHT.discard((self.storage_url, trial._trial_id))

    # ------------------------------------------------------------ queries
    def trials(self) -> list[FrozenTrial]:
        return self.study.get_trials(deepcopy=False)

    def counts(self) -> dict[str, int]:
        c = Counter(t.state.name for t in self.trials())
        done = [t for t in self.trials() if t.state == TrialState.COMPLETE]
        out = {state.name: c.get(state.name, 0) for state in TrialState}
        copies = [t for t in done if t.user_attrs.get("repeat_of") is not None
                  or t.user_attrs.get("duplicate_of") is not None]
        done = [t for t in done if t not in copies]
        out["FEASIBLE"] = sum(1 for t in done if t.user_attrs.get("feasible"))
        out["REJECTED"] = sum(1 for t in done if t.user_attrs.get("rejected"))  # never deployed, no budget
        out["SCREENED"] = sum(1 for t in done if t.user_attrs.get("screened"))  # predicted only, no budget
        out["REPEATS"] = len(copies)  # a configuration proposed again: a noise sample or a copy, no budget
        out["INFEASIBLE"] = len(done) - out["FEASIBLE"] - out["REJECTED"] - out["SCREENED"]
        return out

    def baseline(self) -> FrozenTrial | None:
        for t in self.trials():
            if t.user_attrs.get("baseline") and t.state == TrialState.COMPLETE:
                return t
        return None

    def best(self) -> list[FrozenTrial]:
        """Best feasible trial(s): one for a single objective, the Pareto front for several.

        A single objective ranks a configuration by the mean of its measurements (the trial's own, its
        `repeats` and the trials that repeated it); with noise repeats on and a noise estimate, by the lower
        confidence bound (tuner.search.noise): a trial measured once is not preferred to a repeated one on a
        lucky run. A repeat trial is never the best itself: the trial it repeats stands for the configuration.
        """
        feasible = [t for t in self.trials() if t.state == TrialState.COMPLETE and t.user_attrs.get("feasible")
                    and t.user_attrs.get("repeat_of") is None and t.user_attrs.get("duplicate_of") is None]
        if not feasible:
            return []
        if len(self.spec.objectives) == 1:
            sign = 1 if self.spec.objectives[0].direction == "maximize" else -1
            pooled = self.pooled()
            cv = self.noise_cv() if self.spec.noise.repeats else None
            if cv:
                from tuner.search.noise import lcb

                maximize = sign > 0
                conf = self.spec.noise.confidence
                return [max(feasible, key=lambda t: (sign * lcb(pooled[t.number], cv, conf, maximize=maximize),
                                                     -t.number))]
            return [max(feasible, key=lambda t: (sign * statistics.fmean(pooled[t.number]), -t.number))]
        return [t for t in self.study.best_trials if t.user_attrs.get("feasible")
                and t.user_attrs.get("repeat_of") is None]

    # ------------------------------------------------------------ noise
    def pooled(self) -> dict[int, list[float]]:
        """Each measured trial's first-objective measurements: its own (measurements()), then those of the
        trials that repeated its configuration (`repeat_of`); repeat trials are not keys."""
        trials = self.trials()
        out: dict[int, list[float]] = {t.number: measurements(t) for t in trials
                                       if t.state == TrialState.COMPLETE and t.user_attrs.get("repeat_of") is None}
        for t in trials:
            of = t.user_attrs.get("repeat_of")
            if of is not None and t.state == TrialState.COMPLETE and "cause" not in t.user_attrs and of in out:
                out[of] += measurements(t)
        return out

    def noise_cv(self) -> float | None:
        """The pooled run-to-run coefficient of variation of the first objective over configurations measured
        more than once (noise repeats, repeat trials)."""
        from tuner.search.noise import pooled_cv

        return pooled_cv([xs for xs in self.pooled().values() if len(xs) > 1])

    def estimate(self, t: FrozenTrial) -> Any:
        """The first objective of `t` over its measurements, with its interval (tuner.search.noise.Estimate)."""
        from tuner.search.noise import estimate

        xs = self.pooled().get(t.number) or measurements(t)
        return estimate(xs, self.noise_cv(), self.spec.noise.confidence)

    def noise_report(self) -> dict[str, Any] | None:
        """With one objective and noise repeats on or a configuration measured more than once: the noise CV,
        the best's and the baseline's mean and interval, whether the best's gain is within the noise (their
        intervals overlap), and whether the best changes any parameter of the baseline (`same_as_baseline`).
        None otherwise."""
        if len(self.spec.objectives) != 1:
            return None
        pooled = self.pooled()
        repeated = sum(1 for xs in pooled.values() if len(xs) > 1)
        if not self.spec.noise.repeats and not repeated:
            return None
        from tuner.search.noise import within_noise

        best, base = self.best(), self.baseline()
        out: dict[str, Any] = {"cv": self.noise_cv(), "confidence": self.spec.noise.confidence,
                               "repeated_trials": repeated}
        if best:
            e = self.estimate(best[0])
            out["best"] = {"number": best[0].number, "mean": e.mean, "n": e.n, "low": e.low, "high": e.high}
        if base is not None and base.values:
            b = self.estimate(base)
            out["baseline"] = {"number": base.number, "mean": b.mean, "n": b.n, "low": b.low, "high": b.high}
            if best and best[0].number != base.number:
                out["same_as_baseline"] = same_as_baseline(best[0], base)
                if out["cv"] is not None:
                    out["within_noise"] = out["same_as_baseline"] or within_noise(
                        e, b, maximize=self.spec.objectives[0].direction == "maximize")
        return out

    def trial(self, number: int) -> FrozenTrial:
        for t in self.trials():
            if t.number == number:
                return t
        raise ConfigError(f"study {self.name!r} has no trial {number}")


def same_as_baseline(t: FrozenTrial, base: FrozenTrial) -> bool:
    """Whether `t` ran the baseline's configuration (no parameter changed): its difference is noise."""
    config = t.user_attrs.get("config")
    return config is not None and config == base.user_attrs.get("config")


def measurements(t: FrozenTrial) -> list[float]:
    """The first objective's values of `t`: its trial value, then its repeats (finite ones)."""
    xs = [t.values[0]] if t.values else []
    xs += [float(v) for v in t.user_attrs.get("repeats") or [] if isinstance(v, int | float) and math.isfinite(v)]
    return xs


_HEARTBEATS: dict[str, Heartbeat] = {}
_HEARTBEATS_LOCK = threading.Lock()


def _heartbeat_for(url: str, storage: Any, heartbeat_s: int) -> Heartbeat:
    with _HEARTBEATS_LOCK:
        if url not in _HEARTBEATS:
            _HEARTBEATS[url] = Heartbeat(storage, heartbeat_s)
        return _HEARTBEATS[url]


def trial_summary(t: FrozenTrial | None) -> dict[str, Any] | None:
    if t is None:
        return None
    return {
        "number": t.number,
        "state": t.state.name,
        "params": dict(t.params),
        "values": list(t.values) if t.values is not None else None,
        "feasible": bool(t.user_attrs.get("feasible")),
        "cause": t.user_attrs.get("cause"),
        "metrics": t.user_attrs.get("metrics", {}),
    }


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    return v
