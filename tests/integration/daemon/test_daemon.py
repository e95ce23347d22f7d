"""The daemon as an operator runs it: a subprocess on a 5-second schedule, stopped by SIGTERM."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import optuna
import typer
import yaml
from typer.testing import CliRunner

from tests.support import agents
from tests.support.logged_proc import finish, output, start_logged
from tuner.cli import ops as cli_ops
from tuner.daemon.cycle import run_agent_cycle
from tuner.daemon.runtime import gpu_groups
from tuner.study.study import default_storage

REPO = Path(__file__).resolve().parents[3]
def write_agent(d: Path, name: str = "dsim", *, concurrency: int = 64, policy: str = "manual") -> Path:
    return agents.write_agent(d / f"{name}.yaml", name=name, schedule={"every": "5s", "trials_per_cycle": 2},
                              promotion={"verify_runs": 2, "policy": policy},
                              at={"target.noise_cv": 0.02, "workload.arrival.concurrency": concurrency})


def cycles(sd: Path, name: str) -> list[dict]:
    p = sd / name / "cycles.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.is_file() else []


def check_daemon_metrics(text: str, agent: str) -> None:
    """The exposition parses (prometheus_client's own parser); trials are counted once by state and once by
    feasibility; cycle durations, failures by cause and build info are there; no _created series."""
    from prometheus_client.parser import text_string_to_metric_families

    fams = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {f.name: [s for s in f.samples] for f in fams.values()}
    states = {s.labels["state"]: s.value for s in samples["tuner_trials"] if s.labels["agent"] == agent}
    assert {"COMPLETE", "FAIL", "RUNNING", "WAITING"} <= set(states), states
    assert not {"FEASIBLE", "INFEASIBLE", "REJECTED"} & set(states), states  # feasibility has its own metric
    feas = {s.labels["feasibility"]: s.value for s in samples["tuner_trials_by_feasibility"]}
    assert {"feasible", "infeasible"} <= set(feas) <= {"feasible", "infeasible", "rejected"}
    assert sum(feas.values()) == states["COMPLETE"]  # each completed trial counted once
    assert fams["tuner_cycle_duration_seconds"].type == "histogram"
    count = next(s.value for s in samples["tuner_cycle_duration_seconds"]
                 if s.name == "tuner_cycle_duration_seconds_count" and s.labels["agent"] == agent)
    assert count >= 1
    assert fams["tuner_trial_failures"].type == "counter"
    info = next(s for ss in samples.values() for s in ss if s.name == "tuner_build_info")
    assert info.value == 1 and info.labels["version"] and info.labels["optuna"] != "none"
    assert not any(s.name.endswith("_created") for ss in samples.values() for s in ss)


def app() -> typer.Typer:
    a = typer.Typer()
    cli_ops.register(a)
    return a


def test_daemon_runs_cycles_on_schedule_serves_health_and_stops_on_sigterm(tmp_path: Path) -> None:
    agent = write_agent(tmp_path)
    sd = tmp_path / "state"
    log = tmp_path / "daemon.log"
    proc = start_logged([sys.executable, "-m", "tuner.cli", "daemon", str(agent), "--state-dir", str(sd),
                         "--port", "0", "--grace-s", "20"], log, REPO)
    try:
        deadline = time.monotonic() + 90
        while len(cycles(sd, "dsim")) < 3 and time.monotonic() < deadline:
            assert proc.poll() is None, output(log)
            time.sleep(0.25)
        done = cycles(sd, "dsim")
        assert len(done) >= 3, done
        assert all(c["outcome"] == "ok" for c in done), done
        assert [c["trials"] for c in done[:3]] == [[0, 1], [2, 3], [4, 5]]  # 2 trials per cycle, resumed study
        assert done[1]["start_time"] - done[0]["start_time"] >= 4  # on the 5 s schedule, not back to back

        hb = json.loads((sd / "daemon" / "heartbeat.json").read_text())
        url = f"http://127.0.0.1:{hb['port']}"
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            assert r.status == 200 and json.loads(r.read())["agents"]["dsim"]["last_ok"] is True
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            text = r.read().decode()
        assert 'tuner_cycles_total{agent="dsim",outcome="ok"}' in text
        assert 'tuner_trials{agent="dsim",state="COMPLETE"}' in text and "tuner_best_objective" in text
        check_daemon_metrics(text, "dsim")
        run = CliRunner().invoke
        assert run(app(), ["check", "--url", url]).exit_code == 0
        second = subprocess.run([sys.executable, "-m", "tuner.cli", "daemon", str(agent), "--state-dir", str(sd),
                                 "--port", "-1"], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert second.returncode == 2 and "another tuner daemon" in second.stderr
        assert run(app(), ["check", "--state-dir", str(sd)]).exit_code == 0

        proc.send_signal(signal.SIGTERM)
        out = finish(proc, log, 30)
        assert proc.returncode == 0, out[-3000:]
        assert "stopped cleanly" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # stopped: `tuner check` says so; the study holds only finished trials
    assert CliRunner().invoke(app(), ["check", "--state-dir", str(sd)]).exit_code == 1
    study = optuna.load_study(study_name="dsim", storage=default_storage(sd))
    states = {t.state for t in study.trials}
    assert optuna.trial.TrialState.RUNNING not in states and len(study.trials) >= 6
    # one persistent job with a fixed id
    with sqlite3.connect(sd / "jobs.db") as db:
        assert [r[0] for r in db.execute("select id from apscheduler_jobs")] == ["cycle:dsim"]
    # the cycles and verifications show up in `tuner history`
    h = json.loads(CliRunner().invoke(app(), ["history", str(agent), "--json", "--state-dir", str(sd)]).output)
    assert len(h["cycles"]) >= 3 and h["verifications"]


def test_a_changed_workload_opens_a_new_study_warm_started_from_the_old_best(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    sd.mkdir()
    agent = write_agent(tmp_path, "plan")
    first = run_agent_cycle(agent, sd, trials=4)
    assert first["study"] == "plan" and first["trials"] == [0, 1, 2, 3]
    again = run_agent_cycle(agent, sd, trials=1)
    assert again["study"] == "plan" and again["trials"] == [4]
    write_agent(tmp_path, "plan", concurrency=32)  # the workload changed
    moved = run_agent_cycle(agent, sd, trials=3)
    assert moved["study"].startswith("plan-") and moved["study"] != "plan"
    assert len(moved["warm_started"]) == 3
    old = optuna.load_study(study_name="plan", storage=default_storage(sd))
    new = optuna.load_study(study_name=moved["study"], storage=default_storage(sd))
    best_first: list[dict] = []
    for t in sorted((t for t in old.trials if t.user_attrs.get("feasible")), key=lambda t: -t.values[0]):
        if t.params not in best_first:
            best_first.append(t.params)
    warm = [t for t in new.trials if "warm_start_from" in t.user_attrs]
    # (a warm start still WAITING holds its params as Optuna's fixed_params)
    assert [t.params or t.system_attrs["fixed_params"] for t in warm] == best_first[:3]
    assert [t.number for t in warm] == [1, 2, 3]  # tried right after the baseline
    assert new.trials[0].user_attrs.get("baseline") and moved["trials"] == [0, 1, 2]


def test_auto_policy_cycle_promotes_a_verified_candidate(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    sd.mkdir()
    agent = write_agent(tmp_path, "auto", policy="auto")
    good = {"max_num_seqs": 128, "max_num_batched_tokens": 4096}  # ~2x the baseline's throughput
    optuna.create_study(study_name="auto", storage=default_storage(sd), direction="maximize").enqueue_trial(good)
    res = run_agent_cycle(agent, sd, trials=2)
    check = res["check"]
    assert check["candidate"] == 0 and check["verdict"]["passed"], check
    assert check["action"] == "promoted"
    champion = yaml.safe_load((sd / "auto" / "champion.yaml").read_text())
    assert champion["config"] == good and champion["verified"] and champion["evidence"]
    # the next cycle judges only new trials: the champion is not verified against itself
    nxt = run_agent_cycle(agent, sd, trials=1)
    assert nxt["check"].get("candidate") != 0


def test_agents_sharing_gpus_share_a_lock_group() -> None:
    g = gpu_groups({"a": [0, 1], "b": [1, 2], "c": [5], "d": [6, 7]})
    assert g["a"] == g["b"] and len({g["a"], g["c"], g["d"]}) == 3
    g = gpu_groups({"a": [0], "b": None, "c": [7]})  # None = every GPU: overlaps all
    assert g["a"] == g["b"] == g["c"]


def test_check_fails_without_a_daemon(tmp_path: Path) -> None:
    r = CliRunner().invoke(app(), ["check", "--state-dir", str(tmp_path)])
    assert r.exit_code == 1 and "no heartbeat" in r.output
    r = CliRunner().invoke(app(), ["check", "--url", "http://127.0.0.1:9"])
    assert r.exit_code == 1


def test_schedule_becomes_an_interval_or_cron_trigger() -> None:
    from apscheduler.triggers.cron import CronTrigger
    from apscheduler.triggers.interval import IntervalTrigger

    from tuner.daemon.scheduler import trigger_for
    from tuner.spec import ScheduleSpec

    class S:
        schedule = ScheduleSpec(every="6h")

    trig, grace = trigger_for(S)
    assert isinstance(trig, IntervalTrigger) and trig.interval.total_seconds() == 6 * 3600 and grace >= 6 * 3600
    S.schedule = ScheduleSpec(cron="30 2 * * 1")
    trig, grace = trigger_for(S)
    assert isinstance(trig, CronTrigger) and grace > 0
    assert [str(f) for f in trig.fields if f.name in ("hour", "minute", "day_of_week")] == ["1", "2", "30"]


def test_check_fails_when_the_last_cycle_failed_or_the_heartbeat_is_stale(tmp_path: Path) -> None:
    from tuner.daemon.health import check_alive, heartbeat_path

    hb = heartbeat_path(tmp_path)
    assert not hb.parent.exists()  # finding the heartbeat creates nothing (the daemon makes its folder)
    hb.parent.mkdir(parents=True)
    beat = {"pid": 1, "time": time.time(), "interval_s": 2.0, "agents": {"a": {"last_ok": True}}}
    hb.write_text(json.dumps(beat))
    assert check_alive(state_dir=tmp_path)[0]
    hb.write_text(json.dumps({**beat, "agents": {"a": {"last_ok": False, "last_error": "ConfigError: boom"}}}))
    ok, why = check_alive(state_dir=tmp_path)
    assert not ok and "boom" in why
    hb.write_text(json.dumps({**beat, "time": time.time() - 60}))
    ok, why = check_alive(state_dir=tmp_path)
    assert not ok and "old" in why


def test_cycles_of_agents_sharing_gpus_never_overlap(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    agents = []
    for name in ("gpu-a", "gpu-b"):
        p = write_agent(tmp_path, name)
        p.write_text(p.read_text().replace("every: 5s", "every: 1s") + "gpus: [0, 1]\ntracking: {enabled: false}\n")
        agents.append(p)
    log = tmp_path / "daemon.log"
    proc = start_logged([sys.executable, "-m", "tuner.cli", "daemon", *map(str, agents), "--state-dir",
                         str(sd), "--port", "-1"], log, REPO)
    try:
        deadline = time.monotonic() + 90
        while min(len(cycles(sd, "gpu-a")), len(cycles(sd, "gpu-b"))) < 3 and time.monotonic() < deadline:
            assert proc.poll() is None, output(log)
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    spans = [(c["began"], c["ended"], c["agent"]) for n in ("gpu-a", "gpu-b") for c in cycles(sd, n) if "ended" in c]
    assert {a for _, _, a in spans} == {"gpu-a", "gpu-b"} and len(spans) >= 6
    spans.sort()
    for (b1, e1, a1), (b2, _, a2) in zip(spans, spans[1:], strict=False):
        assert e1 <= b2, f"{a1} [{b1}, {e1}] overlaps {a2} from {b2}"


def test_sighup_applies_an_edited_schedule_and_keeps_the_old_one_after_a_bad_edit(tmp_path: Path) -> None:
    agent = write_agent(tmp_path)
    agent.write_text(agent.read_text().replace("every: 5s", "every: 1h"))
    sd = tmp_path / "state"
    log = tmp_path / "daemon.log"
    proc = start_logged([sys.executable, "-m", "tuner.cli", "daemon", str(agent), "--state-dir", str(sd),
                         "--port", "-1", "--grace-s", "20"], log, REPO)

    def wait_cycles(n: int, within_s: float) -> list[dict]:
        deadline = time.monotonic() + within_s
        while len(cycles(sd, "dsim")) < n and time.monotonic() < deadline:
            assert proc.poll() is None, output(log)
            time.sleep(0.2)
        return cycles(sd, "dsim")

    try:
        assert len(wait_cycles(1, 90)) == 1  # the first cycle runs at start-up
        time.sleep(3)
        assert len(cycles(sd, "dsim")) == 1  # then the hourly schedule holds
        # a bad edit: the daemon logs it, keeps running and keeps the definition in force
        good = agent.read_text()
        agent.write_text(good.replace("schedule: {every: 1h", "schedule: {every: soon"))
        proc.send_signal(signal.SIGHUP)
        time.sleep(2)
        assert proc.poll() is None and len(cycles(sd, "dsim")) == 1
        # a good edit: every 2 s from now on, without a restart
        agent.write_text(good.replace("every: 1h", "every: 2s"))
        proc.send_signal(signal.SIGHUP)
        done = wait_cycles(3, 60)
        assert len(done) >= 3 and all(c["outcome"] == "ok" for c in done), done
        proc.send_signal(signal.SIGTERM)
        out = finish(proc, log, 30)
        assert proc.returncode == 0, out[-3000:]
        bad = next(line for line in out.splitlines() if "keeping the definition in force" in line)
        assert str(agent) in bad and "schedule.every" in bad
        assert "dsim now runs on interval[0:00:02]" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_reload_restarts_a_changed_watch_and_stops_a_removed_one(tmp_path: Path) -> None:
    import threading

    from tuner.daemon.metrics import DaemonMetrics
    from tuner.daemon.runtime import AgentState, Runtime
    from tuner.daemon.scheduler import reload_agents

    agent = write_agent(tmp_path)
    base = agent.read_text()
    rt = Runtime(state_dir=tmp_path, stop=threading.Event(), agents={"dsim": AgentState("dsim", agent)},
                 locks={}, metrics=DaemonMetrics(), grace_s=1.0)
    st = rt.agents["dsim"]
    st.schedule = "interval[0:00:05]"
    # nothing changed but what the daemon tracks from the file
    assert reload_agents(rt) == {"dsim": []}
    agent.write_text(base + 'watch: {url: "http://127.0.0.1:9/metrics", interval_s: 30, window_s: 60}\n')
    assert reload_agents(rt) == {"dsim": ["watch"]}
    first = st.watch_stop
    assert first is not None and not first.is_set() and st.watch is not None
    agent.write_text(base + 'watch: {url: "http://127.0.0.1:9/metrics", interval_s: 10, window_s: 60}\n')
    assert reload_agents(rt) == {"dsim": ["watch"]}
    assert first.is_set() and st.watch_stop is not None and not st.watch_stop.is_set()
    second = st.watch_stop
    agent.write_text(base.replace("name: dsim", "name: other"))
    assert reload_agents(rt) == {"dsim": ["error: renamed"]} and not second.is_set()
    agent.write_text(base + "gpus: [0, 1]\n")
    assert reload_agents(rt) == {"dsim": ["watch", "gpus (needs a restart)"]}
    assert second.is_set() and st.watch_stop is None and st.watch is None
