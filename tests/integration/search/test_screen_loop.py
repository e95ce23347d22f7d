"""Screening in a real tuning cycle on the reference engine: proposals the model predicts far outside the SLOs
are told as screened and never deployed; every budget trial is a deployed, measured configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.agent import load_agent
from tuner.loop import open_session, run_cycle
from tuner.sim.refcost import StepModel

pytestmark = pytest.mark.slow

CHEAP = [1e-3, 5e-4, 1e-5, 0.0, 2e-3, 1e-4, 0.0, 0.0, 0.0]
SLOW = [10.0] + [0.0] * 8  # 10 s a pass: predicted far beyond the p99 TTFT SLO

AGENT = """\
name: screen-loop
target: {kind: torch_engine, preset: tiny, device: cpu, cpu_threads: 1, startup_timeout_s: 90}
search_space:
  target: torch_engine
  params:
    batching: {type: categorical, choices: [static, continuous], default: static}
    dtype: {type: categorical, choices: [float32, bfloat16], default: float32}
workload:
  arrival: {kind: poisson, rate_per_s: 3}
  prompt_tokens: {dist: uniform, low: 16, high: 64}
  output_tokens: {dist: uniform, low: 4, high: 8}
  duration_s: 2
  warmup_requests: 1
  ignore_eos: true
objectives:
  - {metric: ttft_ms.mean, direction: minimize}
slos:
  - {metric: ttft_ms.p99, max: 5000}
sampler: {name: random, seed: 1, screen: {model: model.json, worse_than_best: null}}
budget: {trials: 2}
tracking: {enabled: false}
"""


def test_a_cycle_deploys_only_proposals_the_screen_passes(tmp_path: Path) -> None:
    StepModel(coef={"float32": CHEAP, "bfloat16": SLOW}).save(tmp_path / "model.json")
    (tmp_path / "agent.yaml").write_text(AGENT)
    session = open_session(load_agent(tmp_path / "agent.yaml"), tmp_path / "state")
    # the space holds two configurations the screen passes: a third trial would spend one twice (issue 26), so
    # a budget of 3 ends after 2 trials
    result = run_cycle(session, trials=3)
    assert len(result.outcomes) == 2 and all(o.cause is None for o in result.outcomes), result.outcomes
    assert all(o.params["dtype"] == "float32" for o in result.outcomes)  # deployed and measured
    screened = [t for t in session.study.trials() if t.user_attrs.get("screened")]
    assert screened and all(t.params["dtype"] == "bfloat16" for t in screened)
    assert all("metrics" not in t.user_attrs for t in screened)
    assert session.study.counts()["SCREENED"] == len(screened) and session.study.counted() == 2
