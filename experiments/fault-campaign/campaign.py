"""The fault campaign: kill `tuner run` and the daemon at random points, take the MLflow server down during
a run, restart PostgreSQL under a fleet of workers, fuzz specs through `tuner validate` and requests
through the reference engine, and print the table (target: all zeros in the counted columns).

    .venv/bin/python experiments/fault-campaign/campaign.py [--kills 10] [--daemon-kills 5] [--specs 300]
        [--requests 400] [--outage-trials 40] [--pg-trials 30] [--pg-restarts 2] [--seed 0]
        [--out experiments/fault-campaign/results.md]

Everything is real: subprocesses of the tuner's own CLI, a real `mlflow server`, a throwaway PostgreSQL
cluster (initdb and pg_ctl, as tests/support/postgres.py makes it for the fleet tests), the reference
engine on the CPU, SQLite stores in a temporary directory. The table goes on top of --out; the tables
already there stay below it, as history.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

# the sim agent of every part; NUM: requests per trial
SIM_AGENT_BODY = """\
target: {kind: sim, hardware: a100-80gb-sxm, model: llama-3-8b, num_gpus: 8}
search_space:
  params:
    max_num_seqs: {type: int, low: 8, high: 512, log: true, default: 256}
    max_num_batched_tokens: {type: int, low: 256, high: 16384, log: true, default: 2048}
  constraints: ["max_num_batched_tokens >= max_num_seqs"]
workload:
  arrival: {kind: poisson, rate_per_s: 20}
  prompt_tokens: {dist: uniform, low: 64, high: 512}
  output_tokens: {dist: fixed, value: 64}
  num_requests: NUM
objectives: [{metric: output_throughput, direction: maximize}]
slos: [{metric: ttft_ms.p99, max: 5000}]
sampler: {name: random, seed: 1}
"""
AGENT = "name: campaign\n" + SIM_AGENT_BODY + """\
budget: {trials: 500}
schedule: {every: 2s, trials_per_cycle: 3}
TRACKING
"""
PY = sys.executable


def agent_file(d: Path, *, num: int = 200, tracking: str = "") -> Path:
    p = d / "agent.yaml"
    p.write_text(AGENT.replace("NUM", str(num)).replace("TRACKING", tracking))
    return p


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tuner(*args: str, env: dict[str, str] | None = None, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "tuner.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout_s, env={**os.environ, **(env or {})})


def spawn(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("ab") as f:
        return subprocess.Popen(argv, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **(env or {})})


def study_states(sd: Path, name: str = "campaign") -> dict[int, str]:
    import optuna

    from tuner.study.study import default_storage, open_storage

    if not (sd / "optuna.db").exists():
        return {}
    try:
        study = optuna.load_study(study_name=name, storage=open_storage(default_storage(sd)))
    except KeyError:
        return {}
    return {t.number: t.state.name for t in study.get_trials(deepcopy=False)}


def mlflow_runs(uri: str, experiment: str = "campaign") -> list[Any]:
    from tuner.tracking.tracker import Tracker

    tr = Tracker(uri, experiment, call_timeout_s=60)
    runs = tr._retry("campaign read", lambda: tr.runs())
    if runs is None:
        raise RuntimeError(f"cannot read the MLflow runs of {experiment} from {uri}")
    return [r for r in runs if r.data.tags.get("kind") in ("cycle", "trial", "fleet", "verification")]


def stranded(uri: str, sd: Path | None = None, *, experiment: str = "campaign",
             states: dict[int, str] | None = None) -> int:
    """MLflow runs left RUNNING, plus finished Optuna trials MLflow has no run for."""
    runs = mlflow_runs(uri, experiment)
    running = sum(r.info.status == "RUNNING" for r in runs)
    have = {int(r.data.tags["trial"]) for r in runs if r.data.tags.get("kind") == "trial"}
    states = states if states is not None else study_states(sd) if sd is not None else {}
    finished = {n for n, s in states.items() if s in ("COMPLETE", "FAIL")}
    return running + len(finished - have)


def duplicated(uri: str, experiment: str) -> int:
    """Trials with more than one MLflow trial run."""
    seen: dict[int, int] = {}
    for r in mlflow_runs(uri, experiment):
        if r.data.tags.get("kind") == "trial":
            n = int(r.data.tags["trial"])
            seen[n] = seen.get(n, 0) + 1
    return sum(1 for c in seen.values() if c > 1)


def mlflow_answers(uri: str) -> bool:
    """Whether the tracking server answers its API (not only /health): a search of one experiment."""
    import urllib.request

    req = urllib.request.Request(f"{uri}/api/2.0/mlflow/experiments/search", data=b'{"max_results": 1}',
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:  # noqa: S310 - our own local server
        return bool(r.status == 200)


def wait_for(cond: Any, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        with contextlib.suppress(Exception):
            if cond():
                return True
        time.sleep(0.2)
    return False


# ---------------------------------------------------------------------------- kills
def kill_runs(work: Path, n: int, rng: random.Random, *, daemon: bool) -> dict[str, Any]:
    """SIGKILL `tuner run` (or the daemon) at a random point, n times on one state dir; after each kill a
    `tuner run --trials 1` restarts it. Counted: finished trials lost, runs stranded after the restart,
    restarts that failed, and (daemon) `tuner check` calling a killed daemon alive."""
    sd = work / ("daemon" if daemon else "run")
    sd.mkdir()
    (work / f"{sd.name}-agent").mkdir()
    agent = agent_file(work / f"{sd.name}-agent", num=300)
    uri = f"sqlite:///{sd / 'mlflow.db'}"
    out = {"kills": 0, "survived": 0, "lost": 0, "stranded": 0, "check_wrong": 0}
    for i in range(n):
        before = study_states(sd)
        done_before = sum(s == "COMPLETE" for s in before.values())
        if daemon:
            argv = [PY, "-m", "tuner.cli", "daemon", str(agent), "--state-dir", str(sd), "--port", "-1"]
        else:
            argv = [PY, "-m", "tuner.cli", "run", str(agent), "--trials", "200", "--state-dir", str(sd)]
        proc = spawn(argv, work / f"{sd.name}-{i}.log")
        target = done_before + rng.randint(1, 4)
        wait_for(lambda t=target: sum(s == "COMPLETE" for s in study_states(sd).values()) >= t, 240)
        time.sleep(rng.uniform(0, 1.5))  # somewhere inside a trial, a tell or an MLflow write
        finished = {k for k, s in study_states(sd).items() if s in ("COMPLETE", "FAIL")}
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        out["kills"] += 1
        if daemon:
            r = tuner("check", "--state-dir", str(sd))
            out["check_wrong"] += int(r.returncode == 0)
        r = tuner("run", str(agent), "--trials", "1", "--state-dir", str(sd))
        after = study_states(sd)
        ok = r.returncode == 0 and "RUNNING" not in after.values()
        out["survived"] += int(ok)
        out["lost"] += sum(1 for k in finished if after.get(k) not in ("COMPLETE", "FAIL"))
        out["stranded"] += stranded(uri, sd)
    return out


# ---------------------------------------------------------------------------- MLflow outage
@contextlib.contextmanager
def mlflow_server(store: Path, port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    proc = spawn([PY, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                  "--backend-store-uri", f"sqlite:///{store / 'mlflow-server.db'}",
                  "--artifacts-destination", str(store / "artifacts")], log,
                 env={"MLFLOW_DISABLE_TELEMETRY": "true"})
    try:
        import urllib.request

        ok = wait_for(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200,
                      180)
        if not ok:
            raise RuntimeError("mlflow server did not start: " + log.read_text()[-2000:])
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def mlflow_outage(work: Path, trials: int, outage_s: float) -> dict[str, Any]:
    """A run of `trials` sim trials tracked on a real `mlflow server` that is down for `outage_s` seconds
    in the middle. Counted: trials missing from MLflow (or RUNNING) when the run ends, and after a restart."""
    sd = work / "outage"
    sd.mkdir()
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    (work / "outage-agent").mkdir()
    agent = agent_file(work / "outage-agent", num=150, tracking=f"tracking: {{uri: '{uri}'}}")
    store = work / "mlflow-store"
    store.mkdir()
    t0 = time.monotonic()
    with mlflow_server(store, port, work / "mlflow-1.log") as server:
        proc = spawn([PY, "-m", "tuner.cli", "run", str(agent), "--trials", str(trials), "--state-dir", str(sd)],
                     work / "outage-run.log")
        wait_for(lambda: sum(s == "COMPLETE" for s in study_states(sd).values()) >= trials // 4, 600)
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(10)
    down_at = time.monotonic()
    time.sleep(outage_s)
    with mlflow_server(store, port, work / "mlflow-2.log"):
        up_after_s = time.monotonic() - down_at
        proc.wait(1800)
        wall_s = time.monotonic() - t0
        at_end = stranded(uri, sd)
        # the next start, made once the server answers its API again (bounded wait): it must make MLflow whole
        answers = wait_for(lambda: mlflow_answers(uri), 180)
        t1 = time.monotonic()
        r = tuner("run", str(agent), "--trials", "1", "--state-dir", str(sd))
        restart_s = time.monotonic() - t1
        after_restart = stranded(uri, sd)
    done = sum(s == "COMPLETE" for s in study_states(sd).values())
    return {"trials": done, "missing_at_end": at_end, "stranded": after_restart, "outage_s": round(up_after_s, 1),
            "wall_s": round(wall_s, 1), "run_rc": proc.returncode, "restart_rc": r.returncode,
            "restart_s": round(restart_s, 1), "answered": answers}


# ---------------------------------------------------------------------------- PostgreSQL restart
PG_AGENT = "name: campaign-pg\n" + SIM_AGENT_BODY.replace("NUM", "200") + """\
budget: {trials: TRIALS}
storage: STORAGE
tracking: {uri: "MLFLOW"}
lease: {heartbeat_s: 1, timeout_s: 20}
"""


def pg_restart(work: Path, trials: int, workers: int, restarts: int, down_s: float) -> dict[str, Any]:
    """`workers` `tuner worker` processes share one study of `trials` trials on a throwaway PostgreSQL (the
    fleet tests' tests/support/postgres.py), tracked on an `mlflow server` whose backend store is the same
    PostgreSQL; PostgreSQL is restarted `restarts` times mid-run (pg_ctl stop -m fast, `down_s` down,
    start). Counted: workers that exited non-zero, trials finished before a restart and not after, budget
    trials never completed, MLflow runs stranded after the workers end and after a start made once both
    servers answer."""
    import optuna

    from tests.support import postgres
    from tests.support.mlflow_server import start_mlflow_server
    from tuner.study.study import open_storage

    if not postgres.available():
        return {"skipped": "PostgreSQL is not installed (apt-get install postgresql)"}
    out: dict[str, Any] = {"restarts": 0}
    with postgres.start_postgres() as pg:
        os.environ["PGPASSWORD"] = pg.password  # this process reads the study as a worker does
        url = pg.create_database("study")
        backend = pg.create_database("mlflow")
        with start_mlflow_server(backend, work / "pg-mlflow" / "artifacts", env=pg.env()) as mlflow_uri:
            (work / "pg-agent").mkdir()
            agent = work / "pg-agent" / "agent.yaml"
            agent.write_text(PG_AGENT.replace("TRIALS", str(trials)).replace("STORAGE", url)
                             .replace("MLFLOW", mlflow_uri))

            def states() -> dict[int, str]:
                try:
                    study = optuna.load_study(study_name="campaign-pg", storage=open_storage(url))
                except KeyError:
                    return {}
                return {t.number: t.state.name for t in study.get_trials(deepcopy=False)}

            env = {"PGPASSWORD": pg.password}
            t0 = time.monotonic()
            procs = [spawn([PY, "-m", "tuner.cli", "worker", str(agent), "--state-dir", str(work / f"pg-state-{i}")],
                           work / f"pg-worker-{i}.log", env=env) for i in range(workers)]
            finished_before: set[int] = set()
            for k in range(restarts):
                goal = (k + 1) * trials // (restarts + 1)
                wait_for(lambda g=goal: sum(s == "COMPLETE" for s in states().values()) >= g, 900)
                if all(p.poll() is not None for p in procs):
                    break
                finished_before |= {n for n, s in states().items() if s in ("COMPLETE", "FAIL")}
                pg.restart(down_s=down_s)
                out["restarts"] += 1
            rcs = []
            for p in procs:
                try:
                    rcs.append(p.wait(900))
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    rcs.append(p.wait(10))
            out["wall_s"] = round(time.monotonic() - t0, 1)
            after = states()
            out["failed_workers"] = sum(rc != 0 for rc in rcs)
            completed = sum(s == "COMPLETE" for s in after.values())
            out["completed"] = completed
            out["trials_failed"] = sum(s == "FAIL" for s in after.values())
            out["lost"] = sum(1 for n in finished_before if after.get(n) not in ("COMPLETE", "FAIL")) + max(
                0, trials - completed)
            out["missing_at_end"] = stranded(mlflow_uri, experiment="campaign-pg", states=after)
            # a start once both servers answer: a worker of the same budget reconciles, finds it spent and leaves
            wait_for(lambda: mlflow_answers(mlflow_uri), 180)
            r = tuner("worker", str(agent), "--state-dir", str(work / "pg-state-restart"), env=env)
            out["restart_rc"] = r.returncode
            out["stranded"] = stranded(mlflow_uri, experiment="campaign-pg", states=states())
            out["duplicates"] = duplicated(mlflow_uri, "campaign-pg")
    return out


# ---------------------------------------------------------------------------- spec fuzzing
HOSTILE = [float("nan"), float("inf"), float("-inf"), 10**30, -(10**30), -1, 0, 1, 1e-320, 0.5, "", "x", [], {},
           None, True, False, "x" * 10_000, [None], {"unknown": 1}, 2**64, "max_num_seqs / 0 > 1",
           "9 ** 9 ** 9 > 1", "'x' * 10 ** 10 == 'x'", "max_num_seqs < 'x'", " + ".join(["max_num_seqs"] * 5000),
           "__import__('os')", "[1] * 10 ** 9", "[[[1]*1000]*1000]*1000 == [[[1]*1000]*1000]*1000",
           "max_num_seqs in [[max_num_seqs]*900]*900", 10**10, 1e12, 1e308, "99999999999999999999d"]
RAW = ["name: &a [*a]\n",
       "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
           f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]\n" for i in range(1, 9)),
       "name: " + "[" * 3000 + "]" * 3000 + "\n", "\x00\xff", "{", "key: !!python/object/apply:os.system ['true']\n"]


def fuzz_specs(work: Path, n: int, rng: random.Random) -> dict[str, Any]:
    """n specs: the campaign agent with 1-3 random mutations (hostile values, fields removed or added), plus
    hostile YAML texts, validated in turn by a worker process: no answer in 60 s is a hang (the worker is
    replaced), over 2 s of CPU or 500 MB of peak memory counts as a hang too; an exit other than 0/2 or a
    traceback is a crash. Accepted specs run one trial (MLflow off)."""
    import yaml

    base = yaml.safe_load(AGENT.replace("NUM", "40").replace("TRACKING", "tracking: {enabled: false}"))
    from tests.support.spec_probe import spec_paths

    paths = spec_paths(base)
    texts = list(RAW)
    for _ in range(n - len(RAW)):
        spec = json.loads(json.dumps(base))
        for _ in range(rng.randint(1, 3)):
            path = rng.choice(paths)
            parent: Any = spec
            try:
                for key in path[:-1]:
                    parent = parent[key]
                op = rng.choice(["replace", "replace", "delete", "add"])
                if op == "delete" and isinstance(parent, dict):
                    parent.pop(path[-1], None)
                elif op == "add" and isinstance(parent, dict):
                    parent[f"unknown_{path[-1]}"] = rng.choice(HOSTILE)
                else:
                    parent[path[-1]] = rng.choice(HOSTILE)
            except (KeyError, IndexError, TypeError):
                continue
        texts.append(yaml.safe_dump(spec, sort_keys=False))
    paths_ = []
    for i, text in enumerate(texts):
        p = work / f"spec-{i}.yaml"
        p.write_bytes(text.encode("utf-8", "surrogateescape"))
        paths_.append(p)
    worker = work / "validate_worker.py"
    worker.write_text(_VALIDATE_WORKER)
    out = {"specs": len(texts), "accepted": 0, "crashed": 0, "hung": 0, "run_failed": 0, "max_s": 0.0}
    todo = list(range(len(paths_)))
    while todo:
        # one worker validates the specs in turn (one JSON line each); a spec without its line in 60 s hung:
        # the worker is killed and a new one goes on with the next spec
        listing = work / "todo.txt"
        listing.write_text("\n".join(f"{i}\t{paths_[i]}\t{work / f'state-{i}'}" for i in todo))
        proc = subprocess.Popen([PY, str(worker), str(listing), str(REPO)], cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, start_new_session=True)
        assert proc.stdout is not None
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        current = todo[0]
        while True:
            if not sel.select(timeout=60):
                out["hung"] += 1
                print(f"  hung: spec-{current}.yaml", flush=True)
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
                todo = todo[todo.index(current) + 1:]
                break
            line = proc.stdout.readline()
            if not line:
                proc.wait(10)
                if proc.returncode != 0 and current in todo:  # the worker died on this spec
                    out["crashed"] += 1
                    print(f"  worker died on spec-{current}.yaml", flush=True)
                    todo = todo[todo.index(current) + 1:]
                else:
                    todo = []
                break
            res = json.loads(line)
            i = res["i"]
            out["max_s"] = max(out["max_s"], res.get("validate_s", 0.0))
            if res.get("exit") not in (0, 2) or "Traceback" in res.get("output", ""):
                out["crashed"] += 1
                print(f"  crashed: spec-{i}.yaml: {res}", flush=True)
            elif res.get("validate_s", 0) > 2.0 or res.get("memory_mb", 0) > 500:
                out["hung"] += 1
                print(f"  over 2 s or 500 MB: spec-{i}.yaml: {res}", flush=True)
            elif res["exit"] == 0:
                out["accepted"] += 1
                if not res.get("run_ok"):
                    out["run_failed"] += 1
                    print(f"  accepted but run failed: spec-{i}.yaml: {res}", flush=True)
            nxt = todo.index(i) + 1
            current = todo[nxt] if nxt < len(todo) else -1
    out["max_s"] = round(out["max_s"], 2)
    return out


_VALIDATE_WORKER = r'''
import json, resource, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[2])  # the repository: tests.support.spec_probe
from typer.testing import CliRunner
from tuner.cli.main import app
from tuner.agent import load_agent
from tuner.loop import open_session, run_cycle
from tuner.tracking.tracker import Tracker
from tests.support.spec_probe import refused_values
CliRunner().invoke(app, ["--version"])
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
for line in Path(sys.argv[1]).read_text().splitlines():
    i, spec, state = line.split("\t")
    t0 = time.thread_time()
    r = CliRunner().invoke(app, ["validate", spec])
    res = {"i": int(i), "exit": r.exit_code, "validate_s": round(time.thread_time() - t0, 3), "output": r.output[-300:],
           "memory_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - rss0}
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        res["exit"] = repr(r.exception)[:200]
    if r.exit_code == 0:
        try:
            s = open_session(load_agent(spec), Path(state), tracker=Tracker("sqlite:///x.db", "x", enabled=False))
            out = run_cycle(s, trials=1)
            res["run_ok"] = len(out.outcomes) == 1 and all(t.state.name != "RUNNING" for t in s.study.trials())
            refused = refused_values(load_agent(spec))  # a value the simulator refuses at every trial
            if refused:
                res["run_ok"] = False
                res["run_error"] = "; ".join(refused)[:300]
        except Exception as exc:
            res["run_ok"] = False
            res["run_error"] = f"{type(exc).__name__}: {exc}"[:300]
    print(json.dumps(res), flush=True)
'''


# ---------------------------------------------------------------------------- request fuzzing
def fuzz_requests(work: Path, n: int, rng: random.Random) -> dict[str, Any]:
    """n hostile requests to the reference engine (tiny preset, CPU); each answer must be JSON with a
    status below 500 (or a 200 stream), /health stays 200 throughout, and a normal completion works at the
    end. Counted: requests that hurt the engine (a 5xx, a non-JSON error, a dropped connection, /health not
    200 after them)."""
    import httpx

    port = free_port()
    log = work / "engine.log"
    proc = spawn([PY, "-m", "tuner.engine.server", "--port", str(port), "--cpu-threads", "1", "--max-model-len",
                  "64", "--max-batch-size", "4", "--kv-pool-mb", "8"], log)
    base = f"http://127.0.0.1:{port}"
    hurt = 0
    statuses: dict[int, int] = {}
    try:
        if not wait_for(lambda: httpx.get(base + "/health", timeout=2).status_code == 200, 120):
            raise RuntimeError("engine did not start: " + log.read_text()[-2000:])
        values = [None, True, -1, 0, 1, 2**64, 18446744073709551616, -(2**63) - 1, 1e-320, 5e-324, 1e308, -1e-320,
                  "x", "", [], {}, [[1, 2]], ["a", 3], [2**70], "9" * 1000, {"a": {"b": [1]}}, 0.5, 64, 10**9]
        fields = ["model", "prompt", "max_tokens", "temperature", "top_p", "seed", "n", "stop", "logprobs", "echo",
                  "stream", "stream_options", "ignore_eos", "priority", "return_token_ids", "messages"]
        with httpx.Client(base_url=base, timeout=60) as c:
            for i in range(n):
                kind = rng.random()
                path = "/v1/chat/completions" if rng.random() < 0.2 else "/v1/completions"
                if kind < 0.15:
                    content = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 200)))
                elif kind < 0.2:
                    d = rng.randint(30, 100_000)
                    content = b"[" * d + b"]" * d
                elif kind < 0.25:
                    bad = rng.choice([b"NaN", b"Infinity", b"-Infinity"])
                    content = b'{"prompt": "x", "temperature": ' + bad + b"}"
                else:
                    body: dict[str, Any] = {"prompt": "hello", "max_tokens": 4}
                    for f in rng.sample(fields, rng.randint(1, 5)):
                        body[f] = rng.choice(values)
                    if path.endswith("chat/completions") and "messages" not in body:
                        body["messages"] = [{"role": "user", "content": "hi"}]
                    content = json.dumps(body).encode()
                try:
                    r = c.post(path, content=content, headers={"Content-Type": "application/json"})
                    statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                    ctype = r.headers.get("content-type", "")
                    if r.status_code >= 500 or not ctype.startswith(("application/json", "text/event-stream")):
                        hurt += 1
                        print(f"  request {i} hurt: {r.status_code} {r.text[:200]}", flush=True)
                except httpx.HTTPError as exc:
                    hurt += 1
                    print(f"  request {i} dropped: {exc}", flush=True)
                if i % 50 == 49 and c.get("/health").status_code != 200:
                    hurt += 1
                    print(f"  /health not 200 after request {i}", flush=True)
            ok = c.get("/health").status_code == 200 and c.post("/v1/completions", json={
                "prompt": "Hello", "max_tokens": 3, "temperature": 0.8, "seed": 1}).status_code == 200
    finally:
        t0 = time.monotonic()
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        stop_s = time.monotonic() - t0
    return {"requests": n, "hurt": hurt + (0 if ok else 1), "statuses": statuses, "stop_s": round(stop_s, 1)}


# ---------------------------------------------------------------------------- issue 30's classes 2, 4, 5, 13
def server_parts(a: argparse.Namespace, rng: random.Random) -> dict[str, Any]:
    """The parts in switch_and_servers.py: champion switches killed, abandoned requests, invalid Unicode, the
    daemon's endpoint under idle and slow sockets."""
    sys.path.insert(0, str(Path(__file__).parent))
    import switch_and_servers as sv

    def switch(work: Path) -> tuple[Any, ...]:
        t0 = time.monotonic()
        k = sv.switch_kills(work, a.switch_kills, rng)
        return ("SIGKILL of tuner rollback/promote", f"{k['kills']}", k["disagreed"], "-", "-", "-", "-",
                f"{k['points']}; next start first {k['starts']}, then tuner run; "
                f"{time.monotonic() - t0:.0f} s")

    def abandon(work: Path) -> tuple[Any, ...]:
        r = sv.abandoned_requests(work, a.abandon_rounds, rng)
        return ("abandoned requests (reference engine)", f"{r['rounds']} rounds", "-", "-", "-", "-", r["hurt"],
                f"{r['sequences']} sequences; kinds {r['kinds']}")

    def unicode(work: Path) -> tuple[Any, ...]:
        r = sv.invalid_unicode(work, a.unicode_requests, rng)
        return ("invalid Unicode (reference engine)", f"{r['requests']} requests", "-", "-", "-", "-", r["hurt"],
                f"statuses {r['statuses']}; no traceback in the log counted too")

    def endpoint(work: Path) -> tuple[Any, ...]:
        r = sv.daemon_endpoint(work, a.endpoint_rounds, rng)
        return ("idle and slow sockets on the daemon's endpoint", f"{r['rounds']} rounds", "-", "-", "-", "-",
                r["hurt"], f"{r['sockets']} sockets, {r['health_checks']} /health checks; threads grew by at most "
                f"{r['max_thread_growth']}")

    return {"switch": switch, "abandon": abandon, "unicode": unicode, "endpoint": endpoint}


# ---------------------------------------------------------------------------- issue 30's classes 1, 3, 6-12, 14
def input_state_parts(a: argparse.Namespace, rng: random.Random) -> dict[str, Any]:
    """The parts in inputs_and_state.py: hostile specs through validate; damaged state dirs under four commands.
    Counted in "specs crashed/hung" (inputs) and "trials lost" (state: a store shown as fine or empty loses
    what it held)."""
    sys.path.insert(0, str(Path(__file__).parent))
    import inputs_and_state as ins

    def per_class(h: dict[str, Any]) -> str:
        return ", ".join(f"{k} {m}/{v}" for k, (v, m) in sorted(h["by_class"].items()))

    def inputs(work: Path) -> tuple[Any, ...]:
        t0 = time.monotonic()
        h = ins.hostile_inputs(work, a.inputs, rng)
        return ("hostile inputs (tuner validate)", f"{h['variants']} specs", "-", "-", "-", h["mishandled"], "-",
                f"mishandled per class: {per_class(h)}; {time.monotonic() - t0:.0f} s")

    def state(work: Path) -> tuple[Any, ...]:
        t0 = time.monotonic()
        h = ins.damaged_state(work, a.states, rng)
        return ("damaged state dir (status, report, run, rollback)", f"{h['variants']} state dirs", "-",
                h["mishandled"], "-", "-", "-", f"mishandled per class: {per_class(h)}; {h['skipped']} skipped "
                f"(no tmpfs); {time.monotonic() - t0:.0f} s")

    return {"inputs": inputs, "state": state}


# ---------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--daemon-kills", type=int, default=5)
    ap.add_argument("--specs", type=int, default=300)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--outage-trials", type=int, default=40)
    ap.add_argument("--outage-s", type=float, default=20.0)
    ap.add_argument("--pg-trials", type=int, default=30)
    ap.add_argument("--pg-workers", type=int, default=2)
    ap.add_argument("--pg-restarts", type=int, default=2)
    ap.add_argument("--pg-down-s", type=float, default=3.0)
    ap.add_argument("--switch-kills", type=int, default=10, help="kills of tuner rollback/promote (class 2)")
    ap.add_argument("--abandon-rounds", type=int, default=8, help="rounds of abandoned requests (class 4)")
    ap.add_argument("--unicode-requests", type=int, default=200, help="bodies with lone surrogates (class 5)")
    ap.add_argument("--endpoint-rounds", type=int, default=3, help="rounds of idle/slow sockets (class 13)")
    ap.add_argument("--inputs", type=int, default=50, help="generated hostile specs (classes 1, 3, 6, 7, 14)")
    ap.add_argument("--states", type=int, default=15, help="damaged state dirs (classes 8-12)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default="kills,daemon,outage,pg,specs,requests,switch,abandon,unicode,endpoint,"
                    "inputs,state")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("results.md"))
    a = ap.parse_args()
    load0 = " ".join(f"{x:.1f}" for x in os.getloadavg())
    rng = random.Random(a.seed)
    only = set(a.only.split(","))
    rows: list[tuple[str, str, Any, Any, Any, Any, Any, str]] = []
    Row = tuple[str, str, Any, Any, Any, Any, Any, str]

    def kills(work: Path) -> Row:
        t0 = time.monotonic()
        k = kill_runs(work, a.kills, rng, daemon=False)
        return ("SIGKILL of tuner run", f"{k['kills']}", k["kills"] - k["survived"], k["lost"], k["stranded"], "-",
                "-", f"{time.monotonic() - t0:.0f} s")

    def daemon(work: Path) -> Row:
        t0 = time.monotonic()
        k = kill_runs(work, a.daemon_kills, rng, daemon=True)
        return ("SIGKILL of the daemon", f"{k['kills']}", k["kills"] - k["survived"] + k["check_wrong"], k["lost"],
                k["stranded"], "-", "-", f"{time.monotonic() - t0:.0f} s; tuner check wrong {k['check_wrong']} times")

    def outage(work: Path) -> Row:
        o = mlflow_outage(work, a.outage_trials, a.outage_s)
        return ("MLflow server down mid-run", f"{o['trials']} trials",
                int(o["run_rc"] != 0) + int(o["restart_rc"] != 0), 0, o["stranded"], "-", "-",
                f"down {o['outage_s']} s; {o['missing_at_end']} missing or RUNNING when the run ended; "
                f"run {o['wall_s']} s; the next start (made once the server answered"
                f"{'' if o['answered'] else ': it did not within 180 s'}) took {o['restart_s']} s")

    def pg(work: Path) -> Row:
        g = pg_restart(work, a.pg_trials, a.pg_workers, a.pg_restarts, a.pg_down_s)
        if "skipped" in g:
            return ("PostgreSQL restart", "not run", "-", "-", "-", "-", "-", g["skipped"])
        return ("PostgreSQL restart under workers", f"{g['restarts']} restarts",
                g["failed_workers"] + int(g["restart_rc"] != 0), g["lost"], g["stranded"], "-", "-",
                f"{a.pg_workers} workers, {g['completed']}/{a.pg_trials} trials COMPLETE "
                f"({g['trials_failed']} FAIL, redone); down {a.pg_down_s:g} s each; "
                f"{g['missing_at_end']} missing or RUNNING in MLflow when the workers ended; "
                f"{g['duplicates']} trial(s) with two MLflow runs; {g['wall_s']} s")

    def specs(work: Path) -> Row:
        t0 = time.monotonic()
        s = fuzz_specs(work, a.specs, rng)
        return ("spec fuzzing (validate, then run)", f"{s['specs']} specs", "-", "-", "-",
                f"{s['crashed']}/{s['hung']}", "-",
                f"{s['accepted']} accepted, {s['run_failed']} of them failed to run; max validate "
                f"{s['max_s']} s CPU; {time.monotonic() - t0:.0f} s")

    def requests(work: Path) -> Row:
        r = fuzz_requests(work, a.requests, rng)
        return ("request fuzzing (reference engine)", f"{r['requests']} requests", "-", "-", "-", "-", r["hurt"],
                f"statuses {r['statuses']}; SIGTERM took {r['stop_s']} s")

    parts = {"kills": kills, "daemon": daemon, "outage": outage, "pg": pg, "specs": specs, "requests": requests,
             **server_parts(a, rng), **input_state_parts(a, rng)}
    with tempfile.TemporaryDirectory(prefix="fault-campaign-") as tmp:
        for name, part in parts.items():
            if name not in only:
                continue
            work = Path(tmp) / name
            work.mkdir()
            try:
                rows.append(part(work))
            except Exception as exc:  # noqa: BLE001 - one broken part is a row that says so, not a lost campaign
                import traceback

                traceback.print_exc()
                rows.append((name, "error", "?", "?", "?", "?", "?", f"{type(exc).__name__}: {exc}"[:300]))
            print(rows[-1], flush=True)
    head = ("| fault | done | kills not survived | trials lost | runs stranded | specs crashed/hung "
            "| requests that hurt a server | notes |\n|---|---|---|---|---|---|---|---|\n")
    table = head + "".join("| " + " | ".join(str(x) for x in row) + " |\n" for row in rows)
    print(table)
    new = (f"`{' '.join(['campaign.py', *sys.argv[1:]])}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
           f"load average before/after {load0} / {' '.join(f'{x:.1f}' for x in os.getloadavg())}\n\n{table}")
    old = a.out.read_text() if a.out.exists() else ""
    if old.startswith("# Fault campaign"):  # the tables already there stay, below, as history
        header = "## History (earlier runs, older code)\n\n"
        old = "\n" + header + old.split("\n", 1)[1].lstrip("\n").replace(header, "")
    a.out.write_text(f"# Fault campaign\n\n{new}{old}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
