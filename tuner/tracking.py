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
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from tuner import __version__
from tuner.measure.records import RequestRecord

log = logging.getLogger(__name__)
T = TypeVar("T")

RECORD_FIELDS = ("index", "scheduled_s", "sent_s", "first_token_s", "done_s", "prompt_tokens",
                 "output_tokens", "status", "error", "error_detail", "warmup", "ttft_ms", "e2el_ms", "tpot_ms")
# a name is secret when its last word is one of these (api_key, HF_TOKEN), or it has a password word anywhere;
# knobs that count tokens (max_num_batched_tokens, long_prefill_token_threshold) are not
SECRET_MARKERS = ("key", "token", "secret", "password", "passwd", "auth", "authorization", "apikey", "credentials")
_ALWAYS_SECRET = ("password", "passwd", "secret")


def default_tracking_uri(state_dir: Path) -> str:
    return f"sqlite:///{(state_dir / 'mlflow.db').resolve()}"


def resolve_tracking_uri(spec_uri: str | None, state_dir: Path) -> str:
    """The spec's URI, else MLFLOW_TRACKING_URI, else a SQLite store in the state dir."""
    return spec_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(state_dir)


def redact(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """Hide values whose names look secret (api keys, tokens...) before they reach MLflow."""
    out = {}
    for k, v in mapping.items():
        out[k] = "***" if _is_secret(k) else v
    return out


def _is_secret(name: str) -> bool:
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    return bool(words) and (words[-1] in SECRET_MARKERS or any(w in _ALWAYS_SECRET for w in words))


def safe_url(url: str) -> str:
    """A URL fit for logs and messages: any password replaced by ***."""
    import re

    return re.sub(r"(//[^:/@]+:)[^@/]*@", r"\1***@", url)


def records_csv(records: Iterable[RequestRecord]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(RECORD_FIELDS)
    for r in records:
        w.writerow([r.index, r.scheduled_s, r.sent_s, r.first_token_s, r.done_s, r.prompt_tokens,
                    r.output_tokens, r.status, r.error or "", r.error_detail, int(r.warmup), r.ttft_ms,
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


class Tracker:
    """Thin wrapper over MlflowClient (safe across threads: no fluent active-run stack)."""

    def __init__(self, uri: str, experiment: str, *, artifact_dir: Path | None = None,
                 retries: int = 3, enabled: bool = True, pause_s: float = 60.0) -> None:
        self.uri = uri
        self.experiment_name = experiment
        self.enabled = enabled
        self.retries = retries
        self.pause_s = pause_s
        self._down_until = 0.0  # after a write fails every retry, skip MLflow until then
        self.artifact_dir = artifact_dir
        self._client: Any = None
        self._experiment_id: str | None = None

    # ------------------------------------------------------------ plumbing
    @property
    def client(self) -> Any:
        if self._client is None:
            logging.getLogger("alembic").setLevel(logging.WARNING)
            # usage telemetry would try the network from every call; the tuner's hosts often have none
            os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
            # MLflow configures its own logger at import (INFO: "Creating initial MLflow database tables")
            os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
            # an unreachable tracking server must cost seconds, not MLflow's default minutes per call
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
            from mlflow.tracking import MlflowClient

            from tuner.sqlite import init_lock, tune_engine

            with init_lock(self.uri):  # a store migrates a new file's tables when first used (no-op off SQLite)
                client = MlflowClient(tracking_uri=self.uri, registry_uri=self.uri)
                if self.uri.startswith("sqlite:"):
                    tune_engine(getattr(client._tracking_client.store, "engine", None))
                    client._get_registry_client().store  # noqa: B018 - the registry's store migrates too
            self._client = client
        return self._client

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

    def _retry(self, what: str, fn: Callable[[], T]) -> T | None:
        if not self.enabled:
            return None
        if time.monotonic() < self._down_until:
            log.debug("MLflow %s skipped: the store failed recently", what)
            return None
        delay = 0.2
        for attempt in range(1, self.retries + 1):
            try:
                return fn()
            except Exception as exc:  # noqa: BLE001 - tracking must never break the loop
                if attempt == self.retries:
                    self._down_until = time.monotonic() + self.pause_s
                    log.warning("MLflow %s failed after %d tries (%s); skipping MLflow for %.0f s "
                                "(trials stay in the Optuna study)", what, attempt, exc, self.pause_s)
                    return None
                time.sleep(delay)
                delay *= 2
        return None

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
        def go() -> str:
            all_tags = {"tuner.version": __version__, **(tags or {})}
            if parent_run_id:
                all_tags["mlflow.parentRunId"] = parent_run_id
            run = self.client.create_run(self.experiment_id, run_name=name,
                                         tags={k: str(v) for k, v in redact(all_tags).items()})
            return str(run.info.run_id)

        run_id = self._retry(f"start run {name}", go)
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

    def alias_version(self, model_name: str, alias: str) -> str | None:
        """The version `alias` points at, or None (also when MLflow cannot be reached)."""
        if not self.enabled:
            return None
        try:
            return str(self.client.get_model_version_by_alias(model_name, alias).version)
        except Exception:  # noqa: BLE001 - absent alias or model
            return None
