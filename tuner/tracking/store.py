"""The MLflow SQLite store: made where no reader can see it half-made, then moved into place; a store
whose making was interrupted (by an older tuner, or another tool) is set aside and made again.

MLflow creates a new store's tables and migrates them in many steps (several seconds on a loaded host).
A process killed midway used to leave a file every later opening failed on ("table ... already exists")
and that MLflow's own client could not open either. Here a missing store is made in `<db>.making-<pid>`
and renamed to `<db>` only once complete (a rename is atomic), and a half-made `<db>` that holds no run is
renamed `<db>.broken-<time>` and made again. One that holds runs is left alone (the tracker reports it
down); runs are never deleted. What MLflow lacks is then written from the Optuna study (tracking_sync).

Called under tuner.coord.sqlite.init_lock, so only one process makes a store at a time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
from pathlib import Path

from tuner.base.files import private_file
from tuner.coord.sqlite import sqlite_path

log = logging.getLogger(__name__)


def _migrate(path: Path) -> None:
    """Create and migrate MLflow's tables (tracking and model registry) in the file at `path`."""
    from mlflow.store.model_registry.sqlalchemy_store import SqlAlchemyStore as RegistryStore
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore as TrackingStore

    uri = f"sqlite:///{path}"
    for store in (TrackingStore(uri, str(path.parent / "mlartifacts")), RegistryStore(uri)):
        engine = getattr(store, "engine", None)
        if engine is not None:
            engine.dispose()
    with contextlib.closing(sqlite3.connect(path)) as conn:  # fold a WAL back in: one file to move
        conn.execute("PRAGMA journal_mode=DELETE")


def is_complete(path: Path) -> bool:
    """A store MLflow finished making: its alembic version is stamped and the runs table exists."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)) as conn:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if not {"alembic_version", "runs", "experiments", "registered_models"} <= tables:
                return False
            return conn.execute("SELECT count(*) FROM alembic_version").fetchone()[0] == 1
    except sqlite3.Error:
        return False


def run_count(path: Path) -> int:
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)) as conn:
            return int(conn.execute("SELECT count(*) FROM runs").fetchone()[0])
    except sqlite3.Error:
        return 0


def _make(path: Path) -> None:
    tmp = path.with_name(f"{path.name}.making-{os.getpid()}")
    for stale in path.parent.glob(f"{path.name}.making-*"):  # left by a process killed while making one
        with contextlib.suppress(OSError):
            stale.unlink()
    private_file(tmp)
    try:
        _migrate(tmp)
        os.replace(tmp, path)
    finally:
        for leftover in (tmp, tmp.with_name(tmp.name + "-wal"), tmp.with_name(tmp.name + "-shm")):
            with contextlib.suppress(OSError):
                leftover.unlink()


def prepare_sqlite_store(uri: str) -> None:
    """Make the store of `uri` if it is missing, or set a half-made one aside and make it again."""
    path = sqlite_path(uri)
    if path is None:
        return
    if not path.exists() or path.stat().st_size == 0:
        if path.exists():
            path.unlink()
        path.parent.mkdir(parents=True, exist_ok=True)
        _make(path)
        return
    if is_complete(path):
        return
    runs = run_count(path)
    if runs:
        log.warning("the MLflow store %s looks half-made but holds %d run(s): left as it is", path, runs)
        return
    aside = path.with_name(f"{path.name}.broken-{time.strftime('%Y%m%dT%H%M%S')}")
    os.replace(path, aside)
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(OSError):
            os.replace(path.with_name(path.name + suffix), aside.with_name(aside.name + suffix))
    log.warning("the MLflow store %s was half-made (its creation was interrupted) and held no run: kept as %s, "
                "made again; the runs it lacks are written from the Optuna study", path, aside.name)
    _make(path)
