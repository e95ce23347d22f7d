"""Canary rollouts on live traffic: the reference engine (tiny preset, CPU) as stable and canary replicas behind a
real HAProxy, traffic from `tuner bench` through HAProxy, two rollouts judged by tuner.rollout.

1. a worse canary: the stable configuration on an engine made slower (target option step_delay_ms: every engine
   iteration sleeps that long first): it must be rolled back; how many requests it served and how many broke an
   SLO; 2. the same, much slower (past the end-to-end SLO);
3. a better canary (continuous batching where the stable replica batches statically): it must reach 100% and
   be promoted; the time each stage took and the gain measured on live traffic, against the testbed's
   interleaved A/B verification (tuner.promotion.verify) of the same two configurations.

    python experiments/canary/run.py            # about 6 minutes here
    python experiments/canary/run.py --quick    # shorter stages: a smoke run
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.agents import write_spec  # noqa: E402
from tests.support.haproxy import running_haproxy  # noqa: E402

STABLE = {"batching": "static", "batch_timeout_ms": 50.0, "max_batch_size": 8}
BETTER = {"batching": "continuous", "max_batch_size": 8}
WORSE_DELAY_MS = 60.0
MUCH_WORSE_DELAY_MS = 400.0  # 16 tokens: over 6 s end to end, past the E2E SLO
RATE_PER_S = 4.0
PROMPT, OUTPUT = 64, 16
SLO_TTFT_MS, SLO_E2EL_MS = 2000.0, 4000.0  # the quickstart's TTFT SLO: loose enough for a busy CPU


def agent_spec(socket: Path, quick: bool) -> dict[str, Any]:
    return {
        "name": "canary-exp",
        "target": {"kind": "torch_engine", "preset": "tiny", "device": "cpu", "cpu_threads": 1,
                   "startup_timeout_s": 120},
        "search_space": {"params": {
            "batching": {"type": "categorical", "choices": ["static", "continuous"], "default": "static"},
            "batch_timeout_ms": {"type": "float", "low": 0, "high": 200, "default": 50,
                                 "when": "batching == 'static'"},
            "max_batch_size": {"type": "int", "low": 1, "high": 32, "default": 8}}},
        # the testbed's workload: the same traffic shape bench sends through HAProxy
        "workload": {"arrival": {"kind": "poisson", "rate_per_s": RATE_PER_S},
                     "prompt_tokens": {"dist": "fixed", "value": PROMPT},
                     "output_tokens": {"dist": "fixed", "value": OUTPUT},
                     "duration_s": 6 if quick else 10, "warmup_requests": 4, "ignore_eos": True, "seed": 0},
        "objectives": [{"metric": "ttft_ms.mean", "direction": "minimize"}],
        "slos": [{"metric": "ttft_ms.p99", "max": SLO_TTFT_MS}, {"metric": "e2el_ms.p99", "max": SLO_E2EL_MS}],
        "promotion": {"verify_runs": 2 if quick else 3, "min_improvement": 0.05},
        "rollout": {"load_balancer": {"socket": str(socket), "backend": "llm"},
                    "stages": [10, 25, 50, 100], "max_first_stage": 10,
                    "window_s": 3 if quick else 4, "min_windows": 3 if quick else 4,
                    "min_requests": 6 if quick else 10, "max_stage_s": 90, "max_regression": 0.1,
                    "metrics": ["ttft_ms.mean", "e2el_ms.mean", "goodput_fraction"]},
    }


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def stage_table(title: str, res: Any) -> list[str]:
    rows = [f"### {title}: {res.outcome.upper()}", "",
            f"{res.reason}", "",
            "| stage | canary % (weights) | routed to canary | took s | windows | canary req (over SLO) | "
            "stable req | TTFT mean canary/stable ms | TTFT gain (lower bound) | E2E gain | outcome |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in res.stages:
        m = {x["metric"]: x for x in s.metrics}
        t, e = m.get("ttft_ms.mean"), m.get("e2el_ms.mean")
        routed = s.routed_canary / max(1, s.routed_canary + s.routed_stable)
        rows.append(
            f"| {s.index + 1} | {s.percent:g} ({s.share:.0%}) | {s.routed_canary} ({routed:.0%}) | {s.duration_s:.0f} "
            f"| {s.windows} | {s.canary_requests:.0f} ({s.canary_slo_breaking:.0f}) | {s.stable_requests:.0f} | "
            + (f"{t['canary']:.0f} / {t['stable']:.0f} | {t['improvement']:+.1%} ({t['improvement_low']:+.1%}) | "
               if t and t["canary"] == t["canary"] else "- | - | ")
            + (f"{e['improvement']:+.1%} | " if e and e["improvement"] == e["improvement"] else "- | ")
            + f"{s.outcome} |")
    rows += ["", f"canary got {res.canary_routed} requests (HAProxy's count), finished {res.canary_requests:.0f}; "
             f"{res.canary_slo_breaking:.0f} of them over an SLO threshold (TTFT {SLO_TTFT_MS:g} ms or E2E "
             f"{SLO_E2EL_MS:g} ms, from its histograms: TTFT counts requests still running); rollout "
             f"took {res.duration_s:.0f} s (stages {sum(s.duration_s for s in res.stages):.0f} s, the rest: the "
             f"canary's start, its first health check, the balancer restored)", ""]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    from tuner.base.logs import configure_logging

    configure_logging()

    from tuner.champions.db import champion_store
    from tuner.context import open_context
    from tuner.promotion.act import promote_config
    from tuner.promotion.verify import verify
    from tuner.rollout.lb import HAProxy
    from tuner.rollout.rollout import Rollout
    from tuner.targets.base import TrialContext
    from tuner.targets.torch_engine import TorchEngineOptions, TorchEngineTarget

    work = Path(tempfile.mkdtemp(prefix="canary-exp-"))
    sock = work / "hx" / "haproxy.sock"
    agent_path = write_spec(work / "canary-exp.yaml", agent_spec(sock, args.quick))
    state = work / "state"
    session = open_context(agent_path, state).session()
    store = champion_store(session)
    out: list[str] = [f"# canary experiment ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", "",
                      f"load average at the start: {loadavg()} (2 cores)", ""]
    promote_config(store, None, config=STABLE, apply_command=None, cwd=work, verified=False,
                   reason="experiment: the configuration in service")

    # the testbed's A/B figure for the same two configurations (interleaved runs, paired test)
    t0 = time.monotonic()
    verdict = verify(session, BETTER, candidate_trial=None, store=store, record=False, seed=7)
    test = verdict.test
    ab = (f"testbed A/B (tuner.promotion.verify, {test.n} interleaved pairs, {time.monotonic() - t0:.0f} s): "
          f"TTFT mean {test.improvement:+.1%} (lower 95% bound {test.improvement_low:+.1%}), "
          f"{'PASS' if verdict.passed else 'FAIL'}" if test else f"testbed A/B: {verdict.reason}")
    a_vals = [r.value for r in verdict.runs if r.arm == "A"]
    b_vals = [r.value for r in verdict.runs if r.arm == "B"]
    out += [ab, f"  stable runs TTFT mean ms: {[round(v or 0) for v in a_vals]}; candidate: "
                f"{[round(v or 0) for v in b_vals]}", ""]
    print("\n".join(out), flush=True)

    stable_target = TorchEngineTarget(TorchEngineOptions(preset="tiny", device="cpu", cpu_threads=1),
                                      agent_dir=work)
    worse_target, much_worse_target = (
        TorchEngineTarget(TorchEngineOptions(preset="tiny", device="cpu", cpu_threads=1, step_delay_ms=d),
                          agent_dir=work) for d in (WORSE_DELAY_MS, MUCH_WORSE_DELAY_MS))
    ctx = TrialContext(trial_number=-1, state_dir=state, label="stable0")
    with stable_target.deploy(STABLE, ctx) as stable, \
            running_haproxy(work / "hx", {"stable0": stable.endpoint.removeprefix("http://")}) as bal:
        lb = HAProxy(bal.socket, bal.backend)
        while not lb.servers()["stable0"].up:
            time.sleep(0.2)
        bench = subprocess.Popen(
            [sys.executable, "-m", "tuner.cli", "bench", "--url", bal.url, "--model", "torch-engine-tiny",
             "--rate", str(RATE_PER_S), "--duration-s", "900", "--prompt-tokens", str(PROMPT), "--output-tokens",
             str(OUTPUT), "--seed", "1", "--goodput", f"ttft:{SLO_TTFT_MS:g}", "--goodput", f"e2el:{SLO_E2EL_MS:g}",
             "--tokenizer", "byte"],
            cwd=work, stdout=open(work / "bench.log", "w"), stderr=subprocess.STDOUT,  # noqa: SIM115
            env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)
        time.sleep(15)  # bench's start and its warm-up through HAProxy
        loads = [loadavg()]
        try:
            for title, target, config in (("1. worse canary (engine step delay "
                                           f"{WORSE_DELAY_MS:g} ms)", worse_target, STABLE),
                                          ("2. much worse canary (engine step delay "
                                           f"{MUCH_WORSE_DELAY_MS:g} ms)", much_worse_target, STABLE),
                                          ("3. better canary (continuous batching)", stable_target, BETTER)):
                ro = Rollout(spec=session.agent.spec, store=store, tracker=session.tracker, target=target, lb=lb,
                             state_dir=state, agent_dir=work,
                             on_stage=lambda s: print(f"  stage {s.index + 1} {s.percent:g}%: {s.outcome} in "
                                                      f"{s.duration_s:.0f}s ({s.reason[:150]})", flush=True))
                print(f"{title} ...", flush=True)
                with store.lock():
                    res = ro.run(config, trial=None, study=session.study.name, reason="experiments/canary")
                loads.append(loadavg())
                rows = stage_table(title, res)
                print("\n".join(rows), flush=True)
                out += rows
        finally:
            import signal

            totals = lb.servers()["stable0"]

            os.killpg(bench.pid, signal.SIGINT)
            try:
                bench.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(bench.pid, signal.SIGKILL)
    champ = store.champion()
    out += [f"champion after both: #{champ.seq if champ else None} {champ.config if champ else None}",
            f"load average (1, 5, 15 min) after each phase: {' | '.join(loads)}", ""]
    out += [f"HAProxy's totals (stot, 5xx) of the stable replica over both rollouts: {totals.requests} requests, "
            f"{totals.errors_5xx} 5xx, {totals.errors_conn} connection/response errors"]
    print("\n".join(out[-4:]), flush=True)
    (Path(__file__).with_name("results.md")).write_text("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
