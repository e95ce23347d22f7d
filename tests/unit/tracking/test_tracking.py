"""Review: redaction hides secrets, not the serving knobs that merely count tokens."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from tuner.tracking.tracker import Tracker, default_tracking_uri, redact


def test_token_count_knobs_are_not_redacted() -> None:
    knobs = {"max_num_batched_tokens": 2048, "prefill_chunk_tokens": 512, "long_prefill_token_threshold": 0,
             "tokenizer": "byte", "target.tokenizer": "byte"}
    assert redact(knobs) == knobs


def test_secrets_are_redacted() -> None:
    secrets = {"api_key": "sk-1", "hf_token": "hf_x", "HF_TOKEN": "hf_y", "password": "p", "db_passwd": "p",
               "client_secret": "s", "auth": "a", "Authorization": "Bearer x", "openai-api-key": "k",
               "token": "t", "secret_access_key": "k"}
    assert set(redact(secrets).values()) == {"***"}


class _WrappedClient:
    """A real MlflowClient with a fault injected around some of its methods; the rest go to the real one."""

    def __init__(self, real: object) -> None:
        self._real = real

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)


class _WrappedTracker(Tracker):
    """A real tracker whose MLflow client is wrapped in `wrap`."""

    wrap: ClassVar[type[_WrappedClient]] = _WrappedClient

    @property
    def client(self) -> object:
        if self._client is None:
            self._client = self.wrap(Tracker.client.fget(self))  # type: ignore[attr-defined]
        return self._client


class _FlakyClient(_WrappedClient):
    """A real MlflowClient whose first log_batch fails (a transient 'database is locked')."""

    failed = False

    def log_batch(self, *args: object, **kw: object) -> object:
        if not self.failed:
            self.failed = True
            raise RuntimeError("database is locked")
        return self._real.log_batch(*args, **kw)  # type: ignore[attr-defined]


class _FlakyTracker(_WrappedTracker):
    wrap = _FlakyClient


def test_a_retried_start_run_creates_one_run(tmp_path: Path) -> None:
    tr = _FlakyTracker(default_tracking_uri(tmp_path), "exp", artifact_dir=tmp_path / "art")
    run_id = tr.start_run("cycle-1", tags={"kind": "cycle"}, params={"trials_planned": 3})
    assert run_id is not None
    runs = tr.runs()
    assert len(runs) == 1 and runs[0].info.run_id == run_id
    assert runs[0].data.params == {"trials_planned": "3"}


def test_an_unreachable_tracking_server_costs_seconds_then_is_skipped(tmp_path: Path) -> None:
    import socket
    import time

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tr = Tracker(f"http://127.0.0.1:{port}", "x", retries=2, pause_s=60)
    t0 = time.monotonic()
    assert tr.start_run("cycle-1") is None
    assert time.monotonic() - t0 < 30
    t1 = time.monotonic()
    assert tr.start_run("trial-0") is None  # skipped while the store is down
    assert time.monotonic() - t1 < 5.0  # no connection tried (generous: a busy host stretches any call)


def test_urls_in_messages_hide_passwords() -> None:
    from tuner.tracking.tracker import safe_url

    assert safe_url("postgresql+psycopg://tuner:s3cret@db:5432/optuna") == "postgresql+psycopg://tuner:***@db:5432/optuna"
    assert safe_url("http://u:p@mlflow:5000") == "http://u:***@mlflow:5000"
    assert safe_url("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"


class _LostAnswerClient(_WrappedClient):
    """A real MlflowClient whose first create_run makes the run and then fails, as when a tracking server
    commits a run while its backend store restarts and the answer never reaches the tuner."""

    lost = False

    def create_run(self, *args: object, **kw: object) -> object:
        run = self._real.create_run(*args, **kw)  # type: ignore[attr-defined]
        if not self.lost:
            self.lost = True
            raise ConnectionError("the answer was lost")
        return run


class _LostAnswerTracker(_WrappedTracker):
    wrap = _LostAnswerClient


def test_a_start_run_whose_answer_was_lost_is_not_made_twice(tmp_path: Path) -> None:
    tr = _LostAnswerTracker(default_tracking_uri(tmp_path), "exp", artifact_dir=tmp_path / "art")
    run_id = tr.start_run("trial-3", tags={"kind": "trial", "trial": 3})
    assert run_id is not None
    runs = tr.runs()
    assert len(runs) == 1 and runs[0].info.run_id == run_id  # the first attempt's run, found by its create id
