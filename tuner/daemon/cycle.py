"""One agent's PDCA cycle, and the scheduled job that runs it inside the daemon."""

from __future__ import annotations

import logging
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from tuner.base.redact import redact_text
from tuner.champions.store import append_jsonl
from tuner.context import open_context
from tuner.daemon import runtime
from tuner.daemon.health import write_heartbeat
from tuner.daemon.metrics import DaemonMetrics
from tuner.loop import finish_tracking, run_cycle
from tuner.promotion.act import check_and_act
from tuner.promotion.audit import champion_summary

log = logging.getLogger(__name__)


def run_agent_cycle(agent_path: Path | str, state_dir: Path | str, *, stop: threading.Event | None = None,
                    lock: threading.Lock | None = None, metrics: DaemonMetrics | None = None,
                    trials: int | None = None) -> dict[str, Any]:
    """Plan, Do, Check, Act for one agent. Returns a summary; raises on a broken agent or store."""
    stop = stop or threading.Event()
    state_dir = Path(state_dir)
    ctx = open_context(agent_path, state_dir)
    spec = ctx.agent.spec
    if lock is not None:
        while not lock.acquire(timeout=0.5):
            if stop.is_set():
                return {"agent": spec.name, "skipped": "stopping"}
    began = time.time()  # the GPU group is ours from here
    try:
        session = ctx.session(plan=True)  # Plan: the lineage says which study (a new one, warm-started?)
        study_name, warmed = ctx.study_name, ctx.warm_started
        result = run_cycle(session, trials=trials, stop_event=stop, finish=False)
        out: dict[str, Any] = {"agent": spec.name, "began": began, "study": study_name, "cycle": result.cycle,
                               "run_id": result.run_id, "trials": [o.number for o in result.outcomes],
                               "interrupted": result.interrupted, "warm_started": warmed}
        try:
            if not result.interrupted and not stop.is_set():
                promote = None
                if spec.rollout is not None:  # Act through a canary rollout on live traffic
                    from tuner.rollout.rollout import canary_promoter

                    promote = canary_promoter(session, stop_event=stop)
                out["check"] = check_and_act(session, stop_event=stop, promote=promote)
        finally:  # one probe of a store that went down covers the cycle and its verification
            finish_tracking(session, interrupted=result.interrupted)
        if metrics is not None:
            metrics.set_trial_counts(spec.name, session.study.counts())
            metrics.count_failures(spec.name, (o.cause for o in result.outcomes))
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
    rt = runtime.current()
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
        st.last_error = redact_text(f"{type(exc).__name__}: {exc}")
        entry["error"] = st.last_error
        entry["traceback"] = redact_text(traceback.format_exc())[-4000:]
        rt.metrics.last_error.labels(st.name).set(time.time())
        log.error("cycle of %s failed: %s", st.name, st.last_error)
    finally:
        st.running = False
        st.cycles += 1
        st.last_end = time.time()
        st.last_result = entry
        rt.metrics.running.labels(st.name).set(0)
        rt.metrics.cycles.labels(st.name, outcome).inc()
        rt.metrics.cycle_duration.labels(st.name).observe(st.last_end - started)
        entry.update(outcome=outcome, end_time=st.last_end)
        log.info("cycle of %s %s in %.1fs: study %s, trial(s) %s%s", st.name, outcome, st.last_end - started,
                 entry.get("study", "-"), entry.get("trials", []),
                 f", check: {entry['check'].get('action')}" if isinstance(entry.get("check"), dict) else "")
        try:
            append_jsonl(Path(state_dir) / st.name / "cycles.jsonl", entry)
        except OSError as exc:
            log.warning("cannot append to the cycle journal: %s", exc)
        write_heartbeat(rt)
        with rt.idle:
            rt.in_flight -= 1
            rt.idle.notify_all()
