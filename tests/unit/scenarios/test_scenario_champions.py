"""Scenario champions on the sim target: one study and champion per scenario, a new scenario warm-started from
the nearest one, the observed workload kept until it moves past the refit threshold, a switch through the Act
path (audit, MLflow aliases, service record) and the cross-evaluation matrix with intervals."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tuner.champions.store import ChampionStore
from tuner.context import open_context
from tuner.loop import finish_tracking, run_cycle
from tuner.promotion.act import check_and_act
from tuner.scenarios.act import put_in_service
from tuner.scenarios.matrix import cross_evaluate
from tuner.scenarios.session import plan_cycle, scenario_of
from tuner.scenarios.store import ScenarioBook
from tuner.scenarios.table import gain_text, scenario_rows
from tuner.spec import WorkloadSpec


@dataclass
class Obs:
    """An observation as tuner.observe gives one (the fields the scenarios read)."""

    workload: WorkloadSpec
    stats: dict[str, float]
    start_s: float = 1000.0
    end_s: float = 1060.0
    source: str = "metrics http://127.0.0.1:1/metrics"
    fit_error: dict[str, float] = field(default_factory=lambda: {"prompt_tokens_mean_rel_err": 0.01})


def obs(concurrency: int, prompt: int, output: int) -> Obs:
    wl = WorkloadSpec.model_validate({"arrival": {"kind": "closed", "concurrency": concurrency},
                                      "prompt_tokens": {"dist": "fixed", "value": prompt},
                                      "output_tokens": {"dist": "fixed", "value": output}, "num_requests": 40})
    return Obs(wl, {"concurrency_mean": float(concurrency), "rate_per_s": 5.0,
                    "prompt_tokens_mean": float(prompt), "output_tokens_mean": float(output)})


SCENARIOS = [{"name": "busy", "concurrency": {"min": 8}},
             {"name": "long", "concurrency": {"max": 2}, "output_tokens": {"min": 128}}]


def _cycle(ctx, o, trials: int = 3):
    planned = plan_cycle(ctx, o)
    s = planned.session
    res = run_cycle(s, trials=trials, finish=False)
    act = check_and_act(s)
    finish_tracking(s, interrupted=res.interrupted)
    return planned, act


def test_each_scenario_has_its_study_and_champion_and_a_switch_goes_through_act(agent_file, tmp_path: Path) -> None:
    path = agent_file(scenarios=SCENARIOS, promotion={"policy": "auto", "verify_runs": 2, "min_improvement": 0.0,
                                                      "confidence": 0.6},
                      at={"target.noise_cv": 0.0})
    sd = tmp_path / "state"
    ctx = open_context(path, sd)
    busy = obs(32, 256, 32)
    assert scenario_of(ctx, busy) == "busy" and scenario_of(ctx, obs(1, 256, 512)) == "long"
    planned, act = _cycle(ctx, busy)
    assert planned.scenario == "busy" and planned.session.study.name == "agent.busy"
    tuned = planned.session.agent.spec.workload
    assert planned.workload_source == "observed" and tuned.arrival == busy.workload.arrival
    assert (tuned.prompt_tokens, tuned.output_tokens) == (busy.workload.prompt_tokens, busy.workload.output_tokens)
    assert tuned.num_requests == 100  # the traffic's shape, the agent's measurement protocol
    assert act["action"] == "promoted", act
    book = ScenarioBook(sd, "agent")
    assert book.has_champion("busy") and not book.has_champion("long")
    assert not (sd / "agent" / "champion.yaml").exists()  # a scenario's champion is not in service by itself
    fitted = book.fitted("busy")
    assert fitted["observation"]["source"].startswith("metrics") and fitted["observation"]["window_s"] == 60

    # a new scenario: its own study, warm-started from the nearest scenario's best trials
    planned_long, _ = _cycle(open_context(path, sd), obs(1, 256, 512), trials=2)
    assert planned_long.session.study.name == "agent.long"
    assert planned_long.warm_from == "agent.busy" and planned_long.warm_started
    # a small change of busy's traffic keeps its study and fitted workload; a large one refits and moves on
    small = plan_cycle(open_context(path, sd), obs(36, 256, 32))
    assert small.session.study.name == "agent.busy" and small.workload_source == "fitted"
    assert small.session.agent.spec.workload == tuned and 0 < small.refit_change < 0.3
    big = plan_cycle(open_context(path, sd), obs(128, 256, 32))
    assert big.session.study.name.startswith("agent.busy-") and big.workload_source == "observed"
    assert big.warm_from == "agent.busy" and big.warm_started

    # the switch: busy's champion in service through the Act path
    agent = open_context(path, sd).agent
    tracker = open_context(path, sd).tracker()
    entry = put_in_service(agent, sd, "busy", reason="traffic in busy for 60s", tracker=tracker, previous=None)
    main = ChampionStore(sd, "agent")
    champ_busy = book.champions("busy").champion()
    assert main.champion().config == champ_busy.config and entry["action"] == "switched"
    assert main.champion().evidence == champ_busy.evidence and main.champion().verified
    assert any(e["action"] == "promote" and "scenario busy" in e["reason"] for e in main.audit_log())
    assert book.service()["scenario"] == "busy" and book.switches()[-1]["kind"] == "switch"
    assert tracker.alias_version("agent", "scenario-busy") == champ_busy.model_version
    assert tracker.alias_version("agent", "champion") == main.champion().model_version
    assert [r.data.tags["scenario"] for r in tracker.runs("tags.kind = 'switch'")] == ["busy"]


def test_cross_evaluation_measures_every_champion_on_every_scenario(agent_file, tmp_path: Path) -> None:
    long_wl = {"arrival": {"kind": "closed", "concurrency": 1}, "prompt_tokens": {"dist": "fixed", "value": 128},
               "output_tokens": {"dist": "fixed", "value": 256}, "num_requests": 3}
    scenarios = [{**SCENARIOS[0], "workload": {"arrival": {"kind": "closed", "concurrency": 64},
                                               "num_requests": 64}},
                 {**SCENARIOS[1], "workload": long_wl}]
    path = agent_file(scenarios=scenarios, tracking={"enabled": False},
                      promotion={"policy": "auto", "verify_runs": 2, "min_improvement": 0.0, "confidence": 0.6},
                      at={"target.noise_cv": 0.02})
    sd = tmp_path / "state"
    ctx = open_context(path, sd)
    planned = plan_cycle(ctx, None, "busy")
    assert planned.workload_source == "declared"
    run_cycle(planned.session, trials=3)
    check_and_act(planned.session)
    out = cross_evaluate(open_context(path, sd), runs=3)
    assert set(out["cells"]) == {"busy", "long"}
    g = out["gains"]["busy"]
    assert g["own"] == "busy" and set(g["vs"]) == {"baseline"}  # long has no champion yet
    vs = g["vs"]["baseline"]
    assert vs["n"] == 3 and vs["low"] <= vs["improvement"] <= vs["high"]
    assert out["gains"]["long"]["own"] == "baseline" and set(out["gains"]["long"]["vs"]) == {"busy"}
    rows = scenario_rows(open_context(path, sd).agent, sd)
    assert [r["scenario"] for r in rows] == ["busy", "long"]
    assert rows[0]["champion"]["changed"] and "[" in gain_text(rows[0]["gain_vs_baseline"])
    assert yaml.safe_dump(rows)  # plain data for the CLI and the report
