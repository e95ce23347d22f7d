"""The daemon watching a real reference-engine server under `tuner bench` traffic: a cycle tunes the workload it
observed (recorded in the cycle journal, the study and MLflow, shown by `tuner history`), in the study of the
scenario the traffic falls in, and when the traffic moves to the other scenario and stays, that scenario is tuned
and its champion put in service (service record, switch journal, the agent's champion file)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.integration.engine.test_engine_server import start_server, wait_ready
from tests.support.agents import write_agent
from tests.support.logged_proc import finish, start_logged, stop_all, wait_while_running

REPO = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.process, pytest.mark.slow, pytest.mark.timeout(1200)]  # busy hosts: see the waits


def bench(base: str, log: Path, concurrency: int, output_tokens: int) -> subprocess.Popen[str]:
    return start_logged([sys.executable, "-m", "tuner.cli", "bench", "--url", base, "--concurrency",
                         str(concurrency), "--duration-s", "600", "--prompt-tokens", "16", "--output-tokens",
                         str(output_tokens), "--timeout-s", "60"], log, REPO)


def test_the_daemon_tunes_the_observed_traffic_and_switches_scenarios(tmp_path: Path) -> None:
    server, base, _ = start_server(tmp_path, "--batching", "continuous", "--max-batch-size", "16",
                                   "--max-model-len", "256", "--kv-pool-mb", "16")
    agent = tmp_path / "watched.yaml"
    write_agent(agent, name="watched", slos=[],
                search_space={"params": {"max_num_seqs": {"type": "int", "low": 1, "high": 64, "log": True,
                                                          "default": 1}}},
                schedule={"every": "1h", "trials_per_cycle": 3},
                promotion={"policy": "auto", "verify_runs": 2, "min_improvement": 0.0, "confidence": 0.6},
                scenarios=[{"name": "busy", "concurrency": {"min": 3}, "output_tokens": {"max": 16}},
                           {"name": "single", "concurrency": {"max": 1.5}, "output_tokens": {"min": 32}}],
                switching={"dwell_s": 2, "enter_margin": 0.1, "exit_margin": 0.2},
                watch={"url": base + "/metrics", "interval_s": 0.5, "window_s": 6},
                at={"workload.arrival.concurrency": 4, "workload.num_requests": 30, "target.noise_cv": 0.0})
    sd = tmp_path / "state"
    log = tmp_path / "daemon.log"
    traffic_log = tmp_path / "bench.log"
    book = sd / "watched" / "scenarios"
    procs: list[subprocess.Popen[str]] = []
    try:
        wait_ready(server, base)
        procs.append(bench(base, traffic_log, concurrency=16, output_tokens=8))
        daemon = start_logged([sys.executable, "-m", "tuner.cli", "daemon", str(agent), "--state-dir", str(sd),
                               "--port", "-1"], log, REPO)
        procs.append(daemon)
        journal = book / "switches.jsonl"

        def serving(name: str) -> Callable[[], bool]:  # switched to `name` (the journal's entry comes last)
            return lambda: journal.is_file() and any(r["kind"] == "switch" and r["scenario"] == name for r in
                                                     map(json.loads, journal.read_text().splitlines()))

        wait_while_running(serving("busy"), procs, log, 400)  # a 3-trial cycle: 30 s quiet, over 90 s at load 20
        procs[0].terminate()  # many short concurrent requests end; one long task at a time begins
        procs[0].wait(10)
        procs[0] = bench(base, traffic_log, concurrency=1, output_tokens=48)
        wait_while_running(serving("single"), procs, log, 400)
        daemon.send_signal(signal.SIGTERM)
        out = finish(daemon, log, 300)
    finally:
        stop_all(procs, server)
    cycles = [json.loads(x) for x in (sd / "watched" / "cycles.jsonl").read_text().splitlines()]
    tuned: dict[str, dict] = {}
    for c in cycles:  # the first cycle of each scenario (a later one may refit: the traffic settled since)
        if c.get("scenario"):
            tuned.setdefault(c["scenario"], c)
    assert set(tuned) == {"busy", "single"}, out[-3000:]
    busy, single = tuned["busy"], tuned["single"]
    # the cycle tuned the traffic it observed, not the agent's workload (a closed loop of 4, 256/64 tokens)
    assert busy["workload_source"] == "observed" and busy["observed"]["source"].startswith("metrics http://127")
    assert busy["observed"]["stats"]["concurrency_mean"] >= 3 and single["observed"]["stats"]["concurrency_mean"] < 1.5
    assert busy["workload"]["output_tokens"] != single["workload"]["output_tokens"]
    assert busy["workload"]["num_requests"] == 30  # the agent's measurement protocol
    assert busy["study"] == "watched.busy" and single["study"] == "watched.single"
    assert single["warm_from"].startswith("watched.busy")
    switches = [json.loads(x) for x in (book / "switches.jsonl").read_text().splitlines()]
    steps = [(e["kind"], e["scenario"]) for e in switches if e["kind"] in ("tune", "switch")]
    # (a new champion of the scenario in service is put in service too: a repeated step)
    assert [x for i, x in enumerate(steps) if i == 0 or steps[i - 1] != x] == [
        ("tune", "busy"), ("switch", "busy"), ("tune", "single"), ("switch", "single")], steps
    assert "switch to scenario busy" in out and "switch to scenario single" in out
    champ = yaml.safe_load((sd / "watched" / "champion.yaml").read_text())
    assert champ["config"] == yaml.safe_load((book / "single" / "champion.yaml").read_text())["config"]
    hist = subprocess.run([sys.executable, "-m", "tuner.cli", "history", str(agent), "--state-dir", str(sd)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert hist.returncode == 0, hist.stderr
    assert "tuned for: scenario busy, observed workload (rate_per_s" in hist.stdout, hist.stdout
    assert "switch single" in hist.stdout and "switch busy" in hist.stdout
    from optuna import load_study

    st = load_study(study_name="watched.busy", storage=f"sqlite:///{sd / 'optuna.db'}")
    attrs = [v for k, v in st.user_attrs.items() if k.startswith("tuned_for:")]
    assert attrs and attrs[0]["workload_source"] == "observed" and attrs[0]["observed"]["window_s"] > 0
