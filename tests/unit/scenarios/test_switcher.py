"""Scenarios: where observed traffic falls, and the switching state machine's hysteresis, fed with synthetic
observations and their times (no clock)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.agent import load_agent
from tuner.errors import ConfigError
from tuner.scenarios.regions import classify, contains, distance, nearest, point_of, propose
from tuner.scenarios.switcher import Switcher
from tuner.spec import ScenarioSpec, SwitchingSpec

BUSY = ScenarioSpec(name="busy", concurrency={"min": 8}, prompt_tokens={"max": 512})
LONG = ScenarioSpec(name="long", concurrency={"max": 2}, output_tokens={"min": 256})
POLICY = SwitchingSpec(dwell_s=30, enter_margin=0.1, exit_margin=0.3)

BUSY_PT = {"concurrency": 32.0, "prompt_tokens": 128.0, "output_tokens": 32.0}
LONG_PT = {"concurrency": 1.0, "prompt_tokens": 128.0, "output_tokens": 1024.0}


def test_points_fall_in_their_scenario_with_margins() -> None:
    assert classify([BUSY, LONG], BUSY_PT) == "busy"
    assert classify([BUSY, LONG], LONG_PT) == "long"
    assert classify([BUSY, LONG], {"concurrency": 4.0, "output_tokens": 100.0}) is None
    edge = {"concurrency": 8.2, "prompt_tokens": 128.0}
    assert contains(BUSY, edge) and not contains(BUSY, edge, 0.1)  # inside, but not inside the enter region
    assert contains(BUSY, {"concurrency": 6.5}, -0.3) and not contains(BUSY, {"concurrency": 6.0}, -0.3)
    assert distance(BUSY, BUSY_PT) == 0 and distance(BUSY, {"concurrency": 4.0}) == pytest.approx(0.693, abs=1e-3)
    assert nearest([BUSY, LONG], LONG) == BUSY
    assert point_of({"concurrency": 3, "rate_per_s": 2.0, "prompt_tokens_mean": 100, "x": 1}) == {
        "concurrency": 3.0, "rate_per_s": 2.0, "prompt_tokens": 100.0}
    p = propose({"concurrency": 4.0, "output_tokens": 100.0}, "observed-1", 2.0)
    assert classify([BUSY, LONG, p], {"concurrency": 4.0, "output_tokens": 100.0}) == "observed-1"


def feed(sw: Switcher, points: list[tuple[float, dict[str, float]]], champions: set[str]) -> list[tuple]:
    out = []
    for t, pt in points:
        out += [(d.kind, d.scenario, d.at_s) for d in sw.observe(t, pt, lambda s: s in champions)]
    return out


def test_a_switch_needs_the_dwell_time_without_a_break() -> None:
    sw = Switcher([BUSY, LONG], POLICY, active="busy")
    # long traffic for 20 s, a busy blip, then long traffic again: the dwell starts anew
    pts = [(t, LONG_PT) for t in (0, 10, 20)] + [(25, BUSY_PT)] + [(t, LONG_PT) for t in (30, 40, 50, 60, 70)]
    assert feed(sw, pts, {"busy", "long"}) == [("switch", "long", 60)]
    assert sw.active == "long"


def test_traffic_at_a_boundary_does_not_flap() -> None:
    sw = Switcher([BUSY, LONG], POLICY, active="busy")
    # concurrency wanders around busy's lower bound 8 (6.5 .. 9.5): inside busy's exit region all along
    pts = [(float(t), {"concurrency": 6.5 + 3 * (t % 2), "prompt_tokens": 128.0}) for t in range(0, 600, 5)]
    assert feed(sw, pts, {"busy", "long"}) == []
    assert sw.active == "busy"
    # nor between two scenarios that touch: entering needs the enter region, leaving needs the exit region
    a = ScenarioSpec(name="a", concurrency={"max": 10})
    b = ScenarioSpec(name="b", concurrency={"min": 10})
    sw = Switcher([a, b], POLICY, active="a")
    # a minute at 10.5, a minute at 9.5, ...: without margins it would switch every minute (dwell 30 s)
    pts = [(float(t), {"concurrency": 10.5 if (t // 60) % 2 == 0 else 9.5}) for t in range(0, 600, 5)]
    assert feed(sw, pts, {"a", "b"}) == []
    assert feed(Switcher([a, b], POLICY.model_copy(update={"enter_margin": 0, "exit_margin": 0}), active="a"),
                pts, {"a", "b"}) == [("switch", "b", 30), ("switch", "a", 90), ("switch", "b", 150),
                                     ("switch", "a", 210), ("switch", "b", 270), ("switch", "a", 330),
                                     ("switch", "b", 390), ("switch", "a", 450), ("switch", "b", 510),
                                     ("switch", "a", 570)]
    # a clear move is followed after the dwell time
    assert feed(sw, [(600.0 + t, {"concurrency": 20.0}) for t in range(0, 60, 5)], {"a", "b"}) == [
        ("switch", "b", 630.0)]


def test_no_switch_within_the_hold_time_after_one() -> None:
    sw = Switcher([BUSY, LONG], SwitchingSpec(dwell_s=10, min_hold_s=100), active="busy", last_switch_s=0)
    pts = [(t, LONG_PT) for t in range(0, 200, 10)]
    assert feed(sw, pts, {"busy", "long"}) == [("switch", "long", 100)]


def test_a_scenario_without_champion_is_tuned_first_then_switched_to() -> None:
    sw = Switcher([BUSY, LONG], POLICY, active="busy")
    champions = {"busy"}
    got = feed(sw, [(t, LONG_PT) for t in (0, 10, 20, 30, 40, 50)], champions)
    assert got == [("tune", "long", 30)]  # asked once, not at every observation
    champions.add("long")  # the cycle promoted long's champion
    assert feed(sw, [(60, LONG_PT)], champions) == [("switch", "long", 60)]


def test_traffic_outside_every_scenario_is_proposed_once_and_joins() -> None:
    sw = Switcher([BUSY, LONG], POLICY.model_copy(update={"propose": True}), active="busy")
    odd = {"concurrency": 4.0, "prompt_tokens": 2000.0, "output_tokens": 100.0}
    got = sw.observe(0, odd, lambda s: True) + sw.observe(40, odd, lambda s: True) + sw.observe(50, odd,
                                                                                                 lambda s: True)
    assert [d.kind for d in got] == ["propose"]
    sw.add(propose(got[0].point, "observed-1", 2.0))
    d = sw.observe(60, odd, lambda s: False)  # dwell counted since the traffic came: tuned now
    assert [(x.kind, x.scenario) for x in d] == [("tune", "observed-1")]
    assert "observed-1" in d[0].reason and "concurrency 4" in d[0].reason


def test_scenario_schema_errors_are_located(tmp_path: Path, agent_file) -> None:
    ok = agent_file(scenarios=[{"name": "busy", "concurrency": {"min": 8}}], switching={"dwell_s": 5})
    assert load_agent(ok).spec.scenarios[0].concurrency.min == 8
    f = agent_file(switching={"cross_eval_runs": 1}, file="bad.yaml")
    with pytest.raises(ConfigError, match="switching.cross_eval_runs.*at least 2"):
        load_agent(f)
    for bad, where in (([{"name": "x"}], "scenarios.0"),
                       ([{"name": "x", "rate_per_s": {"min": 5, "max": 1}}], "scenarios.0.rate_per_s"),
                       ([{"name": "x", "concurrency": {}}], "scenarios.0.concurrency"),
                       ([{"name": "x", "concurrency": {"min": 1}}, {"name": "x", "concurrency": {"min": 2}}],
                        "scenarios"),
                       ([{"name": "x", "prompt_len": {"min": 1}}], "scenarios.0.prompt_len")):
        f = agent_file(scenarios=bad, file="bad.yaml")
        with pytest.raises(ConfigError) as e:
            load_agent(f)
        assert "bad.yaml:" in str(e.value) and where in str(e.value), str(e.value)
