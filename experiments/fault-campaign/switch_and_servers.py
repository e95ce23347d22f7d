"""The fault campaign's parts for issue 30's classes 2, 4, 5 and 13 (run by campaign.py: `--only switch,abandon,
unicode,endpoint`), each on generated variants:

- switch: `tuner rollback` or `tuner promote` SIGKILLed at a random step boundary (tuner.base.proc.kill_point) or
  at a random moment of a slow apply command; then a random read-only command and a `tuner run --trials 1`;
  counted: kills after which champion.yaml, the audit log, `tuner history` and MLflow's aliases disagree.
- abandon: requests of random kinds (completions or chat, streamed or not, 1-6 prompts, 1-6 clients, random
  lengths) to the reference engine whose clients close their sockets at a random moment; counted: rounds after
  which a sequence ran on (the engine not idle within 60 s, or one finished for nobody) or the next request
  did not run alone.
- unicode: bodies with lone surrogates (JSON escapes, or their raw bytes) at random places (values, keys,
  nested fields, extra fields); counted: answers other than a JSON 400, and a traceback in the engine's log.
- endpoint: a real `tuner daemon` whose /health and /metrics get random numbers of idle sockets, slow header
  writers and half-sent requests; counted: /health not answering, the daemon's threads growing with the
  connections, an idle socket not closed after the endpoint's timeout.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

PY = sys.executable
REPO = Path(__file__).resolve().parents[2]
WAIT_S = 60.0


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "tuner.cli", *args], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


def _wait(cond: Any, timeout_s: float = WAIT_S) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            if cond():
                return True
        except OSError:
            pass
        time.sleep(0.02)
    return False


# ---------------------------------------------------------------------------- class 2: switch kills
def _prepared(work: Path) -> tuple[Path, Path, list[int]]:
    """A sim agent with an apply command (sleeps $CAMPAIGN_APPLY_S), 5 trials, 2 champions promoted."""
    from tests.support.agents import write_agent
    from tuner.agent import load_agent
    from tuner.loop import open_session, run_cycle

    apply = [PY, "-c", "import os,time; time.sleep(float(os.environ.get('CAMPAIGN_APPLY_S', '0')))"]
    agent = write_agent(work / "promo.yaml", name="promo", promotion={"apply_command": apply},
                        search_space={"params": {"max_num_seqs": {"type": "int", "low": 8, "high": 1024,
                                                                  "log": True, "default": 12}}},
                        at={"workload.num_requests": 60})
    sd = work / "template"
    sd.mkdir()
    session = open_session(load_agent(agent), sd)
    for size in (16, 32, 64, 128):
        session.study.study.enqueue_trial({"max_num_seqs": size})
    run_cycle(session, trials=5)
    trials = [t.number for t in session.study.trials()]
    for n in trials[1:3]:
        r = _cli("promote", str(agent), "--trial", str(n), "--yes", "--skip-verify", "--state-dir", str(sd))
        if r.returncode != 0:
            raise RuntimeError(f"promote failed: {r.stderr[-2000:]}")
    return agent, sd, trials


def switch_kills(work: Path, n: int, rng: random.Random) -> dict[str, Any]:
    from tests.support.champion_check import disagreements
    from tuner.base.proc import KILL_AT_ENV
    from tuner.promotion.act import SWITCH_POINTS

    agent, template, trials = _prepared(work)
    out: dict[str, Any] = {"kills": 0, "disagreed": 0, "points": {}, "starts": {}}
    for i in range(n):
        sd = work / f"state-{i}"
        shutil.copytree(template, sd)
        if rng.random() < 0.5:
            argv = ["rollback", str(agent), "--yes", "--state-dir", str(sd)]
        else:
            argv = ["promote", str(agent), "--trial", str(rng.choice(trials[3:] + trials[:1])), "--yes",
                    "--skip-verify", "--state-dir", str(sd)]
        env = {"CAMPAIGN_APPLY_S": "0"}
        if rng.random() < 0.75:
            point = rng.choice(SWITCH_POINTS)
            env[KILL_AT_ENV] = point
            r = subprocess.run([PY, "-m", "tuner.cli", *argv], cwd=REPO, capture_output=True, text=True,
                               timeout=600, env={**os.environ, **env})
            killed = r.returncode == -9
        else:  # a random moment while the apply command runs (it and its group die with the CLI)
            apply_s = rng.uniform(0.5, 2.0)
            point = f"apply+{apply_s:.1f}s"
            env["CAMPAIGN_APPLY_S"] = str(apply_s)
            proc = subprocess.Popen([PY, "-m", "tuner.cli", *argv], cwd=REPO, env={**os.environ, **env},
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            _wait(lambda s=sd: (s / "promo" / "promote.journal").exists(), 120)
            time.sleep(rng.uniform(0, apply_s + 0.3))
            os.killpg(proc.pid, 9)
            killed = proc.wait(30) == -9
        name = point if KILL_AT_ENV in env else "during apply"
        out["points"][name] = out["points"].get(name, 0) + 1
        out["kills"] += int(killed)
        start = rng.choice(["status", "history"])  # a read-only command first: it must repair the files
        _cli(start, str(agent), "--state-dir", str(sd))
        out["starts"][start] = out["starts"].get(start, 0) + 1
        problems = disagreements(sd, "promo", check_aliases=False)
        r = _cli("run", str(agent), "--trials", "1", "--state-dir", str(sd))
        h = _cli("history", str(agent), "--json", "--state-dir", str(sd))
        history = json.loads(h.stdout)["promotions"] if h.returncode == 0 else None
        problems += disagreements(sd, "promo", history=history) if r.returncode == 0 else [f"run: {r.stderr[-300:]}"]
        if not killed:
            problems.append(f"not killed at {point}")
        if problems:
            out["disagreed"] += 1
            print(f"  switch kill {i} ({' '.join(argv[:1])} at {point}): {problems}", flush=True)
    return out


# ---------------------------------------------------------------------------- the engine (classes 4, 5)
def abandoned_requests(work: Path, n: int, rng: random.Random) -> dict[str, Any]:
    from tests.support.engine_proc import EngineProcess

    eng = EngineProcess(work, cwd=REPO)
    out: dict[str, Any] = {"rounds": n, "sequences": 0, "hurt": 0, "kinds": {}}
    try:
        for i in range(n):
            chat = rng.random() < 0.4
            stream = rng.random() < 0.5
            prompts = 1 if chat else rng.randint(1, 6)
            clients = rng.randint(1, 6)
            max_tokens = rng.randint(250, 450)
            kind = f"{'chat' if chat else 'completions'}{' stream' if stream else ''}"
            out["kinds"][kind] = out["kinds"].get(kind, 0) + 1
            body: dict[str, Any] = {"max_tokens": max_tokens, "ignore_eos": True, "stream": stream}
            if chat:
                body["messages"] = [{"role": "user", "content": "x" * rng.randint(1, 40)}]
            else:
                body["prompt"] = ["y" * rng.randint(1, 40) for _ in range(prompts)]
            done0 = eng.metric("vllm:request_success_total")
            path = "/v1/chat/completions" if chat else "/v1/completions"
            socks = [eng.post(path, body) for _ in range(clients)]
            # closed once the engine holds every sequence (a socket closed earlier may have its request submitted
            # after the check below), a random moment later
            _wait(lambda c=clients * prompts: eng.busy() >= c)
            time.sleep(rng.uniform(0, 0.3))
            for s in socks:
                s.close()
            out["sequences"] += clients * prompts
            problems = []
            if not _wait(lambda: eng.busy() == 0):
                problems.append("sequences kept running")
            if eng.metric("vllm:request_success_total") != done0:
                problems.append("a sequence ran to its end for nobody")
            alone = eng.served_alone()
            if alone is not None:
                problems.append(f"the next request did not run alone: {alone}")
            if problems:
                out["hurt"] += 1
                print(f"  abandon round {i} ({kind}, {clients}x{prompts}): {problems}", flush=True)
    finally:
        out["hurt"] += int(not eng.stop())
    return out


def _surrogate(ch: str) -> bool:
    return 0xD800 <= ord(ch) <= 0xDFFF


def _with_surrogate(text: str, rng: random.Random) -> str:
    """`text` with a lone surrogate put in at a random place, never next to another one (a high and a low one
    side by side are a valid pair: JSON's "\\ud83d\\ude00" is one emoji)."""
    free = [i for i in range(len(text) + 1)
            if not (i > 0 and _surrogate(text[i - 1])) and not (i < len(text) and _surrogate(text[i]))]
    if not free:
        text, free = text + "x", [len(text) + 1]
    at = rng.choice(free)
    return text[:at] + chr(rng.randint(0xD800, 0xDFFF)) + text[at:]


def _strings(obj: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], str]]:
    """Every string place of a JSON value: ("v", path) for a value, ("k", path) for a key."""
    out: list[tuple[tuple[Any, ...], str]] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.append(((*path, k), "k"))
            out += _strings(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _strings(v, (*path, i))
    elif isinstance(obj, str):
        out.append((path, "v"))
    return out


def _poison(body: dict[str, Any], rng: random.Random, places: int) -> dict[str, Any]:
    body = json.loads(json.dumps(body))
    for _ in range(places):
        spots = _strings(body)
        path, what = rng.choice(spots)
        parent: Any = body
        for p in path[:-1]:
            parent = parent[p]
        key = path[-1]
        if what == "k":
            parent[_with_surrogate(key, rng)] = parent.pop(key)
        else:
            parent[key] = _with_surrogate(parent[key], rng)
    return body


def invalid_unicode(work: Path, n: int, rng: random.Random) -> dict[str, Any]:
    from tests.support.engine_proc import EngineProcess

    eng = EngineProcess(work, cwd=REPO)
    out: dict[str, Any] = {"requests": n, "hurt": 0, "statuses": {}}
    words = ["hello", "stop", "user", "weiß", "日本", "x" * 30, "a b c"]
    try:
        for i in range(n):
            chat = rng.random() < 0.5
            body: dict[str, Any] = {"max_tokens": rng.randint(1, 4), "model": "torch-engine-tiny"}
            if chat:
                body["messages"] = [{"role": rng.choice(["user", "system"]), "content": rng.choice(words)}
                                    for _ in range(rng.randint(1, 3))]
            else:
                body["prompt"] = rng.choice([rng.choice(words), [rng.choice(words) for _ in range(2)]])
            if rng.random() < 0.5:
                body["user"] = {"name": rng.choice(words), "tags": [rng.choice(words)]}
            if rng.random() < 0.3:
                body["stop"] = rng.choice(words)
            if rng.random() < 0.3:
                body[rng.choice(words)] = rng.choice(words)
            poisoned = _poison(body, rng, rng.randint(1, 3))
            raw = json.dumps(poisoned).encode()  # \\udXXX escapes
            if rng.random() < 0.2:  # or the surrogates' own bytes (invalid UTF-8)
                raw = json.dumps(poisoned, ensure_ascii=False).encode("utf-8", "surrogatepass")
            s = eng.post("/v1/chat/completions" if chat else "/v1/completions", raw)
            resp = b""
            while b"\r\n\r\n" not in resp or len(resp) < resp.find(b"\r\n\r\n") + 4 + _length(resp):
                chunk = s.recv(65536)
                if not chunk:
                    break
                resp += chunk
            s.close()
            status = int(resp.split(b" ", 2)[1]) if resp.startswith(b"HTTP/") else 0
            out["statuses"][status] = out["statuses"].get(status, 0) + 1
            head, _, payload = resp.partition(b"\r\n\r\n")
            try:
                err = json.loads(payload)["error"]
                good = status == 400 and ("Unicode" in err["message"] or "UTF-8" in err["message"])
            except (ValueError, KeyError, TypeError):
                good = False
            if not good:
                out["hurt"] += 1
                print(f"  unicode request {i} answered {status}: {payload[:200]!r}", flush=True)
    finally:
        out["hurt"] += int(not eng.stop())
    return out


def _length(resp: bytes) -> int:
    for line in resp.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


# ---------------------------------------------------------------------------- class 13: the daemon's endpoint
def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def _health_ok(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
            return r.status in (200, 503)
    except urllib.error.HTTPError as exc:
        return exc.code == 503
    except OSError:
        return False


def daemon_endpoint(work: Path, rounds: int, rng: random.Random) -> dict[str, Any]:
    from tests.support.agents import write_agent
    from tuner.base.proc import free_port
    from tuner.daemon.health import ENDPOINT_TIMEOUT_S

    agent = write_agent(work / "d.yaml", name="d", schedule={"every": "1h", "trials_per_cycle": 1},
                        at={"workload.num_requests": 20})
    port = free_port()
    with (work / "daemon.log").open("wb") as f:
        proc = subprocess.Popen([PY, "-m", "tuner.cli", "daemon", str(agent), "--state-dir", str(work / "state"),
                                 "--port", str(port)], cwd=REPO, stdout=f, stderr=subprocess.STDOUT)
    out: dict[str, Any] = {"rounds": rounds, "sockets": 0, "hurt": 0, "max_thread_growth": 0, "health_checks": 0}
    try:
        if not _wait(lambda: _health_ok(port), 180):
            raise RuntimeError("daemon endpoint did not start: " + (work / "daemon.log").read_text()[-2000:])
        _wait(lambda: _threads(proc.pid) > 0)
        time.sleep(2.0)  # the first cycle's threads come and go
        base = _threads(proc.pid)
        for i in range(rounds):
            idle = [socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
                    for _ in range(rng.randint(100, 400))]
            slow = [socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) for _ in range(rng.randint(5, 40))]
            for s in slow:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            half = [socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) for _ in range(rng.randint(0, 20))]
            for s in half:
                s.sendall(b"GET /metr")
            out["sockets"] += len(idle) + len(slow) + len(half)
            problems = []
            for _ in range(rng.randint(3, 10)):
                out["health_checks"] += 1
                if not _health_ok(port):
                    problems.append("/health did not answer")
                for s in rng.sample(slow, min(5, len(slow))):
                    try:
                        s.sendall(b"X")
                    except OSError:
                        pass
            growth = _threads(proc.pid) - base
            out["max_thread_growth"] = max(out["max_thread_growth"], growth)
            if growth > 10:
                problems.append(f"{growth} more threads")
            probe = idle[rng.randrange(len(idle))]
            probe.settimeout(ENDPOINT_TIMEOUT_S + 30)
            try:
                closed = probe.recv(1) == b""
            except TimeoutError:
                closed = False
            except ConnectionResetError:
                closed = True
            if not closed:
                problems.append("an idle socket was kept past the timeout")
            for s in idle + slow + half:
                s.close()
            if problems:
                out["hurt"] += 1
                print(f"  endpoint round {i}: {problems}", flush=True)
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return out
