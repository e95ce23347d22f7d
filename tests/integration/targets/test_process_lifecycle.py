"""ServerProcess and ProcessTarget with real subprocesses that fail on purpose (tests/support/faulty_server.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from tuner.errors import DeployError, Interrupted, NotReadyError, OutOfMemoryError, TrialError, WorkloadError
from tuner.measure.measurement import Measurement
from tuner.targets.base import TrialContext
from tuner.targets.process import (
    ProcessTarget,
    ServerProcess,
    classify_failure,
    free_port,
    pid_alive,
    process_start_ticks,
    reap_orphans,
)

SUPPORT = Path(__file__).resolve().parents[2] / "support"
FAULTY = SUPPORT / "faulty_server.py"
REPO = Path(__file__).resolve().parents[3]


def faulty_argv(port: int, *extra: str) -> list[str]:
    return [sys.executable, str(FAULTY), "--port", str(port), *extra]


def server(tmp_path: Path, *extra: str, port: int | None = None, **kw: Any) -> ServerProcess:
    port = port or free_port()
    return ServerProcess(faulty_argv(port, *extra), log_path=tmp_path / "logs" / "s.log", state_dir=tmp_path,
                         health_url=f"http://127.0.0.1:{port}/health", **kw)


def wait_dead(pid: int, timeout_s: float = 10.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return not pid_alive(pid)


# ---------------------------------------------------------------- classified start-up failures
def test_unrecognized_argument_is_invalid_config(tmp_path: Path) -> None:
    s = server(tmp_path, "--swap-space", "4")
    s.start()
    try:
        with pytest.raises(DeployError) as ei:
            s.wait_ready(30)
    finally:
        s.stop()
    assert ei.value.cause == "invalid_config"
    assert "unrecognized arguments: --swap-space 4" in str(ei.value)  # the log tail is in the message
    assert s.returncode == 2


@pytest.mark.parametrize("mode", ["oom", "nokvcache"])
def test_out_of_memory_at_startup(tmp_path: Path, mode: str) -> None:
    s = server(tmp_path, "--mode", mode)
    s.start()
    try:
        with pytest.raises(OutOfMemoryError) as ei:
            s.wait_ready(30)
    finally:
        s.stop()
    assert ei.value.cause == "out_of_memory"
    assert "exit status 1" in str(ei.value)
    assert "memory" in ei.value.log_tail


def test_value_error_at_startup_is_invalid_config(tmp_path: Path) -> None:
    s = server(tmp_path, "--mode", "valueerror")
    s.start()
    try:
        with pytest.raises(DeployError) as ei:
            s.wait_ready(30)
    finally:
        s.stop()
    assert ei.value.cause == "invalid_config"
    assert "max_num_batched_tokens (16)" in str(ei.value)


def test_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        s = server(tmp_path, port=port)
        s.start()
        try:
            with pytest.raises(DeployError) as ei:
                s.wait_ready(30)
        finally:
            s.stop()
    assert ei.value.cause == "port_in_use"


def test_hang_is_startup_timeout_and_is_torn_down(tmp_path: Path) -> None:
    s = server(tmp_path, "--mode", "hang")
    s.start()
    pid = s.pid
    assert pid is not None
    t0 = time.monotonic()
    with pytest.raises(NotReadyError) as ei:
        s.wait_ready(1.5, poll_s=0.05)
    assert time.monotonic() - t0 >= 1.4
    assert ei.value.cause == "startup_timeout"
    assert "loading model weights" in str(ei.value)
    s.stop(grace_s=2)
    assert wait_dead(pid)
    assert not (tmp_path / "pids" / f"{pid}.json").exists()


def test_stop_event_interrupts_waiting_for_ready(tmp_path: Path) -> None:
    s = server(tmp_path, "--mode", "hang")
    stop = threading.Event()
    s.start()
    threading.Timer(0.3, stop.set).start()
    t0 = time.monotonic()
    try:
        with pytest.raises(Interrupted):
            s.wait_ready(600, stop_event=stop)
    finally:
        s.stop(grace_s=2)
    assert time.monotonic() - t0 < 60  # not the 600 s wait (generous: a busy host stretches the 2 s grace)


# ---------------------------------------------------------------- environment, log, teardown
def test_ready_server_gets_its_gpus_and_logs_to_its_file(tmp_path: Path) -> None:
    s = server(tmp_path, gpus=(2, 3), env={"EXTRA_VAR": "1"})
    with s:
        ready_s = s.wait_ready(30)
        assert ready_s > 0
        entry = json.loads((tmp_path / "pids" / f"{s.pgid}.json").read_text())
        assert entry["argv"] == s.argv and entry["start_ticks"] == process_start_ticks(s.pid or -1)
        assert os.getpgid(s.pid or -1) == s.pid  # its own process group
    assert "CUDA_VISIBLE_DEVICES=2,3" in s.log_tail()
    assert not (tmp_path / "pids" / f"{s.pgid}.json").exists()


def test_teardown_escalates_to_sigkill_and_kills_the_whole_group(tmp_path: Path) -> None:
    child_file = tmp_path / "child.pid"
    s = server(tmp_path, "--mode", "spawn-child", "--child-pid-file", str(child_file))
    s2 = server(tmp_path, "--mode", "ignore-term")
    s.start()
    s2.start()
    s.wait_ready(30)
    s2.wait_ready(30)
    child = int(child_file.read_text())
    assert pid_alive(child)
    s.stop(grace_s=2)
    assert wait_dead(child), "the grandchild in the server's group must die with it"
    t0 = time.monotonic()
    rc = s2.stop(grace_s=0.5)
    assert rc == -signal.SIGKILL, "a server that ignores SIGTERM gets SIGKILL"
    assert time.monotonic() - t0 < 60  # the 0.5 s grace, then SIGKILL: not a wait for the server
    assert s2.stop() == rc  # idempotent


# ---------------------------------------------------------------- classification as a function
@pytest.mark.parametrize(
    ("tail", "rc", "phase", "kw", "cls", "cause"),
    [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried", 1, "startup", {}, OutOfMemoryError, "out_of_memory"),
        ("ValueError: No available memory for the cache blocks.", 1, "startup", {}, OutOfMemoryError,
         "out_of_memory"),
        ("RuntimeError: CUDA out of memory.", -9, "run", {}, OutOfMemoryError, "out_of_memory"),
        ("usage: vllm serve [-h]\nvllm serve: error: unrecognized arguments: --task generate", 2, "startup", {},
         DeployError, "invalid_config"),
        ("OSError: [Errno 98] Address already in use", 1, "startup", {}, DeployError, "port_in_use"),
        ("loading...", None, "startup", {"timed_out": True}, NotReadyError, "startup_timeout"),
        ("Segmentation fault", -11, "run", {}, WorkloadError, "crashed_during_run"),
        ("", None, "run", {"server_errors": 7, "requests": 10}, WorkloadError, "server_errors"),
        ("something else", 1, "startup", {}, DeployError, "crashed_at_startup"),
    ],
)
def test_classify_failure(tail: str, rc: int | None, phase: str, kw: dict[str, Any],
                          cls: type[TrialError], cause: str) -> None:
    err = classify_failure(tail, rc, phase=phase, **kw)
    assert type(err) is cls
    assert err.cause == cause
    assert err.log_tail == tail


# ---------------------------------------------------------------- ProcessTarget.deploy
class FaultyOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: str = "ok"
    startup_timeout_s: float = 30.0
    model: str = "fake"


class FaultyTarget(ProcessTarget):
    kind = "faulty"
    Options = FaultyOptions

    def build_command(self, params: Mapping[str, Any], ctx: TrialContext, port: int
                      ) -> tuple[list[str], dict[str, str]]:
        mode = str(params.get("mode", getattr(self.options, "mode", "ok")))
        extra = [str(a) for a in params.get("extra", [])]
        return faulty_argv(port, "--mode", mode, *extra), {"TRIAL": str(ctx.trial_number)}

    def gpus_needed(self, params: Mapping[str, Any]) -> int:
        return 1


def make_target(tmp_path: Path, **opts: Any) -> FaultyTarget:
    return FaultyTarget(FaultyOptions(**opts), agent_dir=tmp_path)


def post(url: str) -> int:
    req = urllib.request.Request(url, data=json.dumps({"prompt": "x", "max_tokens": 2}).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            r.read()
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return -1


def test_deploy_yields_ready_deployment_and_tears_down(tmp_path: Path) -> None:
    target = make_target(tmp_path)
    ctx = TrialContext(trial_number=3, state_dir=tmp_path, gpus=(5,))
    with target.deploy({}, ctx) as dep:
        assert dep.cold_start_s > 0
        assert dep.endpoint and dep.endpoint.startswith("http://127.0.0.1:")
        assert post(f"{dep.endpoint}/v1/completions") == 200
        pid = dep.server.pid
        assert pid is not None and pid_alive(pid)
        assert dep.log_path == tmp_path / "logs" / "trial-3.log"
    assert wait_dead(pid)
    assert "CUDA_VISIBLE_DEVICES=5" in (tmp_path / "logs" / "trial-3.log").read_text()
    assert list((tmp_path / "pids").glob("*.json")) == []


def test_deploy_classifies_startup_failures(tmp_path: Path) -> None:
    target = make_target(tmp_path)
    cases: list[tuple[dict[str, Any], str]] = [({"mode": "oom"}, "out_of_memory"),
                                               ({"extra": ["--max-num-partial-prefills", "2"]}, "invalid_config")]
    for params, cause in cases:
        ctx = TrialContext(trial_number=1, state_dir=tmp_path)
        with pytest.raises(TrialError) as ei:
            with target.deploy(params, ctx):
                pytest.fail("must not become ready")
        assert ei.value.cause == cause


def test_deploy_startup_timeout(tmp_path: Path) -> None:
    target = make_target(tmp_path, startup_timeout_s=1.0)
    with pytest.raises(NotReadyError):
        with target.deploy({"mode": "hang"}, TrialContext(trial_number=2, state_dir=tmp_path)):
            pytest.fail("must not become ready")
    assert list((tmp_path / "pids").glob("*.json")) == []


def test_deploy_stops_promptly_when_stop_event_is_set(tmp_path: Path) -> None:
    target = make_target(tmp_path, startup_timeout_s=600)
    ctx = TrialContext(trial_number=2, state_dir=tmp_path)
    threading.Timer(0.3, ctx.stop_event.set).start()
    t0 = time.monotonic()
    with pytest.raises(Interrupted):
        with target.deploy({"mode": "hang"}, ctx):
            pytest.fail("must not become ready")
    assert time.monotonic() - t0 < 60  # not the 600 s start-up timeout


def test_server_dying_mid_run_is_crashed_during_run(tmp_path: Path) -> None:
    target = make_target(tmp_path)
    ctx = TrialContext(trial_number=4, state_dir=tmp_path)
    with target.deploy({"mode": "die", "extra": ["--die-after-requests", "1"]}, ctx) as dep:
        assert post(f"{dep.endpoint}/v1/completions") == 200
        assert post(f"{dep.endpoint}/v1/completions") == -1  # the server dies on the second request
        assert dep.server.proc is not None
        dep.server.proc.wait(timeout=10)
        with pytest.raises(WorkloadError) as ei:
            dep.check_after_run(Measurement(summary={"completed": 1, "failed": 1}))
    assert ei.value.cause == "crashed_during_run"
    assert "exit status 3" in str(ei.value) and "engine core died" in str(ei.value)


def test_5xx_answers_above_threshold_are_server_errors(tmp_path: Path) -> None:
    target = make_target(tmp_path)
    ctx = TrialContext(trial_number=5, state_dir=tmp_path)
    with target.deploy({"mode": "http500"}, ctx) as dep:
        statuses = [post(f"{dep.endpoint}/v1/completions") for _ in range(4)]
        assert statuses == [500] * 4
        dep.check_after_run(Measurement(summary={"completed": 100, "failed": 1, "errors_http_5xx": 1}))
        with pytest.raises(WorkloadError) as ei:
            dep.check_after_run(Measurement(summary={"completed": 0, "failed": 4, "errors_http_5xx": 4}))
    assert ei.value.cause == "server_errors"


def test_command_preview_uses_placeholder_port_and_gpus(tmp_path: Path) -> None:
    target = make_target(tmp_path)
    argv, env = target.command_preview({}, TrialContext(trial_number=0, state_dir=tmp_path, gpus=(0, 1)))
    assert argv[argv.index("--port") + 1] == "8000"
    assert env == {"CUDA_VISIBLE_DEVICES": "0,1", "TRIAL": "0"}


# ---------------------------------------------------------------- a killed tuner leaves nothing behind
def _host_with_server(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path, int, int, int]:
    """A stand-in tuner (tests/support/fault_host.py) whose ready server has a child of its own.
    Returns the host, the state dir, the guard's PID (the group leader), the server's and its child's."""
    state = tmp_path / "state"
    info = tmp_path / "info.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    host = subprocess.Popen([sys.executable, str(SUPPORT / "fault_host.py"), str(state), str(info),
                             "--mode", "spawn-child", "--child-pid-file", str(tmp_path / "child.pid"),
                             "--pid-file", str(tmp_path / "server.pid")], env=env)
    end = time.monotonic() + 60
    while not info.exists():
        assert host.poll() is None, "the host process died early"
        assert time.monotonic() < end, "the host's server never became ready"
        time.sleep(0.05)
    guard = json.loads(info.read_text())["server_pid"]
    server = int((tmp_path / "server.pid").read_text())
    child = int((tmp_path / "child.pid").read_text())
    assert all(pid_alive(p) for p in (guard, server, child)) and len({guard, server, child}) == 3
    assert os.getpgid(server) == os.getpgid(child) == guard
    assert (state / "pids" / f"{guard}.json").exists()
    return host, state, guard, server, child


def _kill_all(*pids: int) -> None:
    for pid in pids:
        if pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_sigkilled_host_takes_its_server_and_the_servers_children_down(tmp_path: Path) -> None:
    host, state, guard, server, child = _host_with_server(tmp_path)
    try:
        host.send_signal(signal.SIGKILL)
        host.wait(timeout=10)
        # the guard sees its lifeline close and stops the whole group: server and grandchild alike
        for pid in (server, child, guard):
            assert wait_dead(pid), f"process {pid} outlived its SIGKILLed tuner"
        assert reap_orphans(state) == []  # nothing left to reap; the stale entry goes
        assert list((state / "pids").glob("*.json")) == []
    finally:
        if host.poll() is None:
            host.kill()
        _kill_all(guard, server, child)


def test_a_group_whose_guard_died_too_is_reaped_at_the_next_start(tmp_path: Path) -> None:
    host, state, guard, server, child = _host_with_server(tmp_path)
    try:
        os.kill(guard, signal.SIGKILL)  # e.g. `kill -9` of both: nothing is left to stop the group
        host.send_signal(signal.SIGKILL)
        host.wait(timeout=10)
        assert wait_dead(guard)
        assert pid_alive(server) and pid_alive(child)
        assert reap_orphans(state) == [guard]  # the group outlives its leader: killed by its PGID
        assert wait_dead(server) and wait_dead(child), "reap_orphans must kill what is left of the group"
        assert list((state / "pids").glob("*.json")) == []
    finally:
        if host.poll() is None:
            host.kill()
        _kill_all(guard, server, child)


def test_reap_orphans_spares_live_owners_and_reused_pids(tmp_path: Path) -> None:
    reg = tmp_path / "pids"
    reg.mkdir()
    victim = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        ticks = process_start_ticks(victim.pid)
        me = {"owner_pid": os.getpid(), "owner_start_ticks": process_start_ticks(os.getpid())}
        dead_owner = {"owner_pid": 2**22 + 1, "owner_start_ticks": 1}
        # 1. owned by a live tuner (this one): left alone
        (reg / f"{victim.pid}.json").write_text(json.dumps({"pgid": victim.pid, "start_ticks": ticks, **me}))
        assert reap_orphans(tmp_path) == []
        assert (reg / f"{victim.pid}.json").exists() and victim.poll() is None
        # 2. owner dead but the PID now belongs to another process (start time differs): spared, entry dropped
        (reg / f"{victim.pid}.json").write_text(
            json.dumps({"pgid": victim.pid, "start_ticks": (ticks or 0) + 12345, **dead_owner}))
        assert reap_orphans(tmp_path) == []
        assert victim.poll() is None
        assert not (reg / f"{victim.pid}.json").exists()
        # 3. owner dead, same process: killed
        (reg / f"{victim.pid}.json").write_text(json.dumps({"pgid": victim.pid, "start_ticks": ticks,
                                                            **dead_owner}))
        assert reap_orphans(tmp_path) == [victim.pid]
        assert victim.wait(timeout=5) == -signal.SIGKILL
        # 4. garbage entries are removed
        (reg / "junk.json").write_text("{not json")
        assert reap_orphans(tmp_path) == []
        assert list(reg.iterdir()) == []
    finally:
        if victim.poll() is None:
            victim.kill()


@pytest.mark.parametrize(("code", "want"), [("raise SystemExit(7)", 7),
                                            ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)",
                                             -signal.SIGSEGV)])
def test_the_guard_exits_with_the_servers_status(code: str, want: int) -> None:
    from tuner.targets.process import GUARD

    r, w = os.pipe()
    try:
        proc = subprocess.run([sys.executable, "-I", str(GUARD), str(r), "--", sys.executable, "-c", code],
                              pass_fds=(r,), timeout=30, capture_output=True)
    finally:
        os.close(r)
        os.close(w)
    assert proc.returncode == want, proc.stderr


def test_a_missing_program_is_invalid_config_before_anything_starts(tmp_path: Path) -> None:
    server = ServerProcess(["no-such-server-binary", "--port", "1"], log_path=tmp_path / "s.log",
                           state_dir=tmp_path)
    with pytest.raises(DeployError, match="no such program") as info:
        server.start()
    assert info.value.cause == "invalid_config" and server.proc is None
