"""The Optuna study of an agent: sampler, storage, baseline, reaping, ask/tell with constraints.

Optuna's storage is the source of truth for trials. Trial user attributes written here:
`baseline` (bool), `feasible` (bool), `cause` (failure cause, absent when measured), `error` (message),
`metrics` (the measurement's numbers), `config` (what the target received), `label`, `gpus`.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import warnings
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from tuner.errors import ConfigError
from tuner.objectives import Evaluation, pessimistic
from tuner.search.samplers import make_sampler
from tuner.space import SearchSpace
from tuner.spec import AgentSpec

log = logging.getLogger(__name__)

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


# system attribute of a trial: the process that asked it (reap_stale spares the trials of live owners)
OWNER_ATTR = "tuner:owner"


def _this_process() -> dict[str, Any]:
    from tuner.proc import process_start_ticks

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
    from tuner.proc import pid_alive, process_start_ticks

    pid = owner["pid"]
    if process_start_ticks(pid) != owner.get("start_ticks") or not pid_alive(pid):
        return False
    if pid == os.getpid():
        with _IN_FLIGHT_LOCK:
            return key in _IN_FLIGHT
    return True


def default_storage(state_dir: Path) -> str:
    return f"sqlite:///{(state_dir / 'optuna.db').resolve()}"


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """The study's storage. Opening it creates its tables when the database is new: on SQLite one process
    at a time (tuner.sqlite.init_lock); elsewhere a process that loses the race to create them retries.
    `memory:` is a new in-process store that lives as long as the study object (experiments, tests)."""
    if url == "memory:":
        return optuna.storages.InMemoryStorage()
    if url.startswith("sqlite:"):
        from tuner.sqlite import init_lock, tune_engine

        with init_lock(url):
            storage = optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 30}})
        tune_engine(storage.engine)
        return storage
    for attempt in range(3):
        try:
            return optuna.storages.RDBStorage(url)
        except Exception as exc:  # noqa: BLE001 - re-raised unless another process was creating the tables
            text = str(exc).lower()
            if attempt == 2 or ("already exists" not in text and "duplicate key" not in text):
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


class TunerStudy:
    """Wraps an Optuna study for one agent (thread-safe enough for parallel workers: one storage)."""

    def __init__(self, spec: AgentSpec, space: SearchSpace, *, storage_url: str,
                 study_name: str | None = None) -> None:
        self.spec = spec
        self.space = space
        self.storage_url = storage_url
        self.name = study_name or spec.name
        self._ask_lock = threading.Lock()
        directions = [o.direction for o in spec.objectives]
        try:
            self.study = optuna.create_study(
                storage=open_storage(storage_url), sampler=make_sampler(spec.sampler, space), study_name=self.name,
                directions=directions, load_if_exists=True,
            )
        except Exception as exc:  # noqa: BLE001 - bad URL, missing driver, unreachable database
            hint = ""
            if storage_url.startswith("postgresql") and "import" in str(exc):
                hint = " (install the driver: pip install 'tuner[postgres]', and use postgresql+psycopg://...)"
            from tuner.tracking import safe_url

            msg = str(exc).replace(storage_url, safe_url(storage_url))
            raise ConfigError(f"cannot open the Optuna storage {safe_url(storage_url)!r}: {msg}{hint}",
                              field="storage") from None
        # A new session continues the study: re-seed the sampler past the trials already run, or a seeded
        # sampler would propose the same start-up configurations again in every cycle.
        n_done = len(self.study.get_trials(deepcopy=False))
        if n_done and spec.sampler.seed is not None:
            self.study.sampler = make_sampler(
                spec.sampler.model_copy(update={"seed": spec.sampler.seed + n_done}), space)
        if list(self.study.directions) != [optuna.study.StudyDirection[d.upper()] for d in directions]:
            raise ConfigError(
                f"study {self.name!r} in {storage_url} has other objective directions; "
                "use another storage or study name", field="objectives")

    # ------------------------------------------------------------ lifecycle
    def reap_stale(self) -> list[int]:
        """Tell FAIL (reason "interrupted") every trial left RUNNING by a killed process.

        A trial whose owner (recorded at ask) is a live process, or a process of another host, is running:
        `tuner promote` or `tuner status` next to a working daemon must not fail its trials.
        """
        reaped = []
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if _owner_may_live(t.system_attrs.get(OWNER_ATTR), (self.storage_url, t._trial_id)):
                continue
            self.study._storage.set_trial_user_attr(t._trial_id, "cause", "interrupted")
            self.study._storage.set_trial_user_attr(t._trial_id, "feasible", False)
            self.study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
            reaped.append(t.number)
        if reaped:
            log.warning("reaped %d trial(s) left RUNNING by an earlier process: %s", len(reaped), reaped)
        return reaped

    def ensure_baseline(self) -> None:
        """Enqueue the baseline (all defaults) unless it already ran or waits."""
        for t in self.study.get_trials(deepcopy=False):
            if t.user_attrs.get("baseline") and t.state in (TrialState.COMPLETE, TrialState.WAITING,
                                                             TrialState.RUNNING):
                return
        self.study.enqueue_trial(self.space.defaults(), user_attrs={"baseline": True})

    # ------------------------------------------------------------ ask / tell
    def ask(self) -> tuple[Trial, dict[str, Any]]:
        """A new trial and its sampled active parameters (define-by-run, conditions applied).

        With `sampler.resample_violations` > 0, a proposal that breaks a declared constraint is told as a
        rejected trial (COMPLETE, infeasible, user attribute `rejected`: the sampler learns from it; nothing is
        deployed and the loop's budget is not charged) and the sampler is asked again, up to that many times.
        An enqueued trial (the baseline, `tuner` A/B points) is returned as it is.
        """
        limit = self.spec.sampler.resample_violations
        for _ in range(limit):
            trial, chosen = self._ask_once()
            bad = self.space.violations(chosen)
            if not bad or self._enqueued(trial):
                return trial, chosen
            self._reject(trial, chosen, bad)
        return self._ask_once()

    def _enqueued(self, trial: Trial) -> bool:
        return "fixed_params" in self.study._storage.get_trial(trial._trial_id).system_attrs

    def _reject(self, trial: Trial, chosen: Mapping[str, Any], bad: list[str]) -> None:
        values = [pessimistic(o) for o in self.spec.objectives]
        constraints = {f"space:{c}": 1.0 for c in bad}
        attrs = {"rejected": True, "cause": "constraint", "config": self.space.full_config(chosen),
                 "error": f"violates constraint(s): {'; '.join(bad)}"}
        self.tell(trial, Evaluation(values=values, constraints=constraints), attrs=attrs)

    def _ask_once(self) -> tuple[Trial, dict[str, Any]]:
        with self._ask_lock:  # two threads asking at once on SQLite can both pop the same queued trial
            trial = self.study.ask()
        with _IN_FLIGHT_LOCK:
            _IN_FLIGHT.add((self.storage_url, trial._trial_id))
        self.study._storage.set_trial_system_attr(trial._trial_id, OWNER_ATTR, _this_process())
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

    def tell(self, trial: Trial, ev: Evaluation, *, attrs: Mapping[str, Any]) -> FrozenTrial:
        for key, value in ev.constraints.items():
            trial.set_constraint(key, float(value))
        for key, value in attrs.items():
            trial.set_user_attr(key, _jsonable(value))
        trial.set_user_attr("feasible", ev.feasible)
        try:
            return self.study.tell(trial, ev.values)
        finally:
            self._told(trial)

    def tell_interrupted(self, trial: Trial, reason: str = "interrupted") -> None:
        trial.set_user_attr("cause", reason)
        trial.set_user_attr("feasible", False)
        try:
            self.study.tell(trial, state=TrialState.FAIL)
        finally:
            self._told(trial)

    def _told(self, trial: Trial) -> None:
        with _IN_FLIGHT_LOCK:
            _IN_FLIGHT.discard((self.storage_url, trial._trial_id))

    # ------------------------------------------------------------ queries
    def trials(self) -> list[FrozenTrial]:
        return self.study.get_trials(deepcopy=False)

    def counts(self) -> dict[str, int]:
        c = Counter(t.state.name for t in self.trials())
        done = [t for t in self.trials() if t.state == TrialState.COMPLETE]
        out = {state.name: c.get(state.name, 0) for state in TrialState}
        out["FEASIBLE"] = sum(1 for t in done if t.user_attrs.get("feasible"))
        out["REJECTED"] = sum(1 for t in done if t.user_attrs.get("rejected"))  # never deployed, no budget
        out["INFEASIBLE"] = len(done) - out["FEASIBLE"] - out["REJECTED"]
        return out

    def baseline(self) -> FrozenTrial | None:
        for t in self.trials():
            if t.user_attrs.get("baseline") and t.state == TrialState.COMPLETE:
                return t
        return None

    def best(self) -> list[FrozenTrial]:
        """Best feasible trial(s): one for a single objective, the Pareto front for several.

        With noise repeats on and a noise estimate, a single objective ranks by the lower confidence bound
        (tuner.search.noise): a trial measured once is not preferred to a repeated one on a lucky run.
        """
        feasible = [t for t in self.trials() if t.state == TrialState.COMPLETE and t.user_attrs.get("feasible")]
        if not feasible:
            return []
        if len(self.spec.objectives) == 1:
            sign = 1 if self.spec.objectives[0].direction == "maximize" else -1
            cv = self.noise_cv() if self.spec.noise.repeats else None
            if cv:
                from tuner.search.noise import lcb

                maximize = sign > 0
                conf = self.spec.noise.confidence
                return [max(feasible, key=lambda t: (sign * lcb(measurements(t), cv, conf, maximize=maximize),
                                                     -t.number))]
            return [max(feasible, key=lambda t: (sign * t.values[0], -t.number))]
        return [t for t in self.study.best_trials if t.user_attrs.get("feasible")]

    # ------------------------------------------------------------ noise
    def noise_cv(self) -> float | None:
        """The pooled run-to-run coefficient of variation of the first objective over repeated trials."""
        from tuner.search.noise import pooled_cv

        return pooled_cv([measurements(t) for t in self.trials()
                          if t.state == TrialState.COMPLETE and t.user_attrs.get("repeats")])

    def estimate(self, t: FrozenTrial) -> Any:
        """The first objective of `t` over its measurements, with its interval (tuner.search.noise.Estimate)."""
        from tuner.search.noise import estimate

        return estimate(measurements(t), self.noise_cv(), self.spec.noise.confidence)

    def noise_report(self) -> dict[str, Any] | None:
        """With noise repeats on and one objective: the noise CV, the best's and the baseline's mean and
        interval, and whether the best's gain is within the noise (their intervals overlap). None otherwise."""
        if not self.spec.noise.repeats or len(self.spec.objectives) != 1:
            return None
        from tuner.search.noise import within_noise

        best, base = self.best(), self.baseline()
        out: dict[str, Any] = {"cv": self.noise_cv(), "confidence": self.spec.noise.confidence,
                               "repeated_trials": sum(1 for t in self.trials() if t.user_attrs.get("repeats"))}
        if best:
            e = self.estimate(best[0])
            out["best"] = {"number": best[0].number, "mean": e.mean, "n": e.n, "low": e.low, "high": e.high}
        if base is not None and base.values:
            b = self.estimate(base)
            out["baseline"] = {"number": base.number, "mean": b.mean, "n": b.n, "low": b.low, "high": b.high}
            if best and out["cv"] is not None and best[0].number != base.number:
                out["within_noise"] = within_noise(
                    e, b, maximize=self.spec.objectives[0].direction == "maximize")
        return out

    def trial(self, number: int) -> FrozenTrial:
        for t in self.trials():
            if t.number == number:
                return t
        raise ConfigError(f"study {self.name!r} has no trial {number}")


def measurements(t: FrozenTrial) -> list[float]:
    """The first objective's values of `t`: its trial value, then its repeats (finite ones)."""
    xs = [t.values[0]] if t.values else []
    xs += [float(v) for v in t.user_attrs.get("repeats") or [] if isinstance(v, int | float) and math.isfinite(v)]
    return xs


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
