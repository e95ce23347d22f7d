"""The PDCA daemon: APScheduler cycles per agent, signals, heartbeat, health/metrics endpoint, watch.

One cycle job per agent lives in a SQLAlchemy job store in the state dir (sqlite:///<state>/jobs.db), with
a fixed id, replace_existing, max_instances=1 and coalesce. Cycles of agents that share GPUs take the same
lock, so they never overlap. A cycle is Plan (continue the agent's study; a changed target version or
workload opens a new study warm-started with the old one's best configurations), Do (run_cycle), Check
(verify the best unjudged candidate) and Act (auto: promote; manual: leave it pending).

SIGTERM/SIGINT: nothing new starts, the running deployment is torn down (the stop event that run_cycle and
deployments honour), the running trial is recorded as interrupted, and the process exits 0 within the
grace. After a SIGKILL the next start reaps stale trials and orphan servers (loop.reap) and goes on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import signal
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tuner.champion import append_jsonl, atomic_write

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 2.0
DEFAULT_EVERY = "6h"
WARM_START_TOP_K = 3


def job_id(agent_name: str) -> str:
    return f"cycle:{agent_name}"


def daemon_dir(state_dir: Path) -> Path:
    d = Path(state_dir) / "daemon"
    d.mkdir(parents=True, exist_ok=True)
    return d


# ---------------------------------------------------------------- metrics
class DaemonMetrics:
    """prometheus_client metrics on a private registry."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = CollectorRegistry()
        self.cycles = Counter("tuner_cycles", "Cycles run", ["agent", "outcome"], registry=self.registry)
        self.trials = Gauge("tuner_trials", "Trials of the agent's study by state", ["agent", "state"],
                            registry=self.registry)
        self.best = Gauge("tuner_best_objective", "Best feasible value of the primary objective", ["agent"],
                          registry=self.registry)
        self.champion_age = Gauge("tuner_champion_age_seconds", "Seconds since the champion was promoted",
                                  ["agent"], registry=self.registry)
        self.running = Gauge("tuner_cycle_running", "1 while a cycle of the agent runs", ["agent"],
                             registry=self.registry)
        self.last_error = Gauge("tuner_last_error_timestamp_seconds", "Time of the agent's last failed cycle",
                                ["agent"], registry=self.registry)
        self.anomalies = Counter("tuner_watch_anomalies", "Production anomalies seen by the watcher",
                                 ["agent", "kind"], registry=self.registry)
        self.promotions = Counter("tuner_promotions", "Automatic promotions", ["agent"], registry=self.registry)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return bytes(generate_latest(self.registry))


# ---------------------------------------------------------------- runtime (one per daemon process)
@dataclass
class AgentState:
    name: str
    path: Path
    running: bool = False
    cycles: int = 0
    last_ok: bool | None = None
    last_error: str | None = None
    last_end: float | None = None
    last_result: dict[str, Any] = field(default_factory=dict)
    schedule: str = ""  # the trigger in force, as text (a reload compares it)
    watch: dict[str, Any] | None = None  # the watch in force
    watch_stop: threading.Event | None = None  # ends the running watch thread
    gpus: list[int] | None = None


@dataclass
class Runtime:
    state_dir: Path
    stop: threading.Event
    agents: dict[str, AgentState]
    locks: dict[str, threading.Lock]  # agent name -> lock of its GPU group
    metrics: DaemonMetrics
    grace_s: float
    port: int | None = None
    scheduler: Any = None
    mutex: threading.Lock = field(default_factory=threading.Lock)
    idle: threading.Condition = field(default_factory=threading.Condition)
    in_flight: int = 0

    def healthy(self) -> bool:
        return not any(a.last_ok is False for a in self.agents.values())

    def snapshot(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "time": time.time(), "port": self.port, "interval_s": HEARTBEAT_INTERVAL_S,
                "stopping": self.stop.is_set(), "healthy": self.healthy(),
                "agents": {n: {"running": a.running, "cycles": a.cycles, "last_ok": a.last_ok,
                               "last_error": a.last_error, "last_end": a.last_end}
                           for n, a in self.agents.items()}}


_RUNTIME: Runtime | None = None


def gpu_groups(specs: dict[str, list[int] | None]) -> dict[str, str]:
    """Agents whose GPU sets intersect (None: all GPUs) share a group. Returns agent -> group key."""
    names = list(specs)
    parent = {n: n for n in names}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i, a in enumerate(names):
        for b in names[i + 1:]:
            ga, gb = specs[a], specs[b]
            if ga is None or gb is None or set(ga) & set(gb):
                parent[find(a)] = find(b)
    return {n: find(n) for n in names}


# ---------------------------------------------------------------- one cycle
def fingerprint(describe: dict[str, Any], workload: Any) -> str:
    blob = json.dumps({"target": describe, "workload": workload}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:8]


def current_study_name(state_dir: Path, agent_name: str) -> str:
    """The study the daemon continues for this agent (a suffixed one after a target/workload change)."""
    p = Path(state_dir) / agent_name / "daemon_study.json"
    if p.is_file():
        try:
            return str(json.loads(p.read_text())["study"])
        except (OSError, ValueError, KeyError):
            pass
    return agent_name


def plan_study(agent: Any, target: Any, state_dir: Path) -> tuple[str, str | None]:
    """The study this cycle continues: (name, the former study's name when the conditions changed)."""
    spec = agent.spec
    fp = fingerprint(target.describe(), spec.workload.model_dump(mode="json"))
    path = Path(state_dir) / spec.name / "daemon_study.json"
    known = json.loads(path.read_text()) if path.is_file() else None
    if known is None:
        atomic_write(path, json.dumps({"fingerprint": fp, "study": spec.name, "history": []}))
        return spec.name, None
    if known.get("fingerprint") == fp:
        return str(known["study"]), None
    new = f"{spec.name}-{fp}"
    old = str(known["study"])
    hist = list(known.get("history", [])) + [{"study": old, "fingerprint": known.get("fingerprint"),
                                               "until": time.time()}]
    atomic_write(path, json.dumps({"fingerprint": fp, "study": new, "history": hist}))
    log.warning("%s: target or workload changed (fingerprint %s -> %s): new study %s warm-started from %s",
                spec.name, known.get("fingerprint"), fp, new, old)
    return new, old


def warm_start(session: Any, old_study: str, k: int = WARM_START_TOP_K) -> list[int]:
    """Enqueue the old study's k best feasible configurations into the (new, empty) session study."""
    from tuner.study import TunerStudy

    mine = session.study.trials()
    if any(t.user_attrs.get("warm_start_from") or t.state.name == "COMPLETE" for t in mine):
        return []  # warm-started (or already running) before
    old = TunerStudy(session.agent.spec, session.agent.space, storage_url=session.study.storage_url,
                     study_name=old_study)
    sign = 1 if session.agent.spec.objectives[0].direction == "maximize" else -1
    feasible = [t for t in old.trials() if t.state.name == "COMPLETE" and t.user_attrs.get("feasible") and t.values]
    feasible.sort(key=lambda t: -sign * t.values[0])
    names = {p.name for p in session.agent.space.params}
    enq: list[int] = []
    seen: list[dict[str, Any]] = []
    for t in feasible:
        params = {kk: v for kk, v in t.params.items() if kk in names}
        if params in seen:
            continue  # the same configuration measured twice: one warm start
        if len(enq) >= k:
            break
        seen.append(params)
        session.study.study.enqueue_trial(params, user_attrs={"warm_start_from": f"{old_study}#{t.number}"},
                                          skip_if_exists=True)
        enq.append(t.number)
    return enq


def run_agent_cycle(agent_path: Path | str, state_dir: Path | str, *, stop: threading.Event | None = None,
                    lock: threading.Lock | None = None, metrics: DaemonMetrics | None = None,
                    trials: int | None = None) -> dict[str, Any]:
    """Plan, Do, Check, Act for one agent. Returns a summary; raises on a broken agent or store."""
    from tuner.loop import open_session, run_cycle
    from tuner.promote import champion_summary, check_and_act
    from tuner.spec import load_agent
    from tuner.targets.registry import make_target

    stop = stop or threading.Event()
    state_dir = Path(state_dir)
    agent = load_agent(agent_path)
    spec = agent.spec
    if lock is not None:
        while not lock.acquire(timeout=0.5):
            if stop.is_set():
                return {"agent": spec.name, "skipped": "stopping"}
    began = time.time()  # the GPU group is ours from here
    try:
        target = make_target(spec.target.kind, agent.target_options, agent.path.parent)
        study_name, old = plan_study(agent, target, state_dir)
        session = open_session(agent, state_dir, target=target, study_name=study_name)
        warmed = warm_start(session, old) if old else []
        result = run_cycle(session, trials=trials, stop_event=stop)
        out: dict[str, Any] = {"agent": spec.name, "began": began, "study": study_name, "cycle": result.cycle,
                               "run_id": result.run_id, "trials": [o.number for o in result.outcomes],
                               "interrupted": result.interrupted, "warm_started": warmed}
        if not result.interrupted and not stop.is_set():
            out["check"] = check_and_act(session, stop_event=stop)
        if metrics is not None:
            for state, n in session.study.counts().items():
                metrics.trials.labels(spec.name, state).set(n)
            best = session.study.best()
            if best and best[0].values:
                metrics.best.labels(spec.name).set(best[0].values[0])
            champ = champion_summary(state_dir, spec.name)
            if champ is not None:
                metrics.champion_age.labels(spec.name).set(champ["age_s"])
            if out.get("check", {}).get("action") == "promoted":
                metrics.promotions.labels(spec.name).inc()
        out["ended"] = time.time()
        return out
    finally:
        if lock is not None:
            lock.release()


def cycle_job(agent_path: str, state_dir: str) -> None:
    """The scheduled job (module level so that APScheduler can pickle a reference to it)."""
    rt = _RUNTIME
    if rt is None:
        log.error("cycle job fired outside a daemon process; ignored")
        return
    st = next((a for a in rt.agents.values() if str(a.path) == agent_path), None)
    if st is None or rt.stop.is_set():
        return
    with rt.idle:
        rt.in_flight += 1
    st.running = True
    rt.metrics.running.labels(st.name).set(1)
    started = time.time()
    outcome = "ok"
    entry: dict[str, Any] = {"agent": st.name, "start_time": started}
    try:
        res = run_agent_cycle(agent_path, state_dir, stop=rt.stop, lock=rt.locks.get(st.name),
                              metrics=rt.metrics)
        entry.update(res)
        if res.get("interrupted") or res.get("skipped"):
            outcome = "interrupted"
        else:
            st.last_ok = True
            st.last_error = None
    except Exception as exc:  # noqa: BLE001 - a failing cycle is recorded; the daemon goes on
        outcome = "failed"
        st.last_ok = False
        st.last_error = f"{type(exc).__name__}: {exc}"
        entry["error"] = st.last_error
        entry["traceback"] = traceback.format_exc()[-4000:]
        rt.metrics.last_error.labels(st.name).set(time.time())
        log.error("cycle of %s failed: %s", st.name, st.last_error)
    finally:
        st.running = False
        st.cycles += 1
        st.last_end = time.time()
        st.last_result = entry
        rt.metrics.running.labels(st.name).set(0)
        rt.metrics.cycles.labels(st.name, outcome).inc()
        entry.update(outcome=outcome, end_time=st.last_end)
        try:
            append_jsonl(Path(state_dir) / st.name / "cycles.jsonl", entry)
        except OSError as exc:
            log.warning("cannot append to the cycle journal: %s", exc)
        write_heartbeat(rt)
        with rt.idle:
            rt.in_flight -= 1
            rt.idle.notify_all()


# ---------------------------------------------------------------- heartbeat and endpoint
def heartbeat_path(state_dir: Path) -> Path:
    return daemon_dir(state_dir) / "heartbeat.json"


def write_heartbeat(rt: Runtime, **extra: Any) -> None:
    try:
        atomic_write(heartbeat_path(rt.state_dir), json.dumps({**rt.snapshot(), **extra}, default=str))
    except OSError as exc:
        log.warning("cannot write the heartbeat: %s", exc)


def _heartbeat_loop(rt: Runtime, done: threading.Event) -> None:
    while not done.wait(HEARTBEAT_INTERVAL_S):
        from tuner.promote import champion_summary

        for name in rt.agents:
            try:
                champ = champion_summary(rt.state_dir, name)
            except Exception:  # noqa: BLE001 - a torn read never stops the heartbeat
                champ = None
            if champ is not None:
                rt.metrics.champion_age.labels(name).set(champ["age_s"])
        write_heartbeat(rt)


def serve_endpoint(rt: Runtime, port: int) -> ThreadingHTTPServer:
    """/health (JSON; 200 when the last cycles did not fail, else 503) and /metrics on 127.0.0.1."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server API
            if self.path.startswith("/metrics"):
                body = rt.metrics.render()
                self._send(200, body, "text/plain; version=0.0.4; charset=utf-8")
            elif self.path.startswith("/health"):
                snap = rt.snapshot()
                self._send(200 if snap["healthy"] else 503, json.dumps(snap).encode(), "application/json")
            else:
                self._send(404, b"not found\n", "text/plain")

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server API
            log.debug("endpoint: " + format, *args)

    srv = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, name="tuner-endpoint", daemon=True).start()
    return srv


def check_alive(*, url: str | None = None, state_dir: Path | None = None,
                max_age_s: float | None = None) -> tuple[bool, str]:
    """Is the daemon alive and did its last cycle(s) succeed? (ok, one-line reason)."""
    import urllib.error
    import urllib.request

    if url is not None:
        health = url.rstrip("/")
        if not health.endswith("/health"):
            health += "/health"
        try:
            with urllib.request.urlopen(health, timeout=5) as r:
                snap = json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as exc:
            return False, f"{health} answered {exc.code}: the last cycle failed"
        except (OSError, ValueError) as exc:
            return False, f"{health} does not answer: {exc}"
        return True, f"daemon pid {snap.get('pid')} healthy"
    hb = heartbeat_path(Path(state_dir or "."))
    if not hb.is_file():
        return False, f"no heartbeat at {hb}"
    try:
        snap = json.loads(hb.read_text())
    except (OSError, ValueError) as exc:
        return False, f"unreadable heartbeat {hb}: {exc}"
    age = time.time() - float(snap.get("time", 0))
    limit = max_age_s if max_age_s is not None else 3 * float(snap.get("interval_s", HEARTBEAT_INTERVAL_S)) + 5
    if snap.get("stopped"):
        return False, f"daemon pid {snap.get('pid')} stopped"
    if age > limit:
        return False, f"heartbeat is {age:.0f}s old (limit {limit:.0f}s)"
    failed = [f"{n}: {a.get('last_error')}" for n, a in snap.get("agents", {}).items() if a.get("last_ok") is False]
    if failed:
        return False, "last cycle failed: " + "; ".join(failed)
    return True, f"daemon pid {snap.get('pid')} alive, heartbeat {age:.0f}s old"


# ---------------------------------------------------------------- watch (production drift)
def _watch_loop(rt: Runtime, st: AgentState, spec: Any, done: threading.Event) -> None:
    from tuner.measure.scrape import scrape

    w = spec.watch
    history: list[tuple[float, Any]] = []
    cooldown_until = 0.0
    while not done.wait(w.interval_s):
        snap = scrape(w.url)
        if snap is None:
            continue
        now = time.monotonic()
        history.append((now, snap))
        history = [(t, s) for t, s in history if now - t <= w.window_s + w.interval_s]
        base = history[0][1] if len(history) > 1 else None
        if base is None or now < cooldown_until:
            continue
        try:
            anomalies = detect_anomalies(spec, base, snap, st.path.parent)
        except Exception as exc:  # noqa: BLE001 - a failing check must not end the watch for good
            log.warning("watch %s: cannot check the scrape of %s: %s", st.name, w.url, exc)
            continue
        if not anomalies:
            continue
        cooldown_until = now + w.window_s
        for kind, detail in anomalies:
            rt.metrics.anomalies.labels(st.name, kind).inc()
            log.warning("watch %s: %s (%s): starting a cycle now", st.name, kind, detail)
        try:
            _record_anomaly(rt, spec, anomalies)
        except OSError as exc:
            log.warning("watch %s: cannot record the anomaly: %s", st.name, exc)
        if rt.scheduler is not None and not st.running and not rt.stop.is_set():
            try:
                rt.scheduler.modify_job(job_id(st.name), next_run_time=datetime.now(timezone.utc))
            except Exception as exc:  # noqa: BLE001 - the job may be gone during shutdown
                log.warning("cannot trigger a cycle of %s: %s", st.name, exc)


def detect_anomalies(spec: Any, before: Any, after: Any, base_dir: Path | None = None) -> list[tuple[str, str]]:
    """SLO breaches of p99 TTFT/ITL and prompt-length drift between two scrapes of production /metrics.

    `base_dir` (the agent file's folder) resolves the workload's dataset or trace path."""
    from tuner.measure.scrape import telemetry

    tel = telemetry(before, after)
    out: list[tuple[str, str]] = []
    for slo in spec.slos:
        if slo.max is None:
            continue
        for metric, key in (("ttft_ms.p99", "server_ttft_ms_p99"), ("itl_ms.p99", "server_itl_ms_p99")):
            if slo.metric == metric and key in tel and tel[key] > slo.max:
                out.append(("slo", f"{metric} {tel[key]:.1f} > {slo.max}"))
    n = tel.get("server_request_success", 0.0)
    if n > 0 and "server_prompt_tokens" in tel:
        mean_now = tel["server_prompt_tokens"] / n
        tuned = tuned_prompt_mean(spec.workload, base_dir)
        if tuned and abs(mean_now - tuned) / tuned > spec.watch.drift_threshold:
            out.append(("drift", f"mean prompt {mean_now:.0f} tokens vs {tuned:.0f} tuned for"))
    return out


def tuned_prompt_mean(workload: Any, base_dir: Path | None = None) -> float:
    """Mean prompt length of the workload the champion was tuned for (from its request plans).

    A dataset or trace gives the prompts (and their lengths); `base_dir` resolves its relative path.
    """
    from tuner.measure.datasets import plans_for
    from tuner.measure.tokenize import load_tokenizer

    tok = load_tokenizer(None, seed=workload.seed)
    all_plans, _ = plans_for(workload, seed=workload.seed, tok=tok, base_dir=base_dir)
    plans = [p for p in all_plans if not p.warmup]
    return sum(p.prompt_tokens for p in plans) / len(plans) if plans else 0.0


def _record_anomaly(rt: Runtime, spec: Any, anomalies: list[tuple[str, str]]) -> None:
    from tuner.loop import state_dir_for
    from tuner.tracking import Tracker, resolve_tracking_uri

    sd = state_dir_for(rt.state_dir)
    tr = Tracker(resolve_tracking_uri(spec.tracking.uri, sd), spec.tracking.experiment or spec.name,
                 artifact_dir=sd / "mlartifacts", enabled=spec.tracking.enabled)
    run_id = tr.start_run("anomaly", tags={"kind": "anomaly", "agent": spec.name,
                                           "anomalies": "; ".join(f"{k}: {d}" for k, d in anomalies)})
    tr.end_run(run_id)
    append_jsonl(Path(rt.state_dir) / spec.name / "anomalies.jsonl",
                 {"time": time.time(), "anomalies": [{"kind": k, "detail": d} for k, d in anomalies]})


# ---------------------------------------------------------------- main
def _trigger(spec: Any) -> tuple[Any, int]:
    from apscheduler.triggers.cron import CronTrigger
    from apscheduler.triggers.interval import IntervalTrigger

    sched = spec.schedule
    if sched is not None and sched.cron:
        return CronTrigger.from_crontab(sched.cron), 6 * 3600
    every_s = (sched.every_s if sched is not None and sched.every else None) or 6 * 3600.0
    # a cycle that fires late still runs (however long the previous one took, up to a day)
    return IntervalTrigger(seconds=every_s), int(max(every_s * 2, 3600))


def run_daemon(agent_paths: Sequence[Path | str], state_dir: Path | str, *, port: int | None = None,
               grace_s: float = 30.0, install_signals: bool = True) -> int:
    """Run until SIGTERM/SIGINT. Returns the exit status (0: clean stop within the grace)."""
    global _RUNTIME
    from tuner.errors import ConfigError
    from tuner.spec import load_agent

    state = Path(state_dir).resolve()
    state.mkdir(parents=True, exist_ok=True)
    agents = [load_agent(p) for p in agent_paths]
    names = [a.name for a in agents]
    if len(set(names)) != len(names):
        raise ConfigError(f"two agent files share a name: {names}")
    triggers: dict[str, tuple[Any, int]] = {}
    for a in agents:
        try:
            triggers[a.name] = _trigger(a.spec)
        except ValueError as exc:  # a 5-field cron that APScheduler rejects (e.g. minute 99)
            cron = a.spec.schedule.cron if a.spec.schedule is not None else None
            raise ConfigError(f"{cron!r} is not a valid cron expression: {exc}", file=str(a.path),
                              field="schedule.cron") from None
    single = _single_instance(state)
    try:
        return _run_locked(agents, state, single, triggers, port=port, grace_s=grace_s,
                           install_signals=install_signals)
    except BaseException:
        if not single.closed:  # a start-up failure: release the state dir for the next daemon
            single.close()
            _RUNTIME = None
        raise


def _run_locked(agents: list[Any], state: Path, single: Any, triggers: dict[str, tuple[Any, int]], *,
                port: int | None, grace_s: float, install_signals: bool) -> int:
    """run_daemon once the state dir's daemon lock (`single`) is held."""
    global _RUNTIME
    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
    from apscheduler.schedulers.blocking import BlockingScheduler

    from tuner.loop import open_session

    groups = gpu_groups({a.name: a.spec.gpus for a in agents})
    group_locks = {g: threading.Lock() for g in set(groups.values())}
    rt = Runtime(state_dir=state, stop=threading.Event(),
                 agents={a.name: AgentState(a.name, a.path.resolve()) for a in agents},
                 locks={n: group_locks[g] for n, g in groups.items()}, metrics=DaemonMetrics(), grace_s=grace_s)
    _RUNTIME = rt

    # resume after a SIGKILL: orphan servers and stale RUNNING trials of every agent, before anything new
    for a in agents:
        try:
            open_session(a, state, target=_target_of(a), study_name=current_study_name(state, a.name))  # reaps
        except Exception as exc:  # noqa: BLE001 - a broken agent must not keep the others from running
            rt.agents[a.name].last_ok = False
            rt.agents[a.name].last_error = f"start-up: {type(exc).__name__}: {exc}"
            log.error("cannot prepare %s: %s", a.name, exc)

    _prune_jobs(state / "jobs.db", {job_id(a.name) for a in agents})
    scheduler = BlockingScheduler(
        jobstores={"default": SQLAlchemyJobStore(url=f"sqlite:///{state / 'jobs.db'}")},
        executors={"default": ThreadPoolExecutor(max_workers=max(1, len(agents)))},
        job_defaults={"coalesce": True, "max_instances": 1}, timezone=timezone.utc)
    rt.scheduler = scheduler
    now = datetime.now(timezone.utc)
    for a in agents:
        trigger, grace = triggers[a.name]
        scheduler.add_job("tuner.daemon:cycle_job", trigger=trigger, args=[str(a.path.resolve()), str(state)],
                          id=job_id(a.name), name=f"cycle {a.name}", replace_existing=True, max_instances=1,
                          coalesce=True, misfire_grace_time=grace, next_run_time=now)
    srv = None
    if port is not None:
        srv = serve_endpoint(rt, port)
        rt.port = srv.server_address[1]
        log.info("health and metrics on http://127.0.0.1:%d/health and /metrics", rt.port)
    hb_done = threading.Event()
    write_heartbeat(rt)
    threading.Thread(target=_heartbeat_loop, args=(rt, hb_done), name="tuner-heartbeat", daemon=True).start()
    for a in agents:
        st = rt.agents[a.name]
        st.schedule, st.gpus = str(triggers[a.name][0]), a.spec.gpus
        _start_watch(rt, st, a.spec)

    def on_signal(signum: int, _frame: Any) -> None:
        if rt.stop.is_set():
            return
        log.warning("signal %d: stopping (no new cycle; the running one is torn down)", signum)
        rt.stop.set()
        threading.Thread(target=_shutdown, args=(scheduler,), daemon=True).start()

    def on_hangup(_signum: int, _frame: Any) -> None:
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
        _RUNTIME = None
        single.close()
    if not clean:
        log.error("the running cycle did not stop within %.0fs; exiting anyway", grace_s)
        os._exit(1)  # worker threads are stuck: do not wait for them (servers die with us: their guards see us go)
    log.info("daemon stopped cleanly")
    return 0


def _start_watch(rt: Runtime, st: AgentState, spec: Any) -> None:
    """Start the agent's production watch (if its spec has one), ending the one that ran before."""
    if st.watch_stop is not None:
        st.watch_stop.set()
        st.watch_stop = None
    st.watch = spec.watch.model_dump() if spec.watch is not None else None
    if spec.watch is None or rt.stop.is_set():
        return
    st.watch_stop = threading.Event()
    threading.Thread(target=_watch_loop, args=(rt, st, spec, st.watch_stop), name=f"tuner-watch-{st.name}",
                     daemon=True).start()


def reload_agents(rt: Runtime) -> dict[str, list[str]]:
    """Re-read every agent file (SIGHUP). Cycles always read their agent file afresh; this applies what
    lives as long as the daemon: a changed schedule reschedules the agent's job, a changed watch restarts its
    watcher. A file that no longer loads keeps the definition in force. Renaming an agent or changing its
    GPUs needs a restart (the GPU groups are fixed at start-up); that is logged. Returns the changes."""
    from tuner.spec import load_agent

    changes: dict[str, list[str]] = {}
    for st in list(rt.agents.values()):
        done: list[str] = []
        try:
            agent = load_agent(st.path)
            trigger, grace = _trigger(agent.spec)
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
            _start_watch(rt, st, agent.spec)
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


def _single_instance(state: Path) -> Any:
    """One daemon per state dir: hold an exclusive flock for the daemon's life (released when it dies)."""
    import fcntl

    from tuner.errors import ConfigError

    f = open(daemon_dir(state) / "daemon.lock", "a+")  # noqa: SIM115 - held until the daemon stops
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise ConfigError(f"another tuner daemon already runs on the state dir {state}") from None
    return f


def _prune_jobs(db: Path, keep: set[str]) -> None:
    """Drop persisted cycle jobs of agents this daemon no longer runs (their files were left out)."""
    import sqlite3

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


def _shutdown(scheduler: Any) -> None:
    deadline = time.monotonic() + 10
    while not scheduler.running and time.monotonic() < deadline:  # a signal during start-up
        time.sleep(0.05)
    try:
        scheduler.shutdown(wait=False)
    except Exception as exc:  # noqa: BLE001 - not running yet, or already stopped
        log.debug("scheduler shutdown: %s", exc)


def _target_of(agent: Any) -> Any:
    from tuner.targets.registry import make_target

    return make_target(agent.spec.target.kind, agent.target_options, agent.path.parent)
