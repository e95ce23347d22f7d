"""The production monitor in the daemon: a consumer of the watch's scrapes (`MonitorFeed`, one per agent whose
`watch.monitor` is set) that reads the GPU telemetry, feeds tuner.monitor's Monitor, and answers each event:

- its expectation (tuner.monitor.expect): the champion's trial carried to the observed load by the agent's
  screening simulator, built at the first scrape and again after a rollback; and the server's CPU wait
  (tuner.monitor.contention) when `cpu_wait_source` names where to read it, and its host's CPU steal when
  `cpu_steal_source` does;
- every event: a record (MLflow and the agent's events file), tuner_monitor_events / tuner_monitor_open on
  /metrics, a log line;
- drift: the agent's next cycle now (it tunes the traffic the event observed);
- anomaly: an alert, and with `on_anomaly: reverify` the champion re-verified against the baseline on the
  testbed in the background (tuner.monitor.respond), rolled back if it lost; never while a cycle or another
  re-verification of the agent runs (they share the GPU group's lock).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tuner.base.redact import redact_text
from tuner.daemon.runtime import AgentState, Runtime, job_id
from tuner.daemon.watch import CONSUMERS
from tuner.measure.scrape import Snapshot
from tuner.monitor.classify import Event, Monitor
from tuner.monitor.config import MonitorConfig
from tuner.monitor.contention import CpuSteal, CpuWait
from tuner.monitor.expect import ChampionExpectation
from tuner.monitor.hostspeed import HostSpeedReader, shared
from tuner.monitor.records import record_event, record_response
from tuner.monitor.telemetry import DcgmTelemetry, NvmlTelemetry
from tuner.spec import AgentSpec
from tuner.tracking.tracker import Tracker

log = logging.getLogger(__name__)


class MonitorFeed:
    """Call it with each scrape of the watched server (its time in seconds since the epoch)."""

    def __init__(self, rt: Runtime, st: AgentState, spec: AgentSpec) -> None:
        if spec.watch is None or spec.watch.monitor is None:
            raise ValueError(f"agent {spec.name} has no watch.monitor")
        self.rt, self.st, self.spec = rt, st, spec
        ms = spec.watch.monitor
        self.ms = ms
        self.monitor = Monitor(MonitorConfig.from_spec(ms, spec.watch.interval_s))
        self.nvml = NvmlTelemetry(ms.gpus) if ms.gpus else None
        self.dcgm = (DcgmTelemetry(ms.dcgm_prometheus_url, ms.dcgm_selector, window_s=spec.watch.interval_s)
                     if ms.dcgm_prometheus_url else None)
        self.cpu_wait = CpuWait(ms.cpu_wait_source) if ms.cpu_wait_source else None
        self.cpu_steal = CpuSteal(ms.cpu_steal_source, ms.cpu_steal_selector) if ms.cpu_steal_source else None
        # the probe on the CPU the server works on where the wait's source names its processes, else unpinned
        follow = (ms.cpu_wait_source or "") if ms.waits_of_processes else ""
        self.host_speed = HostSpeedReader(shared(follow)) if ms.host_speed_probe else None
        self._expecting = ms.expect_from_champion  # build the expectation at the next scrape
        self.tracker = Tracker.for_agent(spec, Path(rt.state_dir))
        self.responding: threading.Thread | None = None
        # set by the re-verification's thread after a rollback, applied by the watch's thread at its next scrape:
        # the Monitor is only ever touched from the thread that feeds it
        self._rolled_back = threading.Event()

    def gpu(self) -> dict[str, float]:
        out: dict[str, float] = {}
        # this host's NVML over the exporter when both are given
        for src in (self.dcgm, self.nvml, self.cpu_wait, self.cpu_steal, self.host_speed):
            if src is not None:
                out.update(src.read())
        return out

    def expectation(self) -> ChampionExpectation | None:
        """The champion's expectation (None: no champion, no trial measured, or the agent's study cannot be
        opened; the monitor then learns its baselines from the windows alone)."""
        from tuner.context import open_context
        from tuner.monitor.expect import champion_expectation

        try:
            session = open_context(self.st.path, Path(self.rt.state_dir)).session()
            return champion_expectation(session)
        except Exception as exc:  # noqa: BLE001 - the monitor works without it
            log.warning("monitor %s: no expectation from the champion: %s", self.st.name, redact_text(str(exc)))
            return None

    def __call__(self, t: float, snap: Snapshot) -> None:
        self.consume(t, snap)

    def consume(self, t: float, snap: Snapshot) -> list[Event]:
        """One scrape in; the events it raised (each answered)."""
        if self._rolled_back.is_set():
            self._rolled_back.clear()
            self.monitor.relearn()  # a new champion serves: a new normal
            self._expecting = self.ms.expect_from_champion
        if self._expecting:
            self._expecting = False
            self.monitor.expectation = self.expectation()
        events = self.monitor.scrape(t, snap, self.gpu())
        self.rt.metrics.monitor_unjudged.labels(self.st.name).set(self.monitor.unjudged)
        found_in = self.monitor.slowdown_windows()
        self.rt.metrics.monitor_slowdown_windows.labels(self.st.name).set(math.nan if found_in is None else found_in)
        smallest = self.monitor.detectable_slowdown()
        self.rt.metrics.monitor_detectable_slowdown.labels(self.st.name).set(math.nan if smallest is None
                                                                              else smallest)
        for ev in events:
            try:
                self.handle(ev)
            except Exception as exc:  # noqa: BLE001 - one failing answer must not end the watch
                log.warning("monitor %s: cannot answer the %s event: %s", self.st.name, ev.kind,
                            redact_text(str(exc)))
        return events

    def handle(self, ev: Event) -> None:
        name = self.st.name
        self.rt.metrics.monitor_event(name, ev.kind, ev.cause, self.monitor.opened, reopened=ev.reopened)
        log.warning("monitor %s: %s", name, ev.detail)
        entry = record_event(ev, agent=name, state_dir=Path(self.rt.state_dir), tracker=self.tracker)
        if ev.kind == "drift":
            self.trigger_cycle()
        elif ev.kind == "anomaly" and self.ms.on_anomaly == "reverify":
            if ev.reopened:  # its episode was answered when it first opened
                record_response(entry, {"action": "alert", "reason": f"the anomaly of window {ev.episode} "
                                        "reopened soon after it recovered: one episode, answered once"},
                                state_dir=Path(self.rt.state_dir))
                return
            if self.responding is not None and self.responding.is_alive():
                return
            self.responding = threading.Thread(target=self.reverify, args=(entry,), daemon=True,
                                               name=f"tuner-reverify-{name}")
            self.responding.start()

    def trigger_cycle(self) -> None:
        rt, st = self.rt, self.st
        if rt.scheduler is None or st.running or rt.stop.is_set():
            return
        try:
            rt.scheduler.modify_job(job_id(st.name), next_run_time=datetime.now(timezone.utc))
        except Exception as exc:  # noqa: BLE001 - the job may be gone during shutdown
            log.warning("cannot trigger a cycle of %s: %s", st.name, exc)

    def reverify(self, entry: dict[str, Any]) -> None:
        from tuner.context import open_context
        from tuner.monitor.respond import reverify_champion

        rt, st = self.rt, self.st
        lock = rt.locks.get(st.name)
        if lock is not None and not lock.acquire(blocking=False):
            record_response(entry, {"action": "alert", "reason": "a cycle holds the GPUs: not re-verified"},
                            state_dir=Path(rt.state_dir))
            return
        began = time.time()
        try:
            session = open_context(st.path, Path(rt.state_dir)).session()
            out = reverify_champion(session, reason=str(entry.get("detail")), stop_event=rt.stop)
        except Exception as exc:  # noqa: BLE001 - the alert stands; the failure is recorded
            out = {"action": "alert", "reason": f"re-verification failed: {redact_text(str(exc))[:500]}"}
        finally:
            if lock is not None:
                lock.release()
        out["seconds"] = time.time() - began
        record_response(entry, out, state_dir=Path(rt.state_dir))
        if out.get("action") == "rolled_back":
            self.rolled_back()

    def rolled_back(self) -> None:
        """Another champion serves now (a rollback, from any thread): the next scrape starts a new baseline and
        a new expectation."""
        self._rolled_back.set()


def monitor_consumer(rt: Runtime, st: AgentState, spec: AgentSpec) -> Callable[[float, Snapshot], None]:
    """The watch's consumer factory: the agent's MonitorFeed, or a consumer that does nothing when its watch
    has no `monitor:`."""
    if spec.watch is None or spec.watch.monitor is None:
        return lambda t, snap: None
    return MonitorFeed(rt, st, spec)


if monitor_consumer not in CONSUMERS:
    CONSUMERS.append(monitor_consumer)  # every watch hands its scrapes to the agent's monitor
