"""The watch's feed: each scrape goes to the anomaly check, the observation window (a real MetricsWindow), the
scenario switcher and any further consumer, in that order; synthetic expositions with their times, no clock."""

from __future__ import annotations

import threading
from pathlib import Path

from tests.unit.observe.test_observe_window import exposition
from tuner.agent import load_agent
from tuner.daemon.metrics import DaemonMetrics
from tuner.daemon.runtime import AgentState, Runtime
from tuner.daemon.traffic import ObservationWindow, ScenarioSwitching
from tuner.daemon.watch import AnomalyCheck, consumers_for
from tuner.measure.scrape import Snapshot, parse
from tuner.scenarios.store import ScenarioBook


def test_scrapes_feed_the_window_the_switcher_and_other_consumers(agent_file, tmp_path: Path) -> None:
    path = agent_file(name="w", tracking={"enabled": False},
                      scenarios=[{"name": "busy", "concurrency": {"min": 3}},
                                 {"name": "single", "concurrency": {"max": 1.5}}],
                      switching={"dwell_s": 5}, watch={"url": "http://127.0.0.1:1/metrics", "window_s": 4})
    spec = load_agent(path).spec
    sd = tmp_path / "state"
    rt = Runtime(state_dir=sd, stop=threading.Event(), agents={}, locks={}, metrics=DaemonMetrics(), grace_s=1)
    st = AgentState("w", path)
    seen: list[float] = []

    def mine(_rt: Runtime, _st: AgentState, _spec: object):
        return lambda t, snap: seen.append(t) if isinstance(snap, Snapshot) else None

    feed = consumers_for(rt, st, spec, extra=[mine])
    assert [type(c) for c in feed[:3]] == [AnomalyCheck, ObservationWindow, ScenarioSwitching]
    done = 0
    for i in range(12):  # 8 requests a second finish, 6 in flight: the busy scenario
        for consume in feed:
            consume(1000.0 + i, parse(exposition([40] * done, [8] * done, running=6)))
        done += 8
    assert seen == [1000.0 + i for i in range(12)]
    assert st.observed is not None and st.observed.stats["concurrency_mean"] == 6
    assert st.observed.end_s - st.observed.start_s <= 5  # the rolling window
    # in busy for the dwell time, busy has no champion: a cycle for it is asked for (no scheduler here)
    assert st.tune_scenario == "busy"
    journal = ScenarioBook(sd, "w").switches()
    assert [(e["kind"], e["scenario"]) for e in journal] == [("tune", "busy")]
    assert journal[0]["observation"]["stats"]["rate_per_s"] == 8
