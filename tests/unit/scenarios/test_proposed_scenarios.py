"""Proposed scenarios end to end on the sim target: an agent that declares no scenario watches synthetic /metrics
expositions (a real MetricsWindow and the daemon's ScenarioSwitching), proposes a scenario for each kind of
traffic it sees, tunes each in its own study (the second warm-started from the first), cross-evaluates every
champion on every scenario's workload after each new champion (`switching.cross_eval_runs`) and switches; in a
closed loop the proposal leaves the request rate unbounded (it is the server's answer, not the traffic's)."""

from __future__ import annotations

import threading
from pathlib import Path

from tests.unit.observe.test_observe_window import exposition
from tuner.daemon.cycle import run_agent_cycle
from tuner.daemon.metrics import DaemonMetrics
from tuner.daemon.runtime import AgentState, Runtime
from tuner.daemon.traffic import ObservationWindow, ScenarioSwitching
from tuner.measure.scrape import parse
from tuner.scenarios.regions import traffic_dims
from tuner.scenarios.store import ScenarioBook


class Traffic:
    """Cumulative counters of a server whose closed loop finishes `rate` requests a second."""

    def __init__(self) -> None:
        self.prompts: list[int] = []
        self.outputs: list[int] = []

    def tick(self, rate: int, prompt: int, output: int, running: float) -> str:
        self.prompts += [prompt] * rate
        self.outputs += [output] * rate
        return exposition(self.prompts, self.outputs, running=running)


def test_traffic_outside_every_scenario_is_proposed_tuned_cross_evaluated_and_switched_to(
        agent_file, tmp_path: Path) -> None:
    path = agent_file(name="p", tracking={"enabled": False}, schedule={"every": "1h", "trials_per_cycle": 3},
                      promotion={"policy": "auto", "verify_runs": 2, "min_improvement": 0.0, "confidence": 0.6},
                      switching={"dwell_s": 3, "propose": True, "cross_eval_runs": 2},
                      watch={"url": "http://127.0.0.1:1/metrics", "interval_s": 1, "window_s": 4},
                      at={"target.noise_cv": 0.0, "workload.num_requests": 40})
    from tuner.agent import load_agent

    spec = load_agent(path).spec
    assert not spec.scenarios
    sd = tmp_path / "state"
    rt = Runtime(state_dir=sd, stop=threading.Event(), agents={}, locks={}, metrics=DaemonMetrics(), grace_s=1)
    st = AgentState("p", path)
    window, switching = ObservationWindow(st, spec), ScenarioSwitching(rt, st, spec)
    book = ScenarioBook(sd, "p")
    server = Traffic()
    clock = [1000.0]
    cycles: list[dict] = []

    def run(seconds: int, rate: int, prompt: int, output: int, running: float) -> None:
        for _ in range(seconds):
            clock[0] += 1
            snap = parse(server.tick(rate, prompt, output, running))
            window(clock[0], snap)
            switching(clock[0], snap)
            if st.tune_scenario is not None:  # the daemon's cycle job: the cycle the switcher asked for
                scenario, st.tune_scenario = st.tune_scenario, None
                cycles.append(run_agent_cycle(path, sd, observation=st.observed, scenario=scenario))

    run(12, rate=8, prompt=40, output=8, running=6)  # many short requests, 6 in flight
    [busy] = book.proposed()
    assert busy.name == "observed-1" and busy.rate_per_s is None  # a closed loop: the rate is not the traffic's
    assert busy.concurrency is not None and busy.concurrency.min == 3 and busy.concurrency.max == 12
    assert busy.output_tokens is not None and busy.output_tokens.min == 4
    assert [c["scenario"] for c in cycles] == ["observed-1"] and cycles[0]["workload_source"] == "observed"
    assert cycles[0]["check"]["action"] in ("promoted", "baseline") and cycles[0]["cross_evaluated"]
    assert set(book.matrix()["cells"]) == {"observed-1"}
    assert (book.service() or {}).get("scenario") == "observed-1"

    run(8, rate=16, prompt=40, output=8, running=6)  # the champion serves it faster: the same traffic
    assert len(book.proposed()) == 1 and len(cycles) == 1

    run(14, rate=1, prompt=40, output=256, running=1)  # one long task at a time
    names = [s.name for s in book.proposed()]
    assert names == ["observed-1", "observed-2"], names
    single = book.proposed()[1]
    assert single.concurrency is not None and single.concurrency.max == 2 and single.rate_per_s is None
    assert [c["scenario"] for c in cycles] == ["observed-1", "observed-2"]
    assert cycles[1]["warm_from"] == cycles[0]["study"] and cycles[1]["warm_started"]
    assert cycles[1]["cross_evaluated"]
    m = book.matrix()
    assert set(m["cells"]) == {"observed-1", "observed-2"} and m["runs"] == 2
    for scn in ("observed-1", "observed-2"):  # every configuration measured twice on each scenario's traffic
        assert all(len(c["values"]) == 2 for c in m["cells"][scn]["configs"].values())
        assert all(g["n"] == 2 or g.get("note") == "the same configuration" for g in m["gains"][scn]["vs"].values())
    assert (book.service() or {}).get("scenario") == "observed-2"
    steps = [(e["kind"], e["scenario"]) for e in book.switches()]
    assert steps[:3] == [("propose", "observed-1"), ("tune", "observed-1"), ("switch", "observed-1")], steps
    assert ("propose", "observed-2") in steps and steps[-1] == ("switch", "observed-2"), steps


def test_an_open_loop_proposal_bounds_the_rate() -> None:
    assert "rate_per_s" in traffic_dims("poisson") and "rate_per_s" not in traffic_dims("closed")
