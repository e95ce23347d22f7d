"""The agent's apply command: put the configuration of the champion file (TUNER_CHAMPION_FILE) in service without
downtime, as an operator's deploy hook would: start a server with it beside the one serving, and move the
production backend of the load balancer to it (tuner.rollout.lb.replace_server: the new server passes its
health check, the old one gets no new request, finishes those it holds, leaves, and is stopped).

    python apply.py --state prod.json --lb-socket hx/haproxy.sock --backend llm --log prod.log --events ev.jsonl
    python apply.py --state prod.json --log prod.log --config-json '{...}'     (the first server, no balancer yet)

`--state` holds the serving server's name, port, pid and configuration, and the warm standbys; `--events` gets
one line per move (when the traffic moved, how long the new server took to start, or none when a warm standby
took the traffic, and the old one to drain).

`--queue-in-balancer` gives each server it puts in the backend a limit (HAProxy's maxconn) of twice the requests it
runs at once (request_limit): the requests beyond it wait in the balancer's queue instead of the engine's, so at a
move the waiting requests go to the new server at once and the old one finishes only the two batches it holds.

`--keep-warm N` keeps the last N servers the traffic left running, idle and out of the balancer (a blue-green
pool, as an operator keeps the other scenario's deployment warm): a later move to a configuration one of them
serves puts it back in the backend at once instead of starting a server. An idle engine blocks on its queue
(no CPU). 0 (the default) stops the old server once it has drained.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DEFAULTS, MAX_MODEL_LEN, PRESET, free_port, server_argv, wait_ready  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from tuner.engine.config import PRESETS, check_pool  # noqa: E402

KNOBS = set(DEFAULTS)


def request_limit(config: dict[str, Any]) -> int:
    """The balancer's maxconn for a server with `config`: twice the most requests it runs at once (its batch
    size, or the sequences its KV pool holds if fewer): a batch running and the next one waiting in the engine,
    so that static batching finds a whole batch when the running one ends, as with no limit."""
    full = {**DEFAULTS, **config}
    model = dataclasses.replace(PRESETS[PRESET], max_model_len=MAX_MODEL_LEN)
    slots = check_pool(model, str(full.get("dtype", "float32")), int(full["kv_pool_mb"]))
    return 2 * min(int(full["max_batch_size"]), slots)


def start_server(config: dict[str, Any], name: str, log: Path, tries: int = 3) -> dict[str, Any]:
    """A reference-engine server with `config` on a free port, ready; returns its state record. A start that
    fails (another process took the port between its choice and the bind, on this shared machine) is tried
    again on another port; the server's output goes to `log`."""
    for attempt in range(1, tries + 1):
        port = free_port()
        with open(log, "ab") as out:
            out.write(f"--- {name} on :{port} (attempt {attempt}) {config}\n".encode())
            out.flush()
            proc = subprocess.Popen(server_argv(config, port), stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                    start_new_session=True)  # outlives this hook
        try:
            wait_ready(f"http://127.0.0.1:{port}", proc)
            return {"name": name, "port": port, "pid": proc.pid, "config": config}
        except RuntimeError as exc:
            proc.kill()
            print(f"{name} on :{port} did not start ({exc}): {log.read_text(errors='replace')[-1500:]}",
                  file=sys.stderr)
            if attempt == tries:
                raise
    raise AssertionError("unreachable")


def stop_server(pid: int, timeout_s: float = 30.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            os.kill(pid, 0)
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--state", type=Path, required=True)
    ap.add_argument("--log", type=Path, required=True)
    ap.add_argument("--lb-socket")
    ap.add_argument("--backend", default="llm")
    ap.add_argument("--events", type=Path)
    ap.add_argument("--config-json")
    ap.add_argument("--keep-warm", type=int, default=0, help="servers the traffic left kept running for a move back")
    ap.add_argument("--metrics-backend", help="a second backend of the same server for /metrics (moved too)")
    ap.add_argument("--queue-in-balancer", action="store_true",
                    help="the new server holds at most twice the requests it runs (HAProxy maxconn); the others wait "
                         "in the balancer, which hands them to the next server at a move")
    args = ap.parse_args()
    if args.config_json:
        config = json.loads(args.config_json)
    else:
        config = yaml.safe_load(Path(os.environ["TUNER_CHAMPION_FILE"]).read_text())["config"]
    config = {k: v for k, v in {**DEFAULTS, **config}.items() if k in KNOBS}
    old = json.loads(args.state.read_text()) if args.state.is_file() else None
    if old is not None and old["config"] == config and alive(int(old["pid"])):
        print(f"production backend already on {old['name']} (:{old['port']}) with {config}")
        return
    standby = [s for s in (old or {}).get("standby", []) if alive(int(s["pid"]))]
    n = int((old or {}).get("next", int(old["name"][1:]) + 1 if old else 0))
    name = f"s{n}"  # a fresh balancer name at every join, also for a standby's process
    t0 = time.time()
    warm = next((s for s in standby if s["config"] == config), None)
    if warm is not None:
        standby.remove(warm)
        new = {**warm, "name": name}
    else:
        new = start_server(config, name, args.log)
    started = time.time()
    if old is not None and args.lb_socket:
        from tuner.rollout.lb import HAProxy, replace_server

        steps = replace_server(HAProxy(args.lb_socket, args.backend), old["name"], name,
                               f"127.0.0.1:{new['port']}", drain_s=600,
                               maxconn=request_limit(config) if args.queue_in_balancer else None)
        if args.metrics_backend:
            replace_server(HAProxy(args.lb_socket, args.metrics_backend), old["name"], name,
                           f"127.0.0.1:{new['port']}", drain_s=30)
        standby.append({k: old[k] for k in ("name", "port", "pid", "config")})
        while len(standby) > args.keep_warm:
            stop_server(int(standby.pop(0)["pid"]))
        if args.events is not None:
            with open(args.events, "a") as f:
                f.write(json.dumps({"time": started + steps["up_s"], "kind": "traffic_moved", "from": old["name"],
                                    "to": name, "config": config, "start_s": started - t0,
                                    "warm_standby": warm is not None, **steps}) + "\n")
    args.state.write_text(json.dumps({**new, "standby": standby, "next": n + 1}))
    print(f"production backend on {name} (:{new['port']}{', a warm standby' if warm else ''}) with {config}")


if __name__ == "__main__":
    main()
