"""A lock shared by every process that uses one study store, on any host: `with study_lock(engine, name): ...`.

On PostgreSQL it is a session advisory lock (pg_advisory_lock) held on its own connection, so processes on
every host that reach the database are serialised, and a process that dies (or loses its connection)
releases it at once. On SQLite, whose file lives on one host, it is an fcntl.flock on `<db>.<name>.lock`.
Other databases get a lock that serialises this process's threads only (with a warning, once).

Used for what must happen once for the fleet: queueing the baseline, taking a slot of the budget, telling or
reaping a trial (a lease that expires while its owner tells), promoting a champion.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from tuner.base.files import private_file
from tuner.errors import TunerError

log = logging.getLogger(__name__)

_LOCAL: dict[str, threading.RLock] = {}
_LOCAL_GUARD = threading.Lock()
_WARNED: set[str] = set()


class LockTimeout(TunerError):
    """The lock could not be taken in time (another process holds it)."""


def lock_key(name: str) -> int:
    """A signed 64-bit key for pg_advisory_lock from a lock's name."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


def _local(name: str) -> threading.RLock:
    with _LOCAL_GUARD:
        return _LOCAL.setdefault(name, threading.RLock())


@contextlib.contextmanager
def study_lock(engine: Any, name: str, *, timeout_s: float = 120.0, poll_s: float = 0.05) -> Iterator[None]:
    """Hold the lock `name` of the database behind the SQLAlchemy `engine` for the with-block."""
    dialect = engine.dialect.name if engine is not None else "memory"
    if engine is None:  # an in-process store: this process's threads are the only users
        with _local(name):
            yield
    elif dialect == "postgresql":
        with _pg_lock(engine, name, timeout_s, poll_s):
            yield
    elif dialect == "sqlite":
        with _file_lock(engine, name, timeout_s, poll_s):
            yield
    else:
        if dialect not in _WARNED:
            _WARNED.add(dialect)
            log.warning("no cross-process lock on %s: the fleet's processes are not serialised", dialect)
        with _local(name):
            yield


@contextlib.contextmanager
def _pg_lock(engine: Any, name: str, timeout_s: float, poll_s: float) -> Iterator[None]:
    from sqlalchemy import text

    key = lock_key(name)
    deadline = time.monotonic() + timeout_s
    conn = engine.connect()
    try:
        while not conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar():
            conn.rollback()  # no transaction left open (and no snapshot held) while waiting
            if time.monotonic() >= deadline:
                raise LockTimeout(f"lock {name!r} still held by another process after {timeout_s:.0f} s")
            time.sleep(poll_s)
        conn.commit()
        try:
            yield
        finally:
            try:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                conn.commit()
            except Exception as exc:  # noqa: BLE001 - a lost connection released the lock with it
                log.debug("unlock of %s failed (%s): the connection is gone, and the lock with it", name, exc)
                conn.invalidate()
    finally:
        conn.close()


@contextlib.contextmanager
def _file_lock(engine: Any, name: str, timeout_s: float, poll_s: float) -> Iterator[None]:
    from pathlib import Path

    db = engine.url.database
    if not db or db == ":memory:":
        with _local(name):
            yield
        return
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    path = Path(db).with_name(f"{Path(db).name}.{safe}.lock")
    deadline = time.monotonic() + timeout_s
    try:
        f = open(private_file(path), "a")  # noqa: SIM115 - closed below
    except OSError as exc:  # a read-only state dir: a reader that changes nothing needs no lock
        log.debug("no lock file %s: %s", path, exc)
        with _local(name):
            yield
        return
    with f:
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockTimeout(f"lock {path} still held by another process after {timeout_s:.0f} s") from None
                time.sleep(poll_s)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
