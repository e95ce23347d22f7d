"""MLflow logging: one experiment per agent, a parent run per cycle, a nested run per trial.

The only module that imports mlflow. Tracking failures are logged and retried, never raised into the
loop: Optuna's storage stays the source of truth, so a lost MLflow write never loses a trial.
"""

from __future__ import annotations

import contextlib
import csv
import io
import logging
import os
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from tuner import __version__
from tuner.base.redact import redact_mapping, redact_text, redact_url
from tuner.measure.records import RequestRecord
from tuner.spec import AgentSpec

log = logging.getLogger(__name__)
T = TypeVar("T")

RECORD_FIELDS = ("index", "scheduled_s", "sent_s", "first_token_s", "done_s", "prompt_tokens",
                 "output_tokens", "status", "error", "error_detail", "warmup", "ttft_ms", "e2el_ms", "tpot_ms")
def default_tracking_uri(state_dir: Path) -> str:
    return f"sqlite:///{(state_dir / 'mlflow.db').resolve()}"


def resolve_tracking_uri(spec_uri: str | None, state_dir: Path) -> str:
    """The spec's URI, else MLFLOW_TRACKING_URI, else a SQLite store in the state dir."""
    return spec_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(state_dir)


def redact(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """Hide values whose names look secret (api keys, tokens...) before they reach MLflow."""
    return redact_mapping(mapping)


def safe_url(url: str) -> str:
    """A URL fit for logs and messages (tuner.base.redact.redact_url)."""
    return redact_url(url)


def records_csv(records: Iterable[RequestRecord]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(RECORD_FIELDS)
    for r in records:
        w.writerow([r.index, r.scheduled_s, r.sent_s, r.first_token_s, r.done_s, r.prompt_tokens,
                    r.output_tokens, r.status, r.error or "", redact_text(r.error_detail), int(r.warmup), r.ttft_ms,
                    r.e2el_ms, r.tpot_ms])
    return buf.getvalue()


# the MLflow UI opens an experiment of this kind on its runs table, not on the GenAI traces page
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"

_FLUENT_LOCK = threading.Lock()


@contextlib.contextmanager
def _fluent_uris(uri: str) -> Iterator[None]:
    """Point MLflow's fluent API at `uri` for a moment, then restore its globals and environment.

    mlflow.set_tracking_uri also exports MLFLOW_TRACKING_URI, which resolve_tracking_uri would then
    pick up for every later agent of this process: the environment is restored exactly.
    """
    import mlflow.tracking._model_registry.utils as reg_utils
    import mlflow.tracking._tracking_service.utils as trk_utils

    with _FLUENT_LOCK:
        env = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
        saved = (trk_utils._tracking_uri, reg_utils._registry_uri)
        try:
            trk_utils.set_tracking_uri(uri)
            reg_utils.set_registry_uri(uri)
            yield
        finally:
            trk_utils._tracking_uri, reg_utils._registry_uri = saved
            for k, v in env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _owner_token() -> str:
    """This process, as MLflow runs record it (tag tuner.owner): host, PID and the PID's start time, so a
    later process can tell a dead owner from a live one even after the PID is reused."""
    from tuner.base.proc import process_start_ticks

    return f"{socket.gethostname()}:{os.getpid()}:{process_start_ticks(os.getpid())}"


OWNER_TAG = "tuner.owner"
CREATE_ID_TAG = "tuner.create_id"  # one start_run's id: its retries find a run an earlier attempt made
VERIFICATION_KEY_TAG = "tuner.verification"  # a verification's key, in its MLflow run and its stored entry
END_PROBE_S = 10.0  # a store marked down is asked once more at the end of a run, cycle or verification
LOCAL_OPEN_TIMEOUT_S = 120.0  # making a new SQLite store's tables takes seconds, more on a loaded host
BACKFILLED_TAG = "tuner.backfilled"
_MISSING = object()
# stores found down by any tracker of this process (uri -> when): a tracker made later for the same store (the
# daemon makes one per cycle) starts down instead of waiting call_timeout_s again; cleared when it answers
_DOWN_URIS: dict[str, float] = {}
_DOWN_LOCK = threading.Lock()


class Tracker:
    """Thin wrapper over MlflowClient (safe across threads: no fluent active-run stack).

    Time-bounded: every write runs in a helper thread and the caller waits at most `call_timeout_s` for
    it (retries included). A write that fails or times out marks the store down (for every tracker of this
    process on the same URI): later writes are skipped at once (no wait) while a background probe asks the
    store every `pause_s` whether it answers again, and `probe_now` asks once more at the end of a run,
    cycle or verification (at most `end_probe_s`). Skipped writes are not lost: Optuna holds every trial,
    and tuner.tracking.sync.reconcile writes what MLflow lacks (`recovered()` says when to run it)."""

    @classmethod
    def for_agent(cls, spec: AgentSpec, state_dir: Path) -> Tracker:
        """The agent's tracker: its spec's URI (else MLFLOW_TRACKING_URI, else the state dir's store), its
        experiment (default: the agent's name), artifacts under <state>/mlartifacts."""
        return cls(resolve_tracking_uri(spec.tracking.uri, state_dir), spec.tracking.experiment or spec.name,
                   artifact_dir=state_dir / "mlartifacts", enabled=spec.tracking.enabled)

    def __init__(self, uri: str, experiment: str, *, artifact_dir: Path | None = None,
                 retries: int = 3, enabled: bool = True, pause_s: float = 5.0, call_timeout_s: float = 30.0,
                 end_probe_s: float = END_PROBE_S) -> None:
        self.uri = uri
        self.experiment_name = experiment
        self.enabled = enabled
        self.retries = retries
        self.pause_s = pause_s
        self.call_timeout_s = call_timeout_s
        self.end_probe_s = end_probe_s
        self.artifact_dir = artifact_dir
        self._client: Any = None
        self._client_lock = threading.Lock()
        self._experiment_id: str | None = None
        self._state_lock = threading.Lock()
        self._down = False
        self._probe: threading.Thread | None = None
        self._recovered = False
        self.failures = 0  # writes skipped or failed since the last reconcile
        self.owner = _owner_token()
        self.active: set[str] = set()  # runs this process started and has not ended yet
        self.tracking_trials: set[int] = set()  # trials told to Optuna whose run this process is writing
        with _DOWN_LOCK:
            known_down = enabled and uri in _DOWN_URIS
        if known_down:  # another tracker of this process found it down: no call_timeout_s wait again
            self._down = True
            self._start_probe()

    # ------------------------------------------------------------ plumbing
    @property
    def client(self) -> Any:
        with self._client_lock:
            if self._client is None:
                self._client = self._open_client()
            return self._client

    def _open_client(self) -> Any:
        logging.getLogger("alembic").setLevel(logging.WARNING)
        # usage telemetry would try the network from every call; the tuner's hosts often have none
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        # MLflow configures its own logger at import (INFO: "Creating initial MLflow database tables")
        os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
        # an unreachable tracking server must cost seconds, not MLflow's default minutes per call
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        from mlflow.tracking import MlflowClient

        from tuner.coord.sqlite import init_lock, tune_engine
        from tuner.tracking.store import prepare_sqlite_store

        with init_lock(self.uri):  # a store migrates a new file's tables when first used (no-op off SQLite)
            if self.uri.startswith("sqlite:"):
                prepare_sqlite_store(self.uri)  # made out of sight and moved into place; a half-made one repaired
            client = MlflowClient(tracking_uri=self.uri, registry_uri=self.uri)
            if self.uri.startswith("sqlite:"):
                tune_engine(getattr(client._tracking_client.store, "engine", None))
                client._get_registry_client().store  # noqa: B018 - the registry's store migrates too
        return client

    @property
    def experiment_id(self) -> str:
        if self._experiment_id is None:
            exp = self.client.get_experiment_by_name(self.experiment_name)
            if exp is None:
                location = None
                # a tracking server keeps the artifacts itself (every host of a fleet uploads to it)
                if self.artifact_dir is not None and not self.uri.startswith(("http:", "https:")):
                    self.artifact_dir.mkdir(parents=True, exist_ok=True)
                    location = self.artifact_dir.resolve().as_uri()
                self._experiment_id = self.client.create_experiment(
                    self.experiment_name, artifact_location=location, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
            else:
                self._experiment_id = exp.experiment_id
                if exp.tags.get(EXPERIMENT_KIND_TAG) is None:  # an experiment made by an older tuner
                    self.client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return self._experiment_id

    @property
    def down(self) -> bool:
        return self._down

    def recovered(self) -> bool:
        """True once after the store answers again following a failure (time to reconcile)."""
        with self._state_lock:
            was, self._recovered = self._recovered, False
            return was

    def _retry(self, what: str, fn: Callable[[], T]) -> T | None:
        """Run `fn` with retries, waiting at most call_timeout_s; None (and the store marked down) when it
        fails or does not answer in time. Never raises."""
        if not self.enabled:
            return None
        if self._down:
            self.failures += 1
            log.debug("MLflow %s skipped: the store is down (made up later from the Optuna study)", what)
            return None
        timeout_s = self.call_timeout_s
        if self._client is None and self.uri.startswith("sqlite:"):
            timeout_s = max(timeout_s, LOCAL_OPEN_TIMEOUT_S)  # making a local store's tables, not a silent server
        deadline = time.monotonic() + timeout_s
        box: dict[str, Any] = {}

        def attempt() -> None:
            delay = 0.2
            for i in range(1, self.retries + 1):
                try:
                    box["value"] = fn()
                    return
                except Exception as exc:  # noqa: BLE001 - tracking must never break the loop
                    box["error"] = exc
                    if i == self.retries or time.monotonic() + delay >= deadline:
                        return
                    time.sleep(delay)
                    delay *= 2

        worker = threading.Thread(target=attempt, name="mlflow-call", daemon=True)
        worker.start()
        worker.join(max(0.0, deadline - time.monotonic()))
        if worker.is_alive():
            error: Any = f"no answer within {timeout_s:.0f} s"
        elif "value" in box:
            return box["value"]  # type: ignore[no-any-return]
        else:
            error = box.get("error", "unknown error")
        self._mark_down(what, error)
        return None

    def _mark_down(self, what: str, error: Any) -> None:
        self.failures += 1
        with self._state_lock:
            if self._down:
                return
            self._down = True
            with _DOWN_LOCK:
                _DOWN_URIS.setdefault(self.uri, time.time())
            log.warning("MLflow %s failed (%s); MLflow writes are skipped until %s answers again, then made up "
                        "from the Optuna study (trials are not lost)", what, redact_text(str(error))[:300],
                        redact_url(self.uri))
            self._start_probe()

    def _start_probe(self) -> None:
        if self._probe is None or not self._probe.is_alive():
            self._probe = threading.Thread(target=self._probe_loop, name="mlflow-probe", daemon=True)
            self._probe.start()

    def _answers(self) -> None:
        """Raises unless the store answers a cheap read."""
        self.client.search_experiments(max_results=1)

    def _set_up(self) -> None:
        with self._state_lock:
            if not self._down:
                return
            self._down = False
            self._recovered = True
        with _DOWN_LOCK:
            _DOWN_URIS.pop(self.uri, None)
        log.warning("MLflow %s answers again; what it missed is written from the Optuna study",
                    redact_url(self.uri))

    def _probe_loop(self) -> None:
        while self._down:
            time.sleep(self.pause_s)
            if not self._down:  # probe_now saw it first
                return
            try:
                self._answers()
            except Exception as exc:  # noqa: BLE001 - still down
                log.debug("MLflow still down: %s", redact_text(str(exc))[:200])
                continue
            self._set_up()
            return

    def probe_now(self, budget_s: float | None = None) -> bool:
        """Whether the store answers: a store marked down is asked once more, waiting at most `budget_s`
        (default end_probe_s), so that a run, cycle or verification ending while the background probe has
        not seen it back yet still writes what MLflow missed (recovered() is then True once). Never raises."""
        if not self.enabled:
            return False
        if not self._down:
            return True
        box: dict[str, Any] = {}

        def ask() -> None:
            try:
                self._answers()
                box["ok"] = True
            except Exception as exc:  # noqa: BLE001 - still down
                box["error"] = exc

        asker = threading.Thread(target=ask, name="mlflow-probe-now", daemon=True)
        asker.start()
        asker.join(self.end_probe_s if budget_s is None else budget_s)
        if box.get("ok"):
            self._set_up()
            return True
        log.info("MLflow %s still does not answer (%s); the next start writes what it missed",
                 redact_url(self.uri), redact_text(str(box.get("error", "no answer in time")))[:200])
        return False

    def _log_batch(self, run_id: str, *, params: Mapping[str, Any] | None = None,
                   metrics: Mapping[str, float] | None = None, tags: Mapping[str, Any] | None = None) -> None:
        from mlflow.entities import Metric, Param, RunTag

        now = int(time.time() * 1000)
        ps = [Param(k, str(v)[:6000]) for k, v in redact(params or {}).items()]
        ms = [Metric(k, float(v), now, 0) for k, v in (metrics or {}).items()
              if isinstance(v, int | float) and v == v and abs(v) != float("inf")]
        ts = [RunTag(k, str(v)[:5000]) for k, v in redact(tags or {}).items()]
        for i in range(0, max(len(ms), 1), 900):
            self.client.log_batch(run_id, metrics=ms[i:i + 900], params=ps if i == 0 else [],
                                  tags=ts if i == 0 else [])

    def _log_text(self, run_id: str, text: str, name: str) -> None:
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / name
            p.write_text(text, encoding="utf-8")
            self.client.log_artifact(run_id, str(p))

    # ------------------------------------------------------------ runs
    def start_run(self, name: str, *, parent_run_id: str | None = None, tags: Mapping[str, Any] | None = None,
                  params: Mapping[str, Any] | None = None) -> str | None:
        create_id = uuid.uuid4().hex
        attempts = [0]

        def go() -> str:
            attempts[0] += 1
            if attempts[0] > 1:  # an attempt whose answer was lost (a server whose store restarted) may have
                found = self.client.search_runs(  # made the run: a retry must not make a second one
                    [self.experiment_id], filter_string=f"tags.`{CREATE_ID_TAG}` = '{create_id}'", max_results=1)
                if found:
                    return str(found[0].info.run_id)
            all_tags = {"tuner.version": __version__, OWNER_TAG: self.owner, CREATE_ID_TAG: create_id,
                        **(tags or {})}
            if parent_run_id:
                all_tags["mlflow.parentRunId"] = parent_run_id
            run = self.client.create_run(self.experiment_id, run_name=name,
                                         tags={k: str(v) for k, v in redact(all_tags).items()})
            return str(run.info.run_id)

        run_id = self._retry(f"start run {name}", go)
        if run_id is not None:
            self.active.add(run_id)
        if run_id is not None and params:  # retried on its own: a retry must not create a second run
            self.log(run_id, params=params)
        return run_id

    def log(self, run_id: str | None, *, params: Mapping[str, Any] | None = None,
            metrics: Mapping[str, float] | None = None, tags: Mapping[str, Any] | None = None) -> None:
        if run_id is None:
            return
        self._retry("log", lambda: self._log_batch(run_id, params=params, metrics=metrics, tags=tags))

    def log_text(self, run_id: str | None, text: str, name: str) -> None:
        if run_id is None:
            return
        self._retry(f"artifact {name}", lambda: self._log_text(run_id, text, name))

    def log_file(self, run_id: str | None, path: Path) -> None:
        if run_id is None or not path.is_file():
            return
        self._retry(f"artifact {path.name}", lambda: self.client.log_artifact(run_id, str(path)))

    def log_dir(self, run_id: str | None, path: Path, artifact_path: str | None = None) -> None:
        """Every file of `path` as artifacts of the run, under `artifact_path`."""
        if run_id is None or not path.is_dir():
            return
        self._retry(f"artifacts {artifact_path or path.name}",
                    lambda: self.client.log_artifacts(run_id, str(path), artifact_path))

    def end_run(self, run_id: str | None, status: str = "FINISHED") -> None:
        if run_id is None:
            return
        self.active.discard(run_id)  # ended, or left to the next reconcile if this write fails
        self._retry("end run", lambda: self.client.set_terminated(run_id, status=status))

    # ------------------------------------------------------------ queries (for tests, history)
    def runs(self, filter_string: str = "") -> list[Any]:
        return list(self.client.search_runs([self.experiment_id], filter_string=filter_string,
                                            max_results=5000))

    # ------------------------------------------------------------ series and registry (promotion)
    def log_steps(self, run_id: str | None, series: Mapping[str, Iterable[float]]) -> None:
        """Log each key's values as steps 0, 1, 2... of one metric (e.g. per verification run)."""
        if run_id is None:
            return

        def go() -> None:
            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            ms = [Metric(k, float(v), now, i) for k, vs in series.items() for i, v in enumerate(vs)
                  if isinstance(v, int | float) and v == v and abs(v) != float("inf")]
            for i in range(0, len(ms), 900):
                self.client.log_batch(run_id, metrics=ms[i:i + 900])

        self._retry("log steps", go)

    def register_config(self, model_name: str, config: Mapping[str, Any], *, source_run_id: str | None = None,
                        tags: Mapping[str, Any] | None = None) -> str | None:
        """Register a serving configuration as a model version (external LoggedModel). Returns the version."""

        def go() -> str:
            import mlflow

            with _fluent_uris(self.uri):
                lm = mlflow.create_external_model(
                    name=model_name, source_run_id=source_run_id, experiment_id=self.experiment_id,
                    params={k: str(v)[:6000] for k, v in redact(config).items()},
                    tags={k: str(v) for k, v in (tags or {}).items()}, model_type="serving-config")
                mv = mlflow.register_model(f"models:/{lm.model_id}", model_name,
                                           tags={k: str(v) for k, v in (tags or {}).items()})
            return str(mv.version)

        return self._retry(f"register {model_name}", go)

    def set_alias(self, model_name: str, alias: str, version: str | None) -> None:
        """Point `alias` at `version`; None deletes the alias."""

        def go() -> None:
            if version is None:
                try:
                    self.client.delete_registered_model_alias(model_name, alias)
                except Exception as exc:  # noqa: BLE001 - absent alias
                    if "RESOURCE_DOES_NOT_EXIST" not in str(exc) and "not found" not in str(exc).lower():
                        raise
            else:
                self.client.set_registered_model_alias(model_name, alias, version)

        self._retry(f"alias {model_name}@{alias}", go)

    def alias_target(self, model_name: str, alias: str) -> tuple[str | None] | None:
        """The version `alias` points at, as a 1-tuple ((None,): no such alias or model), or None when MLflow does
        not answer; bounded like every write (call_timeout_s once, then the store is marked down)."""

        def go() -> tuple[str | None]:
            try:
                return (str(self.client.get_model_version_by_alias(model_name, alias).version),)
            except Exception as exc:
                if "RESOURCE_DOES_NOT_EXIST" in str(exc) or "not found" in str(exc).lower():
                    return (None,)
                raise

        return self._retry(f"read alias {model_name}@{alias}", go)

    def alias_version(self, model_name: str, alias: str) -> str | None:
        """The version `alias` points at, or None (also when MLflow cannot be reached)."""
        if not self.enabled:
            return None
        try:
            return str(self.client.get_model_version_by_alias(model_name, alias).version)
        except Exception:  # noqa: BLE001 - absent alias or model
            return None
