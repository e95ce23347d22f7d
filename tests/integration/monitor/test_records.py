"""A monitor event lands in MLflow (a `monitor_event` run with its plot), in the agent's events file, on the
daemon's /metrics (counter and gauge), in `tuner history` and in `tuner report`."""

from __future__ import annotations

import json
import random
from pathlib import Path

from typer.testing import CliRunner

from tests.support import agents
from tuner.cli.main import app
from tuner.daemon.cycle import run_agent_cycle
from tuner.daemon.metrics import DaemonMetrics
from tuner.monitor.classify import Event, Monitor
from tuner.monitor.config import MonitorConfig
from tuner.monitor.records import read_events, record_event
from tuner.tracking.tracker import Tracker, default_tracking_uri


def slowdown_events() -> tuple[Monitor, list[Event]]:
    rng = random.Random(3)
    m = Monitor(MonitorConfig(interval_s=15.0))
    out: list[Event] = []
    for i in range(70):
        slow = 1.3 if 40 <= i < 55 else 1.0
        out += m.observe(1000.0 + 15 * i, {"rate_per_s": rng.gauss(4, 0.4), "itl_ms_mean": rng.gauss(8, 0.3) * slow,
                                           "prompt_tokens_mean": rng.gauss(100, 5)})
    return m, out


def test_events_reach_mlflow_the_file_metrics_history_and_report(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    agent = agents.write_agent(tmp_path / "mon.yaml", name="mon", tracking={"enabled": True},
                               at={"workload.num_requests": 20})
    run_agent_cycle(agent, sd, trials=1)  # the agent has a study and a state dir
    m, events = slowdown_events()
    assert [e.kind for e in events] == ["anomaly", "recovery"]
    tracker = Tracker(default_tracking_uri(sd), "mon", artifact_dir=sd / "mlartifacts")
    metrics = DaemonMetrics()
    for e in events:
        entry = record_event(e, agent="mon", state_dir=sd, tracker=tracker)
        assert entry["run_id"]
        metrics.monitor_event("mon", e.kind, e.cause, m.opened)

    runs = tracker.runs("tags.kind = 'monitor_event'")
    assert sorted(r.data.tags["event"] for r in runs) == ["anomaly", "recovery"]
    anomaly = next(r for r in runs if r.data.tags["event"] == "anomaly")
    assert anomaly.data.tags["cause"] == "latency" and "itl_ms_mean" in anomaly.data.tags["signals"]
    assert anomaly.data.tags["reopened"] == "false" and anomaly.data.tags["episode"] == str(events[0].window)
    assert anomaly.data.metrics["itl_ms_mean_value"] > anomaly.data.metrics["itl_ms_mean_baseline"]
    arts = {a.path for a in tracker.client.list_artifacts(anomaly.info.run_id, "plots")}
    assert arts == {"plots/signals.png"}
    png = Path(tracker.client.download_artifacts(anomaly.info.run_id, "plots/signals.png", str(tmp_path)))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    stored = read_events(sd, "mon")
    assert [e["kind"] for e in stored] == ["anomaly", "recovery"]
    assert stored[0]["signals"]["itl_ms_mean"]["onset_time"] is not None

    text = metrics.render().decode()
    assert 'tuner_monitor_events_total{agent="mon",cause="latency",kind="anomaly"} 1.0' in text
    assert 'tuner_monitor_episodes_total{agent="mon",cause="latency",kind="anomaly"} 1.0' in text
    assert 'tuner_monitor_open{agent="mon",cause="latency",kind="anomaly"} 0.0' in text  # recovered

    r = CliRunner().invoke(app, ["history", str(agent), "--state-dir", str(sd), "--json"])
    assert r.exit_code == 0, r.output
    assert [e["kind"] for e in json.loads(r.output)["events"]] == ["anomaly", "recovery"]
    r = CliRunner().invoke(app, ["history", str(agent), "--state-dir", str(sd)])
    assert "anomaly (latency): performance anomaly" in r.output and "recovery (anomaly)" in r.output

    out = tmp_path / "report.html"
    r = CliRunner().invoke(app, ["report", str(agent), "--state-dir", str(sd), "--out", str(out)])
    assert r.exit_code == 0, r.output
    html = out.read_text()
    assert 'id="monitor-table"' in html and "performance anomaly (latency)" in html


def test_an_event_is_kept_in_the_file_when_mlflow_is_off(tmp_path: Path) -> None:
    _, events = slowdown_events()
    off = Tracker("sqlite:///unused.db", "x", enabled=False)
    entry = record_event(events[0], agent="a", state_dir=tmp_path, tracker=off)
    assert entry["run_id"] is None and read_events(tmp_path, "a")[0]["kind"] == "anomaly"
