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
        f = open(lock, "a")  # noqa: SIM115 - closed below
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
