"""The daemon against real server processes.

SIGKILL during a trial, then a restart (the reference torch engine, tiny preset on CPU): no finished trial
is lost, nothing stays RUNNING, no server process survives. SIGTERM during a trial (the command target with
tests/support/fake_openai_server.py): the deployment is torn down and the daemon exits 0 in the grace.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from tests.support import agents
from tests.support.logged_proc import finish, output, start_logged
from tuner.study.study import LOST_CAUSES, default_storage, open_storage

REPO = Path(__file__).resolve().parents[3]
FAKE = REPO / "tests" / "support" / "fake_openai_server.py"
# the command agent: the fake server's first-token delay tuned over 10-40 ms, a cycle of 3 trials every 5 s
AGENT = agents.fake_server_agent(
    ttft_ms=[20], itl_ms=25, output_tokens=24, num_requests=12, name="dkill",
    at={"search_space.params.ttft_ms": {"type": "int", "low": 10, "high": 40, "default": 20},
        "workload.prompt_tokens.value": 32},
    schedule={"every": "5s", "trials_per_cycle": 3}, promotion={"verify_runs": 2})

TORCH_AGENT = """\
name: dkill
target: {kind: torch_engine, preset: tiny, device: cpu, cpu_threads: 1, startup_timeout_s: 60}
search_space:
  target: torch_engine
  params:
    batching: {type: categorical, choices: [static, continuous], default: continuous}
    max_batch_size: {type: int, low: 1, high: 8, default: 4}
workload:
  arrival: {kind: closed, concurrency: 2}
  prompt_tokens: {dist: fixed, value: 32}
  output_tokens: {dist: fixed, value: 48}
  num_requests: 12
objectives: [{metric: output_throughput, direction: maximize}]
sampler: {name: random, seed: 0}
tracking: {enabled: false}
schedule: {every: 5s, trials_per_cycle: 3}
promotion: {verify_runs: 2}
"""
HAS_TORCH_TARGET = (REPO / "tuner" / "targets" / "torch_engine.py").is_file()
# waits for real work (a daemon's start, an engine's start, trials): seconds on a quiet host, minutes on one
# whose cores each run a few busy processes beside the test (the first trial of the torch agent took 90 s)
BUSY_S = 300
pytestmark = [pytest.mark.skipif(not FAKE.is_file(), reason="fake server missing"), pytest.mark.timeout(900)]


def start(agent: Path, sd: Path) -> subprocess.Popen[str]:
    """The daemon, its output appended to daemon.log next to the agent (see `log_of`)."""
    return start_logged([sys.executable, "-m", "tuner.cli", "daemon", str(agent), "--state-dir", str(sd),
                         "--port", "-1", "--grace-s", "20"], log_of(agent), REPO)


def log_of(agent: Path) -> Path:
    return agent.with_name("daemon.log")


def trials(sd: Path) -> list[optuna.trial.FrozenTrial]:
    if not (sd / "optuna.db").is_file():
        return []
    try:
        # through the tuner's own opening, so that this read never races the daemon creating the tables
        return optuna.load_study(study_name="dkill", storage=open_storage(default_storage(sd))).trials
    except KeyError:
        return []


def server_groups(sd: Path) -> set[int]:
    reg = sd / "pids"
    return {int(json.loads(p.read_text())["pgid"]) for p in reg.glob("*.json")} if reg.is_dir() else set()


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    # zombies of the group count as gone
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[2]) == pgid and stat[0] != "Z":
                return True
    return False


def wait_for(cond, timeout_s: float, proc: subprocess.Popen[str] | None = None, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the daemon exited {proc.returncode}:\n" + (output(log) if log else ""))
        assert time.monotonic() < deadline, "timed out\n" + (output(log) if log else "")
        time.sleep(0.1)


def setup(tmp_path: Path, kind: str = "command") -> tuple[Path, Path]:
    agent = tmp_path / "dkill.yaml"
    if kind == "command":
        agents.write_spec(agent, AGENT)
    else:
        agent.write_text(TORCH_AGENT)
    sd = tmp_path / "state"
    return agent, sd


@pytest.mark.skipif(not HAS_TORCH_TARGET, reason="torch engine target missing")
def test_sigkill_during_a_trial_then_restart_loses_nothing(tmp_path: Path) -> None:
    agent, sd = setup(tmp_path, "torch_engine")
    proc = start(agent, sd)
    seen: set[int] = set()
    try:
        # a finished trial exists and the next one's server is up: kill the daemon in the middle of it
        def mid_trial() -> bool:
            seen.update(server_groups(sd))
            done = [t for t in trials(sd) if t.state == optuna.trial.TrialState.COMPLETE]
            running = [t for t in trials(sd) if t.state == optuna.trial.TrialState.RUNNING]
            return bool(done) and bool(running) and bool(server_groups(sd))

        wait_for(mid_trial, BUSY_S, proc, log_of(agent))
        groups = server_groups(sd)
        seen |= groups
        before = {t.number: t.values for t in trials(sd) if t.state == optuna.trial.TrialState.COMPLETE}
        running = [t.number for t in trials(sd) if t.state == optuna.trial.TrialState.RUNNING]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert before and running and groups

    proc = start(agent, sd)
    try:
        wait_for(lambda: any(t.state == optuna.trial.TrialState.COMPLETE and t.number > max(running)
                             for t in trials(sd)), BUSY_S, proc, log_of(agent))
        proc.send_signal(signal.SIGTERM)
        out = finish(proc, log_of(agent), 120)
        assert proc.returncode == 0, out[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    after = {t.number: t for t in trials(sd)}
    for n, values in before.items():  # no finished trial lost or changed
        assert after[n].state == optuna.trial.TrialState.COMPLETE and after[n].values == values
    for n in running:  # the killed trial was reaped as lost: `interrupted` (its owner is dead), or
        # `worker_lost` when the restart took longer than its lease (a busy host)
        assert after[n].state == optuna.trial.TrialState.FAIL and after[n].user_attrs["cause"] in LOST_CAUSES
    assert all(t.state != optuna.trial.TrialState.RUNNING for t in after.values())
    seen |= server_groups(sd)
    wait_for(lambda: not any(group_alive(g) for g in seen), 60)
    assert not server_groups(sd)  # registry entries cleaned up


def test_sigterm_during_a_trial_tears_down_and_exits_zero(tmp_path: Path) -> None:
    agent, sd = setup(tmp_path)
    proc = start(agent, sd)
    try:
        wait_for(lambda: bool(server_groups(sd)), BUSY_S, proc, log_of(agent))
        groups = server_groups(sd)
        proc.send_signal(signal.SIGTERM)
        out = finish(proc, log_of(agent), 120)
        # exit 0 is the stop within the grace: a cycle still running when the grace ends exits 1
        assert proc.returncode == 0, out[-3000:]
        assert "daemon stopped cleanly" in out, out[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not any(group_alive(g) for g in groups)
    ts = trials(sd)
    assert ts and all(t.state != optuna.trial.TrialState.RUNNING for t in ts)
    # the trial that was running either finished its measurement or is recorded as interrupted
    assert all(t.state == optuna.trial.TrialState.COMPLETE or t.user_attrs.get("cause") == "interrupted"
               for t in ts if t.state != optuna.trial.TrialState.WAITING)
