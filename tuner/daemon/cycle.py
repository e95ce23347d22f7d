"""One agent's PDCA cycle, and the scheduled job that runs it inside the daemon."""

from __future__ import annotations

import json
import logging
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import yaml

from tuner.base.redact import redact_text
from tuner.champions.store import append_jsonl
from tuner.context import open_context
from tuner.daemon import runtime
from tuner.daemon.health import write_heartbeat
from tuner.daemon.metrics import DaemonMetrics
from tuner.loop import Session, finish_tracking, run_cycle
from tuner.promotion.act import check_and_act
from tuner.promotion.audit import champion_summary
from tuner.scenarios.act import adopt_baseline, put_in_service
from tuner.scenarios.session import Planned, plan_cycle
from tuner.scenarios.store import ScenarioBook
from tuner.scenarios.table import traffic_text

log = logging.getLogger(__name__)


def run_agent_cycle(agent_path: Path | str, state_dir: Path | str, *, stop: threading.Event | None = None,
                    lock: threading.Lock | None = None, metrics: DaemonMetrics | None = None,
                    trials: int | None = None, observation: Any = None,
                    scenario: str | None = None) -> dict[str, Any]:
    """Plan, Do, Check, Act for one agent. Returns a summary; raises on a broken agent or store.

    `observation` (tuner.observe's ObservedWorkload of the watch's window): the cycle tunes that traffic, in the
    study of the scenario it falls in (`scenario` overrides which; tuner.scenarios.session); None: the agent's
    workload (or the scenario's fitted one)."""
    stop = stop or threading.Event()
    state_dir = Path(state_dir)
    ctx = open_context(agent_path, state_dir)
    spec = ctx.agent.spec
    if lock is not None:
        while not lock.acquire(timeout=0.5):
            if stop.is_set():
                return {"agent": spec.name, "skipped": "stopping"}
    began = time.time()  # the GPU group is ours from here
    if spec.scenarios and spec.watch is not None and observation is None and scenario is None:
        if lock is not None:
            lock.release()
        log.info("cycle of %s skipped: its watch has observed no traffic yet (the scenarios tune observed traffic)",
                 spec.name)
        return {"agent": spec.name, "skipped": "no traffic observed yet"}
    try:
        # Plan: the traffic observed (or the agent's workload), the scenario it falls in, its lineage (a new
        # study, warm-started?)
        planned = plan_cycle(ctx, observation, scenario)
        session = planned.session
        result = run_cycle(session, trials=trials, stop_event=stop, finish=False)
        out: dict[str, Any] = {"agent": spec.name, "began": began, "study": session.study.name,
                               "cycle": result.cycle, "run_id": result.run_id,
                               "trials": [o.number for o in result.outcomes], "interrupted": result.interrupted,
                               "warm_started": planned.warm_started, **tuned_for(planned)}
        record_tuned_for(session, result.cycle, result.run_id, out)
        try:
            if not result.interrupted and not stop.is_set():
                promote = None
                if spec.rollout is not None:  # Act through a canary rollout on live traffic
                    from tuner.rollout.rollout import canary_promoter

                    promote = canary_promoter(session, stop_event=stop)
                out["check"] = check_and_act(session, stop_event=stop, promote=promote)
                if planned.scenario is not None and out["check"].get("action") == "none":
                    out["check"] = adopt_baseline(session) or out["check"]
                if planned.scenario is not None and out["check"].get("action") in ("promoted", "baseline"):
                    out["service"] = serve_if_in_service(ctx, planned.scenario, session)
                    if spec.switching.cross_eval_runs and not stop.is_set():  # the scenario table's gains
                        from tuner.scenarios.matrix import cross_evaluate

                        cross_evaluate(ctx, runs=spec.switching.cross_eval_runs, stop=stop)
                        out["cross_evaluated"] = True
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


def tuned_for(planned: Planned) -> dict[str, Any]:
    """Which traffic the cycle tuned for: scenario, the workload's source, the observation (window, source,
    statistics, fit error) and the workload itself."""
    obs = planned.observation
    return {"scenario": planned.scenario, "workload_source": planned.workload_source,
            "workload": planned.session.agent.spec.workload.model_dump(mode="json"),
            "refit_change": planned.refit_change, "warm_from": planned.warm_from,
            "observed": None if obs is None else {k: obs[k] for k in ("start_s", "end_s", "window_s", "source",
                                                                       "stats", "fit_error")}}


def record_tuned_for(session: Session, cycle: int, run_id: str | None, out: dict[str, Any]) -> None:
    """In the study (user attribute `tuned_for:<cycle>`) and the cycle's MLflow run (params, tags, artifact)."""
    entry = {k: out[k] for k in ("scenario", "workload_source", "workload", "refit_change", "observed")}
    session.study.study.set_user_attr(f"tuned_for:{cycle:06d}", json.loads(json.dumps(entry, default=str)))
    obs = out.get("observed") or {}
    stats = obs.get("stats") or {}
    tags = {"scenario": out.get("scenario") or "", "workload_source": out["workload_source"],
            "observed_source": redact_text(str(obs.get("source", ""))),
            **{f"observed.{k}": f"{v:.4g}" for k, v in stats.items() if isinstance(v, int | float)}}
    params = {"observed_window_s": obs.get("window_s", ""), "observed_start_s": obs.get("start_s", ""),
              "observed_end_s": obs.get("end_s", "")} if obs else {}
    session.tracker.log(run_id, params=params, tags=tags)
    session.tracker.log_text(run_id, yaml.safe_dump(json.loads(json.dumps(entry, default=str)), sort_keys=False),
                             "tuned_for.yaml")


def serve_if_in_service(ctx: Any, scenario: str, session: Session) -> dict[str, Any] | None:
    """A new champion of the scenario in service goes into service at once (the switch path)."""
    service = ScenarioBook(ctx.state_dir, ctx.name).service() or {}
    if service.get("scenario") != scenario:
        return None  # the switcher puts it in service when the traffic comes to this scenario
    return put_in_service(ctx.agent, ctx.state_dir, scenario, tracker=session.tracker, previous=scenario,
                          reason="a new champion of the scenario in service")


def cycle_job(agent_path: str, state_dir: str) -> None:
    """The scheduled job (module level so that APScheduler can pickle a reference to it). A scenario the
    switcher asked a cycle for while this one ran gets its cycle right after, in this job."""
    rt = runtime.current()
    if rt is None:
        log.error("cycle job fired outside a daemon process; ignored")
        return
    st = next((a for a in rt.agents.values() if str(a.path) == agent_path), None)
    while st is not None and not rt.stop.is_set():
        outcome = _one_cycle(rt, st, agent_path, state_dir)
        if st.tune_scenario is not None and ScenarioBook(state_dir, st.name).has_champion(st.tune_scenario):
            st.tune_scenario = None  # asked again while its cycle ran, which gave it a champion
        if st.tune_scenario is None or outcome == "interrupted":
            break
        log.info("cycle of %s for scenario %s, asked for during the last cycle", st.name, st.tune_scenario)


def _one_cycle(rt: runtime.Runtime, st: runtime.AgentState, agent_path: str, state_dir: str) -> str:
    with rt.idle:
        rt.in_flight += 1
    st.running = True
    rt.metrics.running.labels(st.name).set(1)
    started = time.time()
    outcome = "ok"
    entry: dict[str, Any] = {"agent": st.name, "start_time": started}
    try:
        scenario, st.tune_scenario = st.tune_scenario, None  # the switcher asked for this scenario's cycle
        res = run_agent_cycle(agent_path, state_dir, stop=rt.stop, lock=rt.locks.get(st.name),
                              metrics=rt.metrics, observation=st.observed, scenario=scenario)
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
        log.info("cycle of %s %s in %.1fs: study %s, trial(s) %s%s; tuned for %s", st.name, outcome,
                 st.last_end - started, entry.get("study", "-"), entry.get("trials", []),
                 f", check: {entry['check'].get('action')}" if isinstance(entry.get("check"), dict) else "",
                 traffic_text(entry))
        try:
            append_jsonl(Path(state_dir) / st.name / "cycles.jsonl", entry)
        except OSError as exc:
            log.warning("cannot append to the cycle journal: %s", exc)
        write_heartbeat(rt)
        with rt.idle:
            rt.in_flight -= 1
            rt.idle.notify_all()
    return outcome

