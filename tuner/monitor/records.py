"""Where a monitor event goes: a run in MLflow (kind `monitor_event`, through tuner.tracking.tracker, with a
plot of the signals around the change and the event as JSON) and a line in the agent's events file
(<state>/<agent>/monitor_events.jsonl), which `tuner history` and `tuner report` read. The daemon's /metrics
counter and gauge are the daemon's (tuner.daemon.metrics)."""

from __future__ import annotations

import logging
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from tuner.champions.store import append_jsonl, read_jsonl
from tuner.monitor.classify import Event
from tuner.tracking.tracker import Tracker

log = logging.getLogger(__name__)

EVENTS_FILE = "monitor_events.jsonl"
RUN_KIND = "monitor_event"


def events_path(state_dir: Path, agent: str) -> Path:
    return Path(state_dir) / agent / EVENTS_FILE


def read_events(state_dir: Path, agent: str) -> list[dict[str, Any]]:
    """The agent's recorded events, oldest first ([] when there are none), each with the answer recorded
    for it later (`response`: a re-verification's outcome) where there is one."""
    events: list[dict[str, Any]] = []
    responses: dict[str, dict[str, Any]] = {}
    for e in read_jsonl(events_path(state_dir, agent)):
        if "response_to" in e:
            responses[str(e["response_to"])] = e.get("response") or {}
        else:
            events.append(e)
    for e in events:
        if str(e.get("uid")) in responses:
            e["response"] = responses[str(e["uid"])]
    return events


def record_event(ev: Event, *, agent: str, state_dir: Path, tracker: Tracker | None) -> dict[str, Any]:
    """Write the event to MLflow (if a tracker is given and enabled) and to the events file; the stored entry
    (with the MLflow run id, None when MLflow was off or down: the file still has the event)."""
    entry = {**ev.summary(), "agent": agent, "run_id": None, "uid": uuid.uuid4().hex}
    if tracker is not None and tracker.enabled:
        entry["run_id"] = _to_mlflow(ev, agent, tracker)
    append_jsonl(events_path(state_dir, agent), entry)
    return entry


def record_response(entry: dict[str, Any], response: dict[str, Any], *, state_dir: Path) -> None:
    """The answer to a recorded event (it may come minutes later): a line of its own, joined to the event by
    read_events."""
    append_jsonl(events_path(state_dir, str(entry["agent"])), {"response_to": entry["uid"], "time": time.time(),
                                                              "response": response})


def _to_mlflow(ev: Event, agent: str, tracker: Tracker) -> str | None:
    import json

    from tuner.tracking.plots import signal_plot

    run_id = tracker.start_run(f"{ev.kind}-{ev.cause}", tags={
        "kind": RUN_KIND, "agent": agent, "event": ev.kind, "cause": ev.cause, "detail": ev.detail[:4000],
        "signals": ",".join(ev.signals), "episode": str(ev.episode), "reopened": str(ev.reopened).lower()})
    if run_id is None:
        return None
    metrics: dict[str, float] = {"window": float(ev.window), "event_time": ev.time}
    for name, s in ev.signals.items():
        for key in ("baseline", "value"):
            if isinstance(s.get(key), int | float):
                metrics[f"{name}_{key}"] = float(s[key])
    metrics.update({f"observed_{k}": v for k, v in ev.observed.items()})
    tracker.log(run_id, metrics=metrics)
    tracker.log_text(run_id, json.dumps(ev.summary(), indent=2, sort_keys=True, default=str), "event.json")
    try:
        data = signal_plot(ev.series, event_time=ev.time,
                           baselines={n: s.get("baseline") for n, s in ev.signals.items()},
                           onsets={n: s.get("onset_time") for n, s in ev.signals.items()}, title=ev.detail[:120])
    except Exception as exc:  # noqa: BLE001 - a plot must never lose the event
        log.warning("monitor: the plot of the %s event failed: %s", ev.kind, exc)
        data = None
    if data is not None:
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "signals.png").write_bytes(data)
            tracker.log_dir(run_id, Path(d), "plots")
    tracker.end_run(run_id)
    return run_id
