"""`rate_per_s: auto` on the real reference engine, deliberately slowed: the sized rate keeps the baseline feasible.

Not timed: whatever the host's speed and load, the baseline measured at the sized rate meets the SLOs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.agent import load_agent
from tuner.loop import open_session, run_cycle
from tuner.study.sizing import recorded

pytestmark = pytest.mark.slow

AGENT = """\
name: slowed-engine
target: {kind: torch_engine, preset: tiny, device: cpu, cpu_threads: 1, step_delay_ms: 25, startup_timeout_s: 90}
search_space:
  target: torch_engine
  params:
    batching: {type: categorical, choices: [static, continuous], default: static}
    max_batch_size: {type: int, low: 1, high: 16, log: true, default: 8}
workload:
  arrival: {kind: poisson, rate_per_s: auto, load: 0.7}
  prompt_tokens: {dist: uniform, low: 16, high: 96}
  output_tokens: {dist: uniform, low: 4, high: 12}
  num_requests: 40
  warmup_requests: 2
  ignore_eos: true
  timeout_s: 60
objectives:
  - {metric: request_goodput, direction: maximize}
slos:
  - {metric: ttft_ms.p99, max: 1500}
  - {metric: itl_ms.p99, max: 250}
budget: {trials: 1}
tracking: {enabled: false}
"""


def test_auto_rate_on_a_slowed_engine_gives_a_feasible_baseline(tmp_path: Path) -> None:
    p = tmp_path / "agent.yaml"
    p.write_text(AGENT)
    agent = load_agent(p)
    assert agent.target_options.step_delay_ms == 25
    session = open_session(agent, tmp_path / "state")
    lines: list[str] = []
    result = run_cycle(session, trials=1, on_sizing_step=lambda s, n: lines.append(f"{n}: {s.rate_per_s}"))
    sized = recorded(session.study)
    assert sized is not None and sized.rate_per_s > 0 and lines
    (base,) = result.outcomes
    assert base.cause is None, base.error
    t0 = session.study.trials()[0]
    assert t0.user_attrs["baseline"]
    assert base.feasible, (sized.describe(), t0.user_attrs["metrics"])
    # the engine really was slowed: no iteration is faster than the injected delay
    assert t0.user_attrs["metrics"]["p50_itl_ms"] >= 25
