"""Observation error: send known workloads with `tuner bench` to the reference engine and recover them with
`tuner.observe` from the server's /metrics, from a real Prometheus scraping it, and from a trace of the requests
the bench sent (Azure LLM trace columns). Prints (and writes) table.md.

    .venv/bin/python experiments/observation/run.py [--duration-s 20] [--out experiments/observation/table.md]

Each setting runs one `tuner bench` of --duration-s seconds against one `tuner serve-engine` (tiny preset, one
CPU thread). The window is the traffic's: from the bench's first finished request (seen on /metrics) to the
bench's exit. /metrics is scraped every 0.5 s over it; Prometheus (1 s scrapes) is asked for it after the
bench; and the bench's own per-request records (send time, prompt and output tokens) are written as an
Azure-format trace and fitted. Truth: what the bench sent (`--json`: per-request lengths, its request rate from
the first send to the last completion) and the arrival process it was told to use.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.prometheus import running_prometheus  # noqa: E402
from tests.support.thirdparty import free_port, running  # noqa: E402
from tuner.measure.scrape import fetch  # noqa: E402
from tuner.observe import ObservedWorkload, observe_metrics, observe_prometheus, observe_trace  # noqa: E402

# name, bench arguments, workload file (or None), what was sent (kind, rate or concurrency, burstiness)
SETTINGS: list[tuple[str, list[str], dict[str, Any] | None, dict[str, Any]]] = [
    ("closed c=2, 64/16", ["--concurrency", "2", "--prompt-tokens", "64", "--output-tokens", "16"], None,
     {"kind": "closed", "concurrency": 2}),
    ("closed c=6, 256/8", ["--concurrency", "6", "--prompt-tokens", "256", "--output-tokens", "8"], None,
     {"kind": "closed", "concurrency": 6}),
    ("poisson 2/s, 128/16", ["--rate", "2", "--prompt-tokens", "128", "--output-tokens", "16"], None,
     {"kind": "poisson", "rate": 2.0}),
    ("poisson 4/s, 64/32", ["--rate", "4", "--prompt-tokens", "64", "--output-tokens", "32"], None,
     {"kind": "poisson", "rate": 4.0}),
    ("gamma 3/s k=0.3, lognormal/uniform", [],
     {"arrival": {"kind": "gamma", "rate_per_s": 3.0, "burstiness": 0.3},
      "prompt_tokens": {"dist": "lognormal", "mean": 150, "sigma": 0.5, "max": 480},
      "output_tokens": {"dist": "uniform", "low": 8, "high": 40}},
     {"kind": "gamma", "rate": 3.0, "burstiness": 0.3}),
]


def engine_argv(port: int) -> list[str]:
    return [sys.executable, "-m", "tuner.cli", "serve-engine", "--port", str(port), "--cpu-threads", "1",
            "--max-batch-size", "8", "--max-model-len", "512", "--kv-pool-mb", "32"]


def write_azure(path: Path, res: dict[str, Any]) -> None:
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for t, p, o in zip(res["start_times"], res["input_lens"], res["output_lens"], strict=True):
        if o > 0:
            ts = datetime.fromtimestamp(1_700_000_000 + t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")
            rows.append(f"{ts},{p},{o}")
    path.write_text("\n".join(rows) + "\n")


def dist_text(d: Any) -> str:
    if d.dist == "fixed":
        return f"fixed {d.value}"
    if d.dist == "uniform":
        return f"uniform {d.low}..{d.high}"
    return f"{d.dist} {d.mean:g}/{d.std if d.dist == 'normal' else d.sigma:g}"


def arrival_text(a: Any) -> str:
    if a.kind == "closed":
        return f"closed c={a.concurrency}"
    return f"{a.kind} {a.rate_per_s:.2f}/s" + (f" k={a.burstiness:.2f}" if a.kind == "gamma" else "")


def pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def row(name: str, source: str, obs: ObservedWorkload, truth: dict[str, Any], served_rate: float) -> dict[str, Any]:
    s, e = obs.stats, obs.fit_error
    w = obs.workload
    kind_ok: Any = w.arrival.kind == truth["kind"]
    if source == "trace" and truth["kind"] == "closed":
        kind_ok = "n/a (a trace has no latencies)"
    out = {"setting": name, "source": source, "fitted arrival": arrival_text(w.arrival), "kind ok": kind_ok,
           "rate err": pct(s["rate_per_s"] / served_rate - 1) if "rate_per_s" in s else "n/a"}
    if truth["kind"] == "closed" and "concurrency_mean" in s:
        fitted = f"c={w.arrival.concurrency}" if w.arrival.kind == "closed" else "open"
        out["concurrency"] = f"{fitted} (server mean {s['concurrency_mean']:.2f})"
    else:
        out["concurrency"] = "-" if truth["kind"] != "closed" else "n/a"
    out["burstiness"] = f"{s['burstiness']:.2f}" if "burstiness" in s else "n/a"
    for key, short in (("prompt_tokens", "prompt"), ("output_tokens", "output")):
        true_mean = truth[f"{key}_mean"]
        out[f"{short} mean err"] = pct(s[f"{key}_mean"] / true_mean - 1)
        out[f"{short} fit"] = dist_text(getattr(w, key))
        out[f"{short} KS"] = f"{e.get(f'{key}_bucket_ks', float('nan')):.3f}"
    return out


def run_setting(name: str, args: list[str], wl: dict[str, Any] | None, truth: dict[str, Any], *, url: str,
                prom_url: str, duration_s: float, tmp: Path) -> list[dict[str, Any]]:
    res_path = tmp / "bench.json"
    argv = [sys.executable, "-m", "tuner.cli", "bench", "--url", url, "--tokenizer", "byte", "--json",
            str(res_path), "--duration-s", str(duration_s), "--seed", "1", *args]
    if wl is not None:
        wl_path = tmp / "workload.yaml"
        wl_path.write_text(yaml.safe_dump({**wl, "duration_s": duration_s}))
        argv += ["--workload", str(wl_path)]
    live: dict[str, Any] = {}
    stop = threading.Event()

    def watch() -> None:
        before = fetch(url + "/metrics").counters.get("request_success", 0.0)
        while fetch(url + "/metrics").counters.get("request_success", 0.0) == before and not stop.is_set():
            time.sleep(0.1)  # until the bench's first request has finished: the window is the traffic's
        live["t_first"] = time.time()
        try:
            live["obs"] = observe_metrics(url + "/metrics", 3600, interval_s=0.5, stop=stop)
        except Exception as exc:  # noqa: BLE001 - recorded in the table
            live["error"] = exc

    th = threading.Thread(target=watch)
    th.start()
    bench = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    rc = bench.wait(600)
    t_exit = time.time()
    stop.set()
    th.join()
    if rc != 0:
        raise RuntimeError(f"bench failed for {name}")
    time.sleep(2.0)  # Prometheus scrapes the last counts
    res = json.loads(res_path.read_text())
    ok = [i for i, o in enumerate(res["output_lens"]) if o > 0]
    truth = {**truth, "prompt_tokens_mean": float(np.mean([res["input_lens"][i] for i in ok])),
             "output_tokens_mean": float(np.mean([res["output_lens"][i] for i in ok]))}
    rows = []
    if "obs" in live:
        rows.append(row(name, "/metrics", live["obs"], truth, res["request_throughput"]))
    else:
        rows.append({"setting": name, "source": "/metrics", "fitted arrival": f"error: {live.get('error')}"})
    end = t_exit
    p = observe_prometheus(prom_url, end - live["t_first"], end_s=end, selector='job="engine"')
    rows.append(row(name, "Prometheus", p, truth, res["request_throughput"]))
    trace = tmp / "trace.csv"
    write_azure(trace, res)
    tr = observe_trace(trace)
    rows.append(row(name, "trace", tr, truth, res["request_throughput"]))
    for r in rows:
        r["served"] = f"{res['completed']} req, {res['request_throughput']:.2f}/s"
    return rows


COLUMNS = ["setting", "source", "served", "fitted arrival", "kind ok", "rate err", "concurrency", "burstiness",
           "prompt mean err", "prompt fit", "prompt KS", "output mean err", "output fit", "output KS"]


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(c, "")) for c in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration-s", type=float, default=30.0)
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("table.md"))
    ap.add_argument("--only", type=int, nargs="*", help="setting indices to run (default all)")
    a = ap.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="observation-") as d:
        tmp = Path(d)
        port = free_port()
        with running(engine_argv(port), port=port, model="torch-engine-tiny", log=tmp / "engine.log") as srv, \
                running_prometheus(tmp / "prom", [f"127.0.0.1:{port}"]) as prom:
            prom.wait_scraped()
            for i, (name, args, wl, truth) in enumerate(SETTINGS):
                if a.only and i not in a.only:
                    continue
                print(f"setting {name} ...", file=sys.stderr, flush=True)
                rows += run_setting(name, args, wl, truth, url=srv.url, prom_url=prom.url,
                                    duration_s=a.duration_s, tmp=tmp)
    text = (f"Observation error, {a.duration_s:g} s per setting (`python experiments/observation/run.py "
            f"--duration-s {a.duration_s:g}`), {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC\n\n" + table(rows))
    print(text)
    a.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
