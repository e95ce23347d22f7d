"""Private state: the state directory is made 0700 and the stores 0600, whatever the umask.

The state dir holds the studies, the MLflow store (parameters may include endpoints), logs and the
champion files. Made 0700, nothing in it can be read by another user whatever the mode of the files
inside; the databases are also made 0600 themselves (SQLite gives its -wal and -shm files the database's
mode).

Every file the tuner reads that a user names (an agent, a search space, a trace, a model file, a champion
file) is read through `read_bounded`: a regular file only (after symlinks are resolved; a FIFO, a directory
or a device is refused, and a FIFO never blocks: opened non-blocking, then checked by fstat), and at most
its limit (limit + 1 bytes are read; more is refused).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from tuner.errors import ConfigError

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


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _not_regular(mode: int) -> str | None:
    """What a file of this mode is, when it is not a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def regular_file_problem(path: Path | str) -> str | None:
    """Why `path` is not a file the tuner reads (`file not found`, `a FIFO (named pipe) ..., not a regular
    file: ...`), or None for a regular file (symlinks followed). Nothing is opened."""
    resolved = os.path.realpath(path)
    where = "" if resolved == os.path.abspath(path) else f" (a link to {resolved})"
    try:
        kind = _not_regular(os.stat(path).st_mode)
    except FileNotFoundError:
        return f"file not found{where}"
    except OSError as exc:
        return f"cannot read: {exc.strerror or exc}"
    return f"{kind}{where}, not a regular file: only regular files are read" if kind else None


def read_bounded(path: Path | str, limit_bytes: int) -> bytes:
    """The bytes of the regular file `path` (symlinks followed), at most `limit_bytes` of them. A ConfigError
    naming the file otherwise: not found, not a regular file (a directory, a FIFO, a device, a socket: the
    rule), over the limit, or unreadable. Never blocks on a FIFO and never reads more than limit + 1 bytes."""
    name = str(path)
    problem = regular_file_problem(path)  # refused before it is opened: a device is never opened
    if problem:
        raise ConfigError(problem, file=name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise ConfigError(f"cannot open: {exc.strerror or exc}", file=name) from None
    try:
        kind = _not_regular(os.fstat(fd).st_mode)  # what was opened (the path may have changed since)
        if kind:
            raise ConfigError(f"{kind}, not a regular file: only regular files are read", file=name)
        chunks: list[bytes] = []
        got = 0
        while got <= limit_bytes:
            chunk = os.read(fd, min(1 << 20, limit_bytes + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", file=name) from None
    finally:
        os.close(fd)
    if got > limit_bytes:
        raise ConfigError(f"the file is over {limit_bytes} bytes (the size limit)", file=name)
    return b"".join(chunks)


def read_text_bounded(path: Path | str, limit_bytes: int) -> str:
    """`read_bounded`, decoded as UTF-8 (invalid UTF-8 is a ConfigError naming the file and the byte)."""
    data = read_bounded(path, limit_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text (byte {exc.start}: {exc.reason})", file=str(path)) from None
