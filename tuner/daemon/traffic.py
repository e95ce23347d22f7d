"""The watch's traffic consumers: the observation window (every scrape into tuner.observe's MetricsWindow,
the latest fitted ObservedWorkload kept for the next cycle) and the scenario switcher (each observation's
point into tuner.scenarios' Switcher; its decisions acted on: a switch through the Act path, a cycle for a
scenario without a champion, a proposed scenario)."""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

from tuner.base.redact import redact_text, redact_url
from tuner.daemon.runtime import AgentState, Runtime, job_id
from tuner.measure.scrape import Snapshot
from tuner.spec import AgentSpec

log = logging.getLogger(__name__)


class ObservationWindow:
    """Feeds each scrape into a rolling MetricsWindow of `watch.window_s` and keeps the latest observation in
    `st.observed` (None until the window holds traffic; a window that cannot be fitted says why, once)."""

    def __init__(self, st: AgentState, spec: AgentSpec) -> None:
        from tuner.observe.window import MetricsWindow

        assert spec.watch is not None
        self.st = st
        self.window = MetricsWindow(f"metrics {redact_url(spec.watch.url)}", max_age_s=spec.watch.window_s)
        self._last_error: str | None = None

    def __call__(self, t_s: float, snap: Snapshot) -> None:
        from tuner.errors import ObservationError

        self.window.add(snap, t_s)
        if len(self.window.scrapes) < 2:
            return
        try:
            self.st.observed = self.window.observe()
            self._last_error = None
        except ObservationError as exc:
            msg = redact_text(str(exc))
            if msg != self._last_error:
                log.info("watch %s: no observation yet: %s", self.st.name, msg)
            self._last_error = msg
            self.st.observed = None


class ScenarioSwitching:
    """Hands each observation to the Switcher and acts on its decisions (tuner.scenarios)."""

    def __init__(self, rt: Runtime, st: AgentState, spec: AgentSpec) -> None:
        from tuner.agent import load_agent
        from tuner.scenarios.store import ScenarioBook
        from tuner.scenarios.switcher import Switcher

        self.rt, self.st, self.spec = rt, st, spec
        self.agent = load_agent(st.path)
        self.book = ScenarioBook(rt.state_dir, st.name)
        service = self.book.service() or {}
        self.switcher = Switcher(self.book.all(spec), spec.switching, active=service.get("scenario"))
        self._seen: float | None = None

    def __call__(self, t_s: float, snap: Snapshot) -> None:
        from tuner.scenarios.regions import point_of

        obs = self.st.observed
        if obs is None or obs.end_s == self._seen:
            return
        self._seen = obs.end_s
        for d in self.switcher.observe(t_s, point_of(obs.stats), self.book.has_champion):
            self.act(d, obs)

    def act(self, d: Any, obs: Any) -> None:
        from tuner.errors import PromotionError
        from tuner.scenarios.act import put_in_service, record_decision
        from tuner.scenarios.regions import propose, traffic_dims
        from tuner.scenarios.session import observation_record
        from tuner.tracking.tracker import Tracker

        tracker = Tracker.for_agent(self.spec, self.rt.state_dir)
        record = observation_record(obs)
        if d.kind == "switch":
            try:
                put_in_service(self.agent, self.rt.state_dir, d.scenario, reason=d.reason, tracker=tracker,
                               previous=d.previous, observation=record)
                self.rt.metrics.switches.labels(self.st.name, d.scenario).inc()
            except PromotionError as exc:
                log.error("watch %s: cannot switch to scenario %s: %s", self.st.name, d.scenario, exc)
                self.switcher.active = d.previous  # try again on the next observation after the dwell
            return
        if d.kind == "propose":
            scn = propose(d.point, self.book.next_proposed_name(self.spec), self.spec.switching.propose_width,
                          traffic_dims(obs.workload.arrival.kind))
            self.book.add_proposed(scn)
            self.switcher.add(scn)
            record_decision(self.agent, self.rt.state_dir, "propose", scn.name, reason=d.reason, tracker=tracker,
                            observation=record)
            return
        record_decision(self.agent, self.rt.state_dir, d.kind, d.scenario, reason=d.reason, tracker=tracker,
                        observation=record)
        if d.kind == "tune":
            self.st.tune_scenario = d.scenario
            trigger_cycle(self.rt, self.st, f"scenario {d.scenario} has no champion")


def trigger_cycle(rt: Runtime, st: AgentState, why: str) -> None:
    """Run the agent's cycle now (a running one is left alone: the cycle job asks again when it ends)."""
    if rt.scheduler is None or st.running or rt.stop.is_set():
        return
    try:
        rt.scheduler.modify_job(job_id(st.name), next_run_time=datetime.now(timezone.utc))
        log.info("cycle of %s started now: %s", st.name, why)
    except Exception as exc:  # noqa: BLE001 - the job may be gone during shutdown
        log.warning("cannot trigger a cycle of %s: %s", st.name, exc)
