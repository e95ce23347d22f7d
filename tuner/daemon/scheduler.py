"""The daemon's main: APScheduler jobs per agent, signals (SIGTERM/SIGINT stop, SIGHUP reload), start-up
reaping, the single-instance lock on the state dir, and the orderly stop within the grace."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType
from typing import IO

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.base import BaseScheduler
from apscheduler.schedulers.blocking import BlockingScheduler
from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

import tuner.daemon.monitoring  # noqa: F401 - registers the monitor as a consumer of the watch
from tuner.agent import Agent, load_agent, locate
from tuner.base.files import private_file
from tuner.context import open_context
from tuner.daemon import runtime
from tuner.daemon.health import heartbeat_loop, serve_endpoint, write_heartbeat
from tuner.daemon.metrics import DaemonMetrics
from tuner.daemon.runtime import AgentState, Runtime, daemon_dir, gpu_groups, job_id
from tuner.daemon.watch import start_watch
from tuner.errors import ConfigError
from tuner.spec import AgentSpec

log = logging.getLogger(__name__)

CYCLE_JOB = "tuner.daemon.cycle:cycle_job"  # APScheduler stores the job's function by this reference


def trigger_for(spec: AgentSpec) -> tuple[BaseTrigger, int]:
    """The agent's schedule as an APScheduler trigger, and its misfire grace in seconds."""
    sched = spec.schedule
    if sched is not None and sched.cron:
        return CronTrigger.from_crontab(sched.cron), 6 * 3600
    every_s = (sched.every_s if sched is not None and sched.every else None) or 6 * 3600.0
    # a cycle that fires late still runs (however long the previous one took, up to a day)
    return IntervalTrigger(seconds=every_s), int(max(every_s * 2, 3600))


def check_schedule(agent: Agent) -> tuple[BaseTrigger, int]:
    """The agent's trigger, or a located ConfigError for a cron APScheduler rejects (e.g. minute 99)."""
    try:
        return trigger_for(agent.spec)
    except ValueError as exc:
        cron = agent.spec.schedule.cron if agent.spec.schedule is not None else None
        raise locate(ConfigError(f"{cron!r} is not a valid cron expression: {exc}", field="schedule.cron"),
                     agent) from None


def run_daemon(agent_paths: Sequence[Path | str], state_dir: Path | str, *, port: int | None = None,
               grace_s: float = 30.0, install_signals: bool = True) -> int:
    """Run until SIGTERM/SIGINT. Returns the exit status (0: clean stop within the grace)."""
    from tuner.base.files import private_dir

    state = private_dir(Path(state_dir).resolve())
    agents = [load_agent(p) for p in agent_paths]
    names = [a.name for a in agents]
    if len(set(names)) != len(names):
        raise ConfigError(f"two agent files share a name: {names}")
    triggers = {a.name: check_schedule(a) for a in agents}
    single = single_instance(state)
    try:
        return _run_locked(agents, state, single, triggers, port=port, grace_s=grace_s,
                           install_signals=install_signals)
    except BaseException:
        if not single.closed:  # a start-up failure: release the state dir for the next daemon
            single.close()
            runtime.install(None)
        raise


def _run_locked(agents: list[Agent], state: Path, single: IO[str], triggers: dict[str, tuple[BaseTrigger, int]],
                *, port: int | None, grace_s: float, install_signals: bool) -> int:
    """run_daemon once the state dir's daemon lock (`single`) is held."""
    groups = gpu_groups({a.name: a.spec.gpus for a in agents})
    group_locks = {g: threading.Lock() for g in set(groups.values())}
    rt = Runtime(state_dir=state, stop=threading.Event(),
                 agents={a.name: AgentState(a.name, a.path.resolve()) for a in agents},
                 locks={n: group_locks[g] for n, g in groups.items()}, metrics=DaemonMetrics(), grace_s=grace_s)
    runtime.install(rt)

    # resume after a SIGKILL: orphan servers and stale RUNNING trials of every agent, before anything new
    for a in agents:
        try:
            session = open_context(a.path, state).session()  # reaps; records the agent's file in the state dir
            if a.spec.rollout is not None:  # a rollout the killed daemon left: revert it before anything new
                from tuner.rollout.rollout import recover_agent

                recover_agent(session)
        except Exception as exc:  # noqa: BLE001 - a broken agent must not keep the others from running
            rt.agents[a.name].last_ok = False
            rt.agents[a.name].last_error = f"start-up: {type(exc).__name__}: {exc}"
            log.error("cannot prepare %s: %s", a.name, exc)

    prune_jobs(state / "jobs.db", {job_id(a.name) for a in agents})
    scheduler = BlockingScheduler(
        jobstores={"default": SQLAlchemyJobStore(url=f"sqlite:///{state / 'jobs.db'}")},
        executors={"default": ThreadPoolExecutor(max_workers=max(1, len(agents)))},
        job_defaults={"coalesce": True, "max_instances": 1}, timezone=timezone.utc)
    rt.scheduler = scheduler
    now = datetime.now(timezone.utc)
    for a in agents:
        trigger, grace = triggers[a.name]
        scheduler.add_job(CYCLE_JOB, trigger=trigger, args=[str(a.path.resolve()), str(state)],
                          id=job_id(a.name), name=f"cycle {a.name}", replace_existing=True, max_instances=1,
                          coalesce=True, misfire_grace_time=grace, next_run_time=now)
    srv = None
    if port is not None:
        srv = serve_endpoint(rt, port)
        rt.port = srv.server_address[1]
        log.info("health and metrics on http://127.0.0.1:%d/health and /metrics", rt.port)
    hb_done = threading.Event()
    write_heartbeat(rt)
    threading.Thread(target=heartbeat_loop, args=(rt, hb_done), name="tuner-heartbeat", daemon=True).start()
    for a in agents:
        st = rt.agents[a.name]
        st.schedule, st.gpus = str(triggers[a.name][0]), a.spec.gpus
        start_watch(rt, st, a.spec)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if rt.stop.is_set():
            return
        log.warning("signal %d: stopping (no new cycle; the running one is torn down)", signum)
        rt.stop.set()
        threading.Thread(target=_shutdown, args=(scheduler,), daemon=True).start()

    def on_hangup(_signum: int, _frame: FrameType | None) -> None:
        threading.Thread(target=reload_agents, args=(rt,), name="tuner-reload", daemon=True).start()

    if install_signals:
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGHUP, on_hangup)
    log.info("daemon pid %d: %d agent(s), state %s", os.getpid(), len(agents), state)
    try:
        if not rt.stop.is_set():
            scheduler.start()
    finally:
        rt.stop.set()
        deadline = time.monotonic() + grace_s
        with rt.idle:
            while rt.in_flight > 0 and time.monotonic() < deadline:
                rt.idle.wait(timeout=max(0.05, deadline - time.monotonic()))
        clean = rt.in_flight == 0
        hb_done.set()
        for st in rt.agents.values():
            if st.watch_stop is not None:
                st.watch_stop.set()
        write_heartbeat(rt, stopped=True)
        if srv is not None:
            srv.shutdown()
        runtime.install(None)
        single.close()
    if not clean:
        log.error("the running cycle did not stop within %.0fs; exiting anyway", grace_s)
        os._exit(1)  # worker threads are stuck: do not wait for them (servers die with us: their guards see us go)
    log.info("daemon stopped cleanly")
    return 0


def reload_agents(rt: Runtime) -> dict[str, list[str]]:
    """Re-read every agent file (SIGHUP). Cycles always read their agent file afresh; this applies what
    lives as long as the daemon: a changed schedule reschedules the agent's job, a changed watch restarts its
    watcher. A file that no longer loads keeps the definition in force. Renaming an agent or changing its
    GPUs needs a restart (the GPU groups are fixed at start-up); that is logged. Returns the changes."""
    changes: dict[str, list[str]] = {}
    for st in list(rt.agents.values()):
        done: list[str] = []
        try:
            agent = load_agent(st.path)
            trigger, grace = trigger_for(agent.spec)
        except Exception as exc:  # noqa: BLE001 - a bad edit must not stop the daemon
            log.error("reload: %s: %s; keeping the definition in force", st.path, exc)
            changes[st.name] = [f"error: {exc}"]
            continue
        if agent.name != st.name:
            log.error("reload: %s now names agent %r (was %r): restart the daemon to rename an agent",
                      st.path, agent.name, st.name)
            changes[st.name] = ["error: renamed"]
            continue
        if str(trigger) != st.schedule and rt.scheduler is not None:
            rt.scheduler.reschedule_job(job_id(st.name), trigger=trigger)
            rt.scheduler.modify_job(job_id(st.name), misfire_grace_time=grace)
            log.warning("reload: %s now runs on %s (was %s)", st.name, trigger, st.schedule)
            st.schedule = str(trigger)
            done.append("schedule")
        new_watch = agent.spec.watch.model_dump() if agent.spec.watch is not None else None
        if new_watch != st.watch:
            start_watch(rt, st, agent.spec)
            log.warning("reload: %s's watch %s", st.name, "restarted" if new_watch else "stopped")
            done.append("watch")
        if agent.spec.gpus != st.gpus:
            log.warning("reload: %s's gpus changed to %s: restart the daemon to apply (GPU groups are fixed at "
                        "start-up)", st.name, agent.spec.gpus)
            done.append("gpus (needs a restart)")
        changes[st.name] = done
        if not done:
            log.info("reload: %s unchanged (its next cycle reads the file afresh)", st.name)
    return changes


def single_instance(state: Path) -> IO[str]:
    """One daemon per state dir: hold an exclusive flock for the daemon's life (released when it dies)."""
    f = open(private_file(daemon_dir(state) / "daemon.lock"), "a+")  # noqa: SIM115 - held until the daemon stops
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise ConfigError(f"another tuner daemon already runs on the state dir {state}") from None
    return f


def prune_jobs(db: Path, keep: set[str]) -> None:
    """Drop persisted cycle jobs of agents this daemon no longer runs (their files were left out)."""
    if not db.is_file():
        return
    with contextlib.closing(sqlite3.connect(db)) as con:
        try:
            ids = [r[0] for r in con.execute("SELECT id FROM apscheduler_jobs")]
        except sqlite3.OperationalError:
            return  # no table yet
        stale = [i for i in ids if i.startswith("cycle:") and i not in keep]
        for i in stale:
            con.execute("DELETE FROM apscheduler_jobs WHERE id = ?", (i,))
        con.commit()
    if stale:
        log.info("removed the scheduled jobs of agents no longer given: %s", stale)


def _shutdown(scheduler: BaseScheduler) -> None:
    deadline = time.monotonic() + 10
    while not scheduler.running and time.monotonic() < deadline:  # a signal during start-up
        time.sleep(0.05)
    try:
        scheduler.shutdown(wait=False)
    except Exception as exc:  # noqa: BLE001 - not running yet, or already stopped
        log.debug("scheduler shutdown: %s", exc)
