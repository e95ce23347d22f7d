"""A state dir an operator would review: a sim study with feasible, SLO-breaking and failed trials, verified and
promoted; and a command-target study (the fault-injection server) whose out-of-memory trial left a server log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.agents import write_agent
from tuner.agent import load_agent
from tuner.loop import open_session, run_cycle

SUPPORT = Path(__file__).resolve().parent
FAULTY = SUPPORT / "faulty_server.py"

# the factory's sim agent with these changes
SIM_AGENT: dict[str, Any] = {
    "name": "review-sim",
    "slos": [{"metric": "ttft_ms.p99", "max": 400}],
    "sampler": {"name": "tpe", "seed": 3},
    "budget": {"trials": 10},
    "promotion": {"verify_runs": 2, "min_improvement": 0.0, "confidence": 0.9},
    "at": {"search_space.params.max_num_seqs.default": 64,
           "search_space.params.tensor_parallel_size": {"type": "categorical", "choices": [1, 2, 4, 8], "default": 1},
           "workload.arrival": {"kind": "poisson", "rate_per_s": 30},
           "workload.prompt_tokens": {"dist": "uniform", "low": 64, "high": 1024},
           "workload.num_requests": 120},
}

COMMAND_AGENT = f"""\
name: review-cmd
target:
  kind: command
  command: ["{{python}}", "{FAULTY}", "--port", "{{port}}", "--mode", "{{mode}}", "--itl-ms", "{{itl_ms}}"]
  model: fake
  startup_timeout_s: 60
search_space:
  params:
    mode: {{type: categorical, choices: [ok, oom], default: ok}}
    itl_ms: {{type: float, low: 0.5, high: 4, default: 1}}
workload:
  arrival: {{kind: closed, concurrency: 2}}
  prompt_tokens: {{dist: fixed, value: 16}}
  output_tokens: {{dist: fixed, value: 8}}
  num_requests: 12
objectives:
  - {{metric: output_throughput, direction: maximize}}
sampler: {{name: random, seed: 1}}
budget: {{trials: 4}}
"""


def sim_state(tmp: Path, *, trials: int = 10) -> tuple[Path, Path]:
    """(agent file, state dir): one cycle, a constraint-violating trial (failed: infeasible_config), and the best
    trial verified (A/B on the simulator) and promoted."""
    from tuner.promotion.act import promote_trial

    agent_path = tmp / "review-sim.yaml"
    write_agent(agent_path, **SIM_AGENT)
    sd = tmp / "state"
    session = open_session(load_agent(agent_path), sd)
    session.study.study.enqueue_trial({"max_num_seqs": 512, "max_num_batched_tokens": 256, "tensor_parallel_size": 2})
    run_cycle(session, trials=trials)
    best = session.study.best()
    assert best, "the simulated study found no feasible trial"
    promote_trial(session, trial=best[0].number, reason="review test")
    return agent_path, sd


def command_state(tmp: Path, sd: Path) -> Path:
    """A command-target cycle whose second trial runs out of memory at start-up (its log holds the traceback)."""
    agent_path = tmp / "review-cmd.yaml"
    agent_path.write_text(COMMAND_AGENT)
    session = open_session(load_agent(agent_path), sd)
    session.study.study.enqueue_trial({"mode": "oom", "itl_ms": 2.0})
    session.study.study.enqueue_trial({"mode": "ok", "itl_ms": 3.0})
    run_cycle(session, trials=3)
    return agent_path
