"""Private state: the state directory is made 0700 and the stores 0600, whatever the umask.

The state dir holds the studies, the MLflow store (parameters may include endpoints), logs and the
champion files. Made 0700, nothing in it can be read by another user whatever the mode of the files
inside; the databases are also made 0600 themselves (SQLite gives its -wal and -shm files the database's
mode).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path | str) -> Path:
    """mkdir -p, with the directories it creates (and `path` itself) at 0700."""
    p = Path(path)
    missing = []
    cur = p
    while not cur.exists() and cur != cur.parent:
        missing.append(cur)
        cur = cur.parent
    p.mkdir(parents=True, exist_ok=True)
    for d in missing:
        try:
            os.chmod(d, DIR_MODE)
        except OSError:
            pass
    return p


def private_file(path: Path | str) -> Path:
    """Create `path` empty at 0600 if it does not exist (an existing file is left as it is)."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        return p
    try:
        os.fchmod(fd, FILE_MODE)  # the umask may have taken bits away, never added: fchmod sets it exactly
    finally:
        os.close(fd)
    return p


def atomic_write(path: Path, text: str) -> None:
    """Write `text` to `path` so that readers see the old or the new content, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
