"""SQLite settings for the tuner's stores: WAL journal and synchronous=NORMAL, and a lock around a store's
first opening.

Each Optuna suggest/tell and each MLflow write is its own transaction; with the default rollback journal
every commit pays an fsync (about 10 ms here). In WAL mode with synchronous=NORMAL a commit survives a
crash or SIGKILL of the process (only a power loss can drop the last transactions), at a fraction of the cost.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def _on_connect(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    try:
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA busy_timeout=30000")
    finally:
        cur.close()


def tune_engine(engine: Any) -> None:
    """Apply the settings to every (new) connection of a SQLAlchemy engine on SQLite; no-op otherwise."""
    if engine is None or getattr(getattr(engine, "dialect", None), "name", "") != "sqlite":
        return
    from sqlalchemy import event

    if not event.contains(engine, "connect", _on_connect):
        event.listen(engine, "connect", _on_connect)
        engine.dispose()  # pooled connections were opened without the settings


def sqlite_path(url: str) -> Path | None:
    """The database file of a SQLite URL (None for another database or an in-memory one)."""
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy can read: no file to lock
        return None
    if not parsed.drivername.startswith("sqlite") or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


@contextlib.contextmanager
def init_lock(url: str) -> Iterator[None]:
    """Hold an exclusive lock (fcntl.flock on `<db>.init.lock`) while a process opens a SQLite store.

    Opening a store creates its tables when the file is new, and two processes doing that at once race:
    the loser fails with "table ... already exists" (a `tuner status` or a promote next to a starting
    `tuner run` or daemon, say). Opening one at a time, the second finds the tables made. A no-op for
    other databases."""
    path = sqlite_path(url)
    if path is None:
        yield
        return
    try:
        from tuner.base.files import private_file

        path.parent.mkdir(parents=True, exist_ok=True)
        lock = private_file(path.with_name(path.name + ".init.lock"))
        f = open(lock, "a")  # noqa: SIM115 - closed below (made 0600 above)
    except OSError as exc:  # a read-only state dir (a reader such as `tuner status`): open without the lock
        log.debug("no init lock for %s: %s", path, exc)
        yield
        return
    with f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


# what the state dir holds once an agent has run in it: a study existed, so an Optuna store without one is damage
STUDY_RECORDS = ("*/agent.json", "*/daemon_study.json")


def check_store(url: str, *, new_ok: bool = False) -> None:
    """Refuse a SQLite Optuna store that exists but is damaged, before Optuna opens it (Optuna would make an
    empty file a new store, and a reader would call a truncated one "no study yet"): a StateError (exit 4)
    naming the file, what is wrong and what to do when it is not a regular file, fails SQLite's
    `PRAGMA quick_check` (truncated, random bytes), holds tables that are not Optuna's, or holds no Optuna
    tables (emptied) while the state dir's records say an agent ran there. A store that is not there, or
    not SQLite, is not checked; with `new_ok`, neither is an empty file (one the caller just made)."""
    from tuner.base.files import regular_file_problem
    from tuner.errors import StateError

    path = sqlite_path(url)
    if path is None or not os.path.lexists(path) or (new_ok and path.is_file() and path.stat().st_size == 0):
        return
    todo = ("restore it from a backup, or move it away to start a new study (its trials are then lost to "
            "the tuner)")
    problem = regular_file_problem(path)
    if problem:
        raise StateError(f"{path}: corrupt Optuna store: {problem}; {todo}")
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        try:
            check = con.execute("PRAGMA quick_check").fetchall()
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:
        if isinstance(exc, sqlite3.OperationalError) and not os.access(path.parent, os.W_OK):
            return  # a read-only state dir: the reader says so (read_only_problem)
        raise StateError(f"{path}: corrupt Optuna store ({exc}); {todo}") from None
    if check != [("ok",)]:
        raise StateError(f"{path}: corrupt Optuna store (SQLite's integrity check: {check[0][0]}); {todo}")
    if "studies" in tables:
        return
    if tables:
        raise StateError(f"{path}: not an Optuna store (its tables: {', '.join(sorted(tables)[:5])}); {todo}")
    records = sorted(r for pattern in STUDY_RECORDS for r in path.parent.glob(pattern))
    if records:
        raise StateError(f"{path}: corrupt Optuna store: it holds no study ({path.stat().st_size} bytes, no "
                         f"Optuna tables) while {records[0]} says an agent ran here (the file was emptied or "
                         f"replaced); {todo}")


def read_only_problem(url: str) -> str | None:
    """`<dir> is read-only ...` when a SQLite store's folder cannot be written (SQLite needs its lock and
    journal files there even to read a store in WAL mode); None otherwise."""
    path = sqlite_path(url)
    if path is None or not path.parent.is_dir() or os.access(path.parent, os.W_OK):
        return None
    return (f"{path.parent} is read-only: the Optuna store {path.name} (SQLite, WAL) needs to write its lock and "
            "journal files there even to be read; make the directory writable, or copy the state dir and "
            "point --state-dir at the copy")
