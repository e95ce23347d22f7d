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
import errno
import os
import stat
import tempfile
from pathlib import Path

from tuner.errors import ConfigError, StateError

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path | str, *, tighten: bool = True) -> Path:
    """mkdir -p, with the directories it creates (and `path` itself) at 0700. An existing `path` is tightened
    to 0700 too when its owner is this user; a shared directory (sticky and world-writable, as /tmp or a tmpfs
    mount point's 1777) or one another user owns is refused (a StateError saying what to give instead): its
    mode is not the tuner's to change, and the state in it would not be private. `tighten=False`: only the
    directories it creates are made 0700."""
    p = Path(path)
    missing = []
    cur = p
    while not cur.exists() and cur != cur.parent:
        missing.append(cur)
        cur = cur.parent
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StateError(f"{p}: cannot create the state directory: {exc.strerror or exc}") from None
    for d in missing:
        try:
            os.chmod(d, DIR_MODE)
        except OSError:
            pass
    st = os.stat(p)
    if tighten and stat.S_IMODE(st.st_mode) & 0o077:
        mode = oct(stat.S_IMODE(st.st_mode))[2:]
        if st.st_mode & stat.S_ISVTX and st.st_mode & stat.S_IWOTH:
            raise StateError(f"{p} is a shared directory (mode {mode}): the state dir must be private; give a "
                             f"directory inside it instead (e.g. --state-dir {p / 'tuner'}), which is made 0700")
        if st.st_uid != os.geteuid():
            raise StateError(f"{p} (mode {mode}) belongs to uid {st.st_uid}, not to this user: give a state "
                             "directory of your own")
        try:
            os.chmod(p, DIR_MODE)
        except OSError as exc:
            raise StateError(f"{p}: cannot make the state directory private (0700): {exc.strerror or exc}") from None
    return p


def private_file(path: Path | str) -> Path:
    """Create `path` empty at 0600 if it does not exist; an existing file of this user's that others may read
    is tightened to 0600."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        with contextlib.suppress(OSError):
            st = os.stat(p)
            if stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) & 0o077 and st.st_uid == os.geteuid():
                os.chmod(p, FILE_MODE)
        return p
    try:
        os.fchmod(fd, FILE_MODE)  # the umask may have taken bits away, never added: fchmod sets it exactly
    finally:
        os.close(fd)
    return p


def atomic_write(path: Path, text: str) -> None:
    """Write `text` to `path` so that readers see the old or the new content, never a mix (0600, as mkstemp
    makes it; the folders it creates 0700)."""
    private_dir(path.parent, tighten=False)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise (state_fault(exc, path.parent) or exc) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        fault = state_fault(exc, path.parent) if isinstance(exc, OSError) else None
        if fault is not None:
            raise fault from None
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


_FULL = (errno.ENOSPC, errno.EDQUOT)
_SQLITE_FULL = ("database or disk is full", "disk is full")
_SQLITE_READ_ONLY = ("attempt to write a readonly database", "readonly database")


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc`, its causes and contexts, and the DB-API error a SQLAlchemy error wraps (`orig`): 20 at most."""
    out: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo and len(out) < 20:
        e = todo.pop(0)
        if e is None or any(e is seen for seen in out):
            continue
        out.append(e)
        orig = getattr(e, "orig", None)
        todo += [orig if isinstance(orig, BaseException) else None, e.__cause__, e.__context__]
    return out


def state_fault(exc: BaseException, where: Path | str) -> StateError | None:
    """A StateError naming `where` (the directory written) when `exc` (or what caused it) is a full disk
    (ENOSPC, EDQUOT, SQLite's "database or disk is full") or a read-only one (EROFS, EACCES, SQLite's
    "attempt to write a readonly database"); None for any other error. Whoever writes the state dir (the CLI
    for every command, atomic_write for the files) turns these into one clean error instead of a traceback
    or Optuna's "exceeding max length"."""
    for e in _chain(exc):
        text = str(e).lower()
        name = getattr(e, "filename", None)
        d = Path(name).parent if isinstance(name, str) and name else Path(where)
        if (isinstance(e, OSError) and e.errno in _FULL) or any(t in text for t in _SQLITE_FULL):
            return StateError(f"{d}: no space left on the device (disk full): nothing more could be written "
                              "there; free space (or give a --state-dir on another file system) and run the "
                              "command again; what was recorded before stays")
        read_only = isinstance(e, OSError) and (e.errno == errno.EROFS or (e.errno == errno.EACCES and name))
        if read_only or any(t in text for t in _SQLITE_READ_ONLY):
            return StateError(f"{d} is read-only (or not writable by this user): the state dir must be writable, "
                              "even to read its Optuna store (SQLite writes its lock files there); make it writable, "
                              "or copy the state dir and point --state-dir at the copy")
    return None
