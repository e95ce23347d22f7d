"""SQLite settings for the tuner's stores: WAL journal and synchronous=NORMAL.

Each Optuna suggest/tell and each MLflow write is its own transaction; with the default rollback journal
every commit pays an fsync (about 10 ms here). In WAL mode with synchronous=NORMAL a commit survives a
crash or SIGKILL of the process (only a power loss can drop the last transactions), at a fraction of the cost.
"""

from __future__ import annotations

import logging
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
