"""A real PostgreSQL server for tests and experiments: initdb in a temporary folder, bound to 127.0.0.1.

    with start_postgres() as pg:          # one server per test module (a few seconds to start)
        url = pg.create_database("study")  # postgresql+psycopg://tuner@127.0.0.1:<port>/study
        env = pg.env()                     # PGPASSWORD: the password never appears in a URL
        pg.restart(down_s=3)               # stop, stay down, start again (same data)

PostgreSQL refuses to run as root: as root the server runs as the unprivileged user `postgres` (the
Debian package's), through runuser. The binaries come from PATH or /usr/lib/postgresql/<version>/bin.
"""

from __future__ import annotations

import contextlib
import glob
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

USER = "tuner"


def pg_bin(name: str) -> str:
    """The path of a PostgreSQL program (initdb, pg_ctl, postgres...)."""
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.access(os.path.join(d, name), os.X_OK):
            return os.path.join(d, name)
    found = shutil.which(name)
    if found:
        return found
    raise FileNotFoundError(f"PostgreSQL's {name} not found (apt-get install postgresql)")


def available() -> bool:
    try:
        pg_bin("initdb")
        pg_bin("pg_ctl")
    except FileNotFoundError:
        return False
    return os.geteuid() != 0 or shutil.which("runuser") is not None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_server_user(argv: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return argv
    return ["runuser", "-u", "postgres", "--", *argv]


@dataclass
class PgServer:
    root: Path
    port: int
    password: str

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def log_file(self) -> Path:
        return self.root / "server.log"

    def url(self, database: str = "postgres", driver: str = "postgresql+psycopg") -> str:
        return f"{driver}://{USER}@127.0.0.1:{self.port}/{database}"

    def env(self) -> dict[str, str]:
        """The environment of a process that talks to this server (libpq reads PGPASSWORD)."""
        return {**os.environ, "PGPASSWORD": self.password}

    def _ctl(self, *args: str, timeout_s: float = 60) -> None:
        subprocess.run(_as_server_user([pg_bin("pg_ctl"), "-D", str(self.data_dir), *args]), check=True,
                       timeout=timeout_s, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)

    def start(self) -> None:
        opts = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off "
                "-c full_page_writes=off -c max_connections=200")
        self._ctl("-w", "-t", "60", "-l", str(self.log_file), "-o", opts, "start", timeout_s=90)

    def stop(self) -> None:
        self._ctl("-w", "-t", "60", "-m", "fast", "stop")

    def restart(self, down_s: float = 0.0) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()

    def sql(self, statement: str, database: str = "postgres") -> None:
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user=USER, password=self.password,
                             dbname=database, autocommit=True) as conn:
            conn.execute(statement)  # type: ignore[arg-type]

    def create_database(self, name: str) -> str:
        self.sql(f'CREATE DATABASE "{name}"')
        return self.url(name)


@contextlib.contextmanager
def start_postgres() -> Iterator[PgServer]:
    root = Path(tempfile.mkdtemp(prefix="tuner-pg-"))
    password = secrets.token_urlsafe(16)
    (root / "pw").write_text(password)
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(root / "pw", "postgres")
    os.chmod(root, 0o700)
    server = PgServer(root=root, port=free_port(), password=password)
    try:
        subprocess.run(_as_server_user([pg_bin("initdb"), "-D", str(server.data_dir), "-U", USER, "-A",
                                        "scram-sha-256", f"--pwfile={root / 'pw'}", "--no-sync"]),
                       check=True, timeout=120, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        server.start()
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
