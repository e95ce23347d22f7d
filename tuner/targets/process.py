"""Subprocess lifecycle shared by every server target (vLLM, the torch engine, any command).

One careful way to start a server:

- an argument list, never a shell; the trial's environment (CUDA_VISIBLE_DEVICES for its GPUs);
- its own process group (``process_group=0``; not a new session: on Linux a new session is also a new
  scheduler autogroup, which gets one share of the CPU against every other session, so on a shared host the
  server starved its own front end: see docs/metrics.md), led by a guard (``tuner/targets/guard.py``) that runs
  the server as its child and takes the whole group down, the server's own children included, when the tuner
  dies however it dies (the guard holds the read end of a pipe only the tuner can write: EOF means gone);
- a PID registry in the state dir (``<state-dir>/pids/<pgid>.json``) that :func:`reap_orphans` reads on the
  next start, killing the groups whose owner died and whose recorded start time still matches;
- readiness by polling a health URL with a deadline, failing fast when the process exits;
- stdout and stderr to one log file per trial; its tail goes into every failure message;
- teardown: SIGTERM to the whole group, then SIGKILL after a grace period (idempotent).

Failures are classified by :func:`classify_failure` into TrialError subclasses whose ``cause`` the study
records (out_of_memory, invalid_config, port_in_use, startup_timeout, crashed_during_run, server_errors).

The guard exits with the server's own status (code or signal), so classification sees what the server did.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from tuner.base.files import private_file
from tuner.base.proc import free_port, group_alive, pid_alive, process_start_ticks
from tuner.base.redact import redact_text
from tuner.errors import (
    DeployError,
    Interrupted,
    NotReadyError,
    OutOfMemoryError,
    TrialError,
    WorkloadError,
)
from tuner.measure.measurement import Measurement
from tuner.spec import WorkloadSpec
from tuner.targets.base import Deployment, Target, TrialContext

log = logging.getLogger(__name__)

PREVIEW_PORT = 8000  # the port command_preview shows in place of a free one
LOG_TAIL_LINES = 40
GUARD = Path(__file__).with_name("guard.py")

# ---------------------------------------------------------------- failure classification
# (cause, error class, patterns) in priority order: the first match wins.
_OOM_PATTERNS = (
    r"CUDA out of memory",
    r"torch\.OutOfMemoryError",
    r"torch\.cuda\.OutOfMemoryError",
    r"No available memory for the cache blocks",
    r"CUDA error: out of memory",
    r"\bOutOfMemoryError\b",
    r"insufficient (GPU|KV cache) memory",
    r"is larger than the maximum number of tokens that can be stored in KV cache",
)
_PORT_PATTERNS = (r"Address already in use", r"\[Errno 98\]")
_INVALID_PATTERNS = (
    r"error: unrecognized arguments",
    r"error: argument ",
    r"error: the following arguments are required",
    r"^usage: ",
    r"\bValueError\b",
    r"pydantic.*ValidationError",
    r"\bValidationError\b",
)

CAUSE_OOM = "out_of_memory"
CAUSE_INVALID = "invalid_config"
CAUSE_PORT = "port_in_use"
CAUSE_TIMEOUT = "startup_timeout"
CAUSE_CRASH_RUN = "crashed_during_run"
CAUSE_SERVER_ERRORS = "server_errors"
CAUSE_CRASH_START = "crashed_at_startup"


def _search(patterns: Sequence[str], text: str) -> bool:
    return any(re.search(p, text, flags=re.MULTILINE) for p in patterns)


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


def classify_failure(
    log_tail: str,
    returncode: int | None,
    *,
    phase: str,
    timed_out: bool = False,
    server_errors: int = 0,
    requests: int = 0,
) -> TrialError:
    """Turn what a failed server left behind into a classified TrialError.

    phase: "startup" (before ready) or "run" (while measuring). The log tail decides first (an OOM is an
    OOM whether it struck at start-up or mid-run), then the phase and the exit status.
    """
    status = describe_exit(returncode)
    tail = log_tail.rstrip()
    where = f"\n--- server log tail ---\n{tail}" if tail else ""
    if _search(_OOM_PATTERNS, log_tail):
        return OutOfMemoryError(f"server ran out of GPU memory ({phase}, {status}){where}",
                                cause=CAUSE_OOM, log_tail=log_tail)
    if _search(_PORT_PATTERNS, log_tail):
        return DeployError(f"server port already in use ({status}){where}",
                           cause=CAUSE_PORT, log_tail=log_tail)
    if phase == "startup" and _search(_INVALID_PATTERNS, log_tail):
        return DeployError(f"server rejected its configuration ({status}){where}",
                           cause=CAUSE_INVALID, log_tail=log_tail)
    if phase == "startup" and timed_out:
        return NotReadyError(f"server not ready before its deadline ({status}){where}",
                             cause=CAUSE_TIMEOUT, log_tail=log_tail)
    if phase == "run" and returncode is None and server_errors:
        return WorkloadError(f"server answered {server_errors} of {requests} requests with 5xx{where}",
                             cause=CAUSE_SERVER_ERRORS, log_tail=log_tail)
    if phase == "run":
        return WorkloadError(f"server died while measuring ({status}){where}",
                             cause=CAUSE_CRASH_RUN, log_tail=log_tail)
    return DeployError(f"server exited before it was ready ({status}){where}",
                       cause=CAUSE_CRASH_START, log_tail=log_tail)


# ---------------------------------------------------------------- PID registry
def _registry_dir(state_dir: Path) -> Path:
    return Path(state_dir) / "pids"


def reap_orphans(state_dir: str | Path) -> list[int]:
    """Kill the server groups that a dead tuner left behind; remove their registry entries.

    An entry is reaped when its owner (the tuner process that started it) is gone. Its group is killed
    only if the recorded leader's start time still matches (the PID was not reused), or if the leader is
    gone but members of its group remain (a PGID cannot be reused while its group exists).
    Returns the process-group ids that were killed.
    """
    reg = _registry_dir(Path(state_dir))
    killed: list[int] = []
    if not reg.is_dir():
        return killed
    for path in sorted(reg.glob("*.json")):
        try:
            entry = json.loads(path.read_text())
            pgid = int(entry["pgid"])
            start = entry.get("start_ticks")
            owner = int(entry.get("owner_pid", -1))
            owner_start = entry.get("owner_start_ticks")
        except (OSError, ValueError, KeyError, TypeError):
            log.warning("removing unreadable PID registry entry %s", path)
            path.unlink(missing_ok=True)
            continue
        owner_alive = owner > 0 and process_start_ticks(owner) == owner_start and pid_alive(owner)
        if owner_alive:
            continue  # a live tuner (maybe this one) still owns it
        leader_ticks = process_start_ticks(pgid)
        same_leader = leader_ticks is not None and leader_ticks == start
        leader_gone = leader_ticks is None
        if (same_leader or leader_gone) and group_alive(pgid):
            log.warning("reaping orphaned server group %d (%s)", pgid,
                        redact_text(" ".join(entry.get("argv", [])))[:200])
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
            killed.append(pgid)
        path.unlink(missing_ok=True)
    return killed


# ---------------------------------------------------------------- one server process
class ServerProcess:
    """One server subprocess in its own process group, with a log file and a registry entry.

    Use as a context manager (start on enter, stop on exit) or call start()/stop() yourself.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        gpus: Sequence[int] | None = None,
        state_dir: Path | None = None,
        health_url: str | None = None,
        cwd: Path | None = None,
        grace_s: float = 10.0,
    ) -> None:
        if not argv or not all(isinstance(a, str) for a in argv):
            raise TypeError("argv must be a non-empty list of strings")
        self.argv = list(argv)
        self.log_path = Path(log_path)
        self.extra_env = dict(env or {})
        self.gpus = tuple(gpus) if gpus is not None else None
        self.state_dir = Path(state_dir) if state_dir is not None else None
        self.health_url = health_url
        self.cwd = cwd
        self.grace_s = grace_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at: float | None = None
        self._registry_path: Path | None = None
        self._log_offset = 0
        self._stopped = False
        self._lock = threading.Lock()
        self._lifeline: int | None = None  # write end of the guard's lifeline pipe

    # -- environment
    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in self.gpus)
        env.update(self.extra_env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def pgid(self) -> int | None:
        return self.pid  # process_group=0 makes the child the leader of its own group

    @property
    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # -- start
    def start(self) -> None:
        if self.proc is not None:
            raise RuntimeError("ServerProcess already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        shown = redact_text(shlex.join(self.argv))  # a URL's password or token stays out of logs and artifacts
        log.info("starting server: %s (log %s)", shown, self.log_path)
        with open(private_file(self.log_path), "ab") as logf:
            self._log_offset = logf.tell()  # the tail of *this* run only (the file may hold earlier ones)
            logf.write(f"$ {shown}\n".encode())
            logf.flush()
            env = self.environment()
            if not _findable(self.argv[0], env.get("PATH"), self.cwd):
                raise DeployError(f"cannot start {self.argv[0]!r}: no such program (PATH and working directory "
                                  "searched)", cause=CAUSE_INVALID)
            lifeline_r, self._lifeline = os.pipe()  # only this process holds the write end
            try:
                self.proc = subprocess.Popen(  # noqa: S603 - an argument list, never a shell
                    [sys.executable, "-I", str(GUARD), str(lifeline_r), "--", *self.argv],
                    stdin=subprocess.DEVNULL,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=self.cwd,
                    process_group=0,
                    pass_fds=(lifeline_r,),
                )
            except OSError as exc:
                self._close_lifeline()
                raise DeployError(f"cannot start {self.argv[0]!r}: {exc}", cause=CAUSE_INVALID) from exc
            finally:
                os.close(lifeline_r)
        self.started_at = time.monotonic()
        self._register()

    def _register(self) -> None:
        if self.state_dir is None or self.proc is None:
            return
        reg = _registry_dir(self.state_dir)
        reg.mkdir(parents=True, exist_ok=True)
        pid = self.proc.pid
        entry = {
            "pgid": pid,
            "pid": pid,
            "argv": self.argv,
            "start_ticks": process_start_ticks(pid),
            "started_at_unix": time.time(),
            "owner_pid": os.getpid(),
            "owner_start_ticks": process_start_ticks(os.getpid()),
            "log": str(self.log_path),
        }
        path = reg / f"{pid}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(entry))
        tmp.replace(path)
        self._registry_path = path

    # -- readiness
    def wait_ready(
        self,
        timeout_s: float,
        *,
        stop_event: threading.Event | None = None,
        poll_s: float = 0.2,
    ) -> float:
        """Poll the health URL until it answers 200; return seconds since start.

        Raises a classified TrialError if the process exits first or the deadline passes, and
        Interrupted if stop_event is set.
        """
        if self.proc is None or self.started_at is None:
            raise RuntimeError("ServerProcess not started")
        if self.health_url is None:
            raise RuntimeError("no health URL to poll")
        deadline = self.started_at + timeout_s
        while True:
            rc = self.proc.poll()
            if rc is not None:
                raise classify_failure(self.log_tail(), rc, phase="startup")
            if stop_event is not None and stop_event.is_set():
                raise Interrupted("stop requested while the server was starting")
            if _http_ok(self.health_url, timeout_s=max(0.5, min(2.0, poll_s * 5))):
                return time.monotonic() - self.started_at
            if time.monotonic() >= deadline:
                raise classify_failure(self.log_tail(), self.proc.poll(), phase="startup", timed_out=True)
            if stop_event is not None:
                stop_event.wait(poll_s)
            else:
                time.sleep(poll_s)

    # -- logs
    def log_tail(self, lines: int = LOG_TAIL_LINES, max_bytes: int = 64 * 1024) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(self._log_offset, size - max_bytes))
                data = f.read().decode("utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(data.splitlines()[-lines:])

    # -- teardown
    def stop(self, grace_s: float | None = None) -> int | None:
        """SIGTERM the whole group, SIGKILL it after the grace period. Idempotent. Returns the exit status."""
        with self._lock:
            if self.proc is None:
                return None
            if self._stopped:
                return self.proc.returncode
            self._stopped = True
            grace = self.grace_s if grace_s is None else grace_s
            pgid = self.proc.pid
            if self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGTERM)
                try:
                    self.proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    log.warning("server group %d ignored SIGTERM for %.1f s: SIGKILL", pgid, grace)
            # the leader may be gone while its children linger: kill what is left of the group
            if group_alive(pgid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=max(grace, 5.0))
            _wait_group_gone(pgid, timeout_s=5.0)
            self._close_lifeline()
            if self._registry_path is not None:
                self._registry_path.unlink(missing_ok=True)
            log.info("server group %d stopped (%s)", pgid, describe_exit(self.proc.returncode))
            return self.proc.returncode

    def _close_lifeline(self) -> None:
        if self._lifeline is not None:
            with contextlib.suppress(OSError):
                os.close(self._lifeline)
            self._lifeline = None

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _findable(program: str, path: str | None, cwd: Path | None) -> bool:
    """Whether exec would find `program`: a path (relative to cwd) to an executable file, or a name on PATH."""
    if os.sep in program:
        p = Path(program) if Path(program).is_absolute() else Path(cwd or ".") / program
        return p.is_file() and os.access(p, os.X_OK)
    return shutil.which(program, path=path) is not None


def _wait_group_gone(pgid: int, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while group_alive(pgid) and time.monotonic() < end:
        time.sleep(0.05)


def _http_ok(url: str, timeout_s: float) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - our own local URL
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


# ---------------------------------------------------------------- HTTP deployment
class HttpDeployment(Deployment):
    """A running server reached over HTTP; measure() drives the workload through measure_endpoint."""

    def __init__(
        self,
        *,
        server: ServerProcess,
        endpoint: str,
        model: str,
        ctx: TrialContext,
        agent_dir: Path,
        metrics_url: str | None,
        cold_start_s: float,
        max_server_error_frac: float,
        tokenizer: str | None = None,
    ) -> None:
        self.server = server
        self.base_url = endpoint
        self.endpoint = endpoint
        self.model = model
        self.ctx = ctx
        self.agent_dir = agent_dir
        self.metrics_url = metrics_url
        self.cold_start_s = cold_start_s
        self.log_path = server.log_path
        self.max_server_error_frac = max_server_error_frac
        self.tokenizer = tokenizer

    @property
    def pid(self) -> int | None:
        return self.server.pid

    def measure(self, workload: WorkloadSpec, *, goodput_ms: Mapping[str, float], seed: int) -> Measurement:
        from tuner.measure.loadgen import measure_endpoint

        if self.ctx.stop_event.is_set():
            raise Interrupted("stop requested before the run")
        if not self.server.alive():
            raise classify_failure(self.server.log_tail(), self.server.returncode, phase="run")
        m = measure_endpoint(
            self.base_url,
            model=self.model,
            workload=workload,
            goodput_ms=goodput_ms,
            seed=seed,
            base_dir=self.agent_dir,
            tokenizer=self.tokenizer,
            metrics_url=self.metrics_url,
            gpu_indices=self.ctx.gpus,
            stop_event=self.ctx.stop_event,
            early_stop=self.ctx.early_stop,
        )
        if m.summary.get("interrupted"):
            raise Interrupted("stop requested during the run")
        self.check_after_run(m)
        return dataclasses.replace(m, cold_start_s=self.cold_start_s)

    def check_after_run(self, m: Measurement) -> None:
        """Raise a classified error if the server died during the run or answered too many 5xx."""
        broken = m.summary.get("errors_connect", 0) + m.summary.get("errors_stream_broken", 0)
        if broken and self.server.proc is not None:  # a dying server may take a moment to be reaped
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.server.proc.wait(timeout=2.0)
        if not self.server.alive():
            raise classify_failure(self.server.log_tail(), self.server.returncode, phase="run")
        n5xx = int(m.summary.get("errors_http_5xx", 0))
        total = int(m.summary.get("completed", 0) + m.summary.get("failed", 0))
        if n5xx and total and n5xx / total > self.max_server_error_frac:
            raise classify_failure(self.server.log_tail(), None, phase="run",
                                   server_errors=n5xx, requests=total)


# ---------------------------------------------------------------- the base class of subprocess targets
class ProcessTarget(Target):
    """Base class of targets that start a server subprocess speaking the OpenAI HTTP API.

    Subclasses implement build_command(); they may override model_name(), health_path, metrics_path,
    startup_timeout_s() and host().
    """

    health_path: str = "/health"  # plain attributes: an instance may set its own (from options)
    metrics_path: str | None = "/metrics"
    grace_s: ClassVar[float] = 10.0
    max_server_error_frac: ClassVar[float] = 0.05  # above this share of 5xx answers the trial fails
    port_retries: ClassVar[int] = 3  # free_port() races: retry on "Address already in use"

    def build_command(
        self, params: Mapping[str, Any], ctx: TrialContext, port: int
    ) -> tuple[list[str], dict[str, str]]:
        """The argv (no shell) and the extra environment that start `params` listening on `port`."""
        raise NotImplementedError

    def model_name(self, params: Mapping[str, Any]) -> str:
        return str(getattr(self.options, "model", None) or "default")

    def startup_timeout_s(self) -> float:
        return float(getattr(self.options, "startup_timeout_s", None) or 600.0)

    def host(self) -> str:
        return str(getattr(self.options, "host", None) or "127.0.0.1")

    def tokenizer(self, params: Mapping[str, Any]) -> str | None:
        """What measure_endpoint counts prompt tokens with ("byte", a tokenizer dir, or None: approximate)."""
        return None

    def server_cwd(self) -> Path | None:
        """The working directory of the server process (None: the tuner's)."""
        return None

    def command_preview(
        self, params: Mapping[str, Any], ctx: TrialContext
    ) -> tuple[list[str], dict[str, str]]:
        argv, env = self.build_command(params, ctx, PREVIEW_PORT)
        full_env = {}
        if ctx.gpus:
            full_env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in ctx.gpus)
        full_env.update(env)
        return argv, full_env

    @contextlib.contextmanager
    def deploy(self, params: Mapping[str, Any], ctx: TrialContext) -> Iterator[HttpDeployment]:
        host = self.host()
        url_host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
        last: TrialError | None = None
        reap_orphans(ctx.state_dir)  # servers a killed tuner left behind (live owners are spared)
        for attempt in range(self.port_retries):
            if ctx.stop_event.is_set():
                raise Interrupted("stop requested before the server started")
            port = free_port(url_host)
            argv, env = self.build_command(params, ctx, port)
            base = f"http://{url_host}:{port}"
            server = ServerProcess(
                argv,
                log_path=ctx.log_dir / f"{ctx.log_name}.log",
                env=env,
                gpus=ctx.gpus if ctx.gpus else None,
                state_dir=ctx.state_dir,
                health_url=base + self.health_path,
                cwd=self.server_cwd(),
                grace_s=self.grace_s,
            )
            try:
                server.start()
                cold_start_s = server.wait_ready(self.startup_timeout_s(), stop_event=ctx.stop_event)
            except TrialError as exc:
                server.stop()
                if exc.cause == CAUSE_PORT and attempt + 1 < self.port_retries:
                    log.info("port %d was taken: retrying on another port", port)
                    last = exc
                    continue
                raise
            except BaseException:
                server.stop()
                raise
            try:
                log.info("server ready at %s after %.2f s", base, cold_start_s)
                yield HttpDeployment(
                    server=server,
                    endpoint=base,
                    model=self.model_name(params),
                    ctx=ctx,
                    agent_dir=self.agent_dir,
                    metrics_url=(base + self.metrics_path) if self.metrics_path else None,
                    cold_start_s=cold_start_s,
                    max_server_error_frac=self.max_server_error_frac,
                    tokenizer=self.tokenizer(params),
                )
            finally:
                server.stop()
            return
        assert last is not None
        raise last


# ---------------------------------------------------------------- `tuner validate --show-command`
def format_command(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """An argv and its extra environment as one copy-pasteable shell line (for display only)."""
    parts = [f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    return " ".join([*parts, shlex.join(list(argv))])


__all__ = [
    "HttpDeployment",
    "ProcessTarget",
    "ServerProcess",
    "classify_failure",
    "format_command",
    "free_port",
    "reap_orphans",
]
