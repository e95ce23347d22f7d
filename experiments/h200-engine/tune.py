"""A short tuning run of the reference engine (agent-h200.yaml) and its best trial against the baseline.

    python experiments/h200-engine/tune.py               # on the H200: writes $OUT/tune.md
    python experiments/h200-engine/tune.py --smoke       # tiny preset on the CPU, 3 short trials

Needs the tuner's own dependencies (optuna, pydantic, sqlalchemy, ...): on the GPU host they travel as
wheels (run_all.sh installs them). MLflow tracking is off in the agent; the Optuna study is in $OUT.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

KEYS = [("request_goodput", "goodput req/s"), ("request_throughput", "req/s"), ("output_throughput", "out tok/s"),
        ("p99_ttft_ms", "p99 TTFT ms"), ("p99_itl_ms", "p99 ITL ms"), ("error_rate", "error rate"),
        ("cold_start_s", "cold start s")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--trials", type=int, default=None)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()

    from tuner.agent import load_agent
    from tuner.loop import open_session, run_cycle

    agent = load_agent(Path(__file__).with_name("agent-h200.yaml"))
    trials = a.trials
    if a.smoke:
        spec = agent.spec
        target = spec.target.model_copy(update={"preset": "tiny", "device": "cpu"})
        # the smoke run checks the script, not the CPU's speed: short requests, a request timeout far above what
        # one takes on any CPU (on a 2-core host beside 10-20 busy processes the H200 workload's 20 s ended
        # every baseline request in a timeout), and latency SLOs that every answered request meets, so that a
        # slow or busy machine still has a feasible baseline to report against
        timeout_s = 300.0
        workload = spec.workload.model_copy(update={
            "duration_s": 3.0, "arrival": spec.workload.arrival.model_copy(update={"rate_per_s": 3.0}),
            "warmup_requests": 2, "timeout_s": timeout_s,
            "prompt_tokens": spec.workload.prompt_tokens.model_copy(update={"low": 16, "high": 128}),
            "output_tokens": spec.workload.output_tokens.model_copy(update={"low": 8, "high": 32})})
        slos = [slo.model_copy(update={"max": timeout_s * 1000}) if slo.max is not None and "_ms" in slo.metric
                else slo for slo in spec.slos]
        agent = agent.model_copy(update={"spec": spec.model_copy(update={"target": target, "workload": workload,
                                                                         "slos": slos})})
        from tuner.targets.registry import target_class

        agent = agent.model_copy(update={"target_options": target_class("torch_engine").Options.model_validate(
            agent.spec.target.options)})
        trials = trials or 3
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    session = open_session(agent, out / "tune-state")
    outcomes: list[Any] = []

    def on_trial(o: Any) -> None:
        print(f"trial {o.number}: {o.values} {o.cause or ''} {time.perf_counter() - t0:.0f}s", flush=True)
        outcomes.append(o)
        # after every trial, so that a run cut short by its time limit still leaves its figures
        write_report(out / "tune.md", agent, session, outcomes, time.perf_counter() - t0, final=False)

    run_cycle(session, trials=trials, on_trial=on_trial)
    print(write_report(out / "tune.md", agent, session, outcomes, time.perf_counter() - t0, final=True))


def write_report(path: Path, agent: Any, session: Any, outcomes: list[Any], elapsed_s: float, *,
                 final: bool) -> str:
    base = session.study.baseline()
    best = session.study.best()
    status = "" if final else " (so far: the run is still going, or was cut short)"
    lines = [f"# Short tuning run of the reference engine ({agent.spec.target.options})", "",
             f"{len(outcomes)} trials in {elapsed_s:.0f} s{status}; target {session.target.describe()}", ""]
    rows = [("baseline", base)] + [(f"best (trial {t.number})", t) for t in best[:1]]
    lines.append("| | " + " | ".join(h for _, h in KEYS) + " |")
    lines.append("|---|" + "---:|" * len(KEYS))
    for label, t in rows:
        if t is None:
            continue
        m = t.user_attrs.get("metrics", {})
        lines.append(f"| {label} | " + " | ".join(f"{m.get(k, float('nan')):.4g}" for k, _ in KEYS) + " |")
    if base is not None and best and base.values and base.values[0] > 0:
        lines += ["", f"tuned goodput / baseline goodput: {best[0].values[0] / base.values[0]:.1f}x (target >= 5x)"]
    elif base is not None and base.values is not None and base.values[0] <= 0:
        lines += ["", "the baseline's goodput is 0: no request met the SLOs (see its p99 TTFT and ITL)"]
    if best:
        lines += ["", "best configuration: " + ", ".join(f"{k}={v}" for k, v in best[0].params.items())]
    lines += ["", "| trial | goodput | feasible | cause | params |", "|---:|---:|---|---|---|"]
    for o in outcomes:
        value = format(o.values[0], ".4g") if o.values else ""
        lines.append(f"| {o.number} | {value} | {o.feasible} | {o.cause or ''} | "
                     + ", ".join(f"{k}={v}" for k, v in o.params.items()) + " |")
    text = "\n".join(lines) + "\n"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return text


if __name__ == "__main__":
    main()
