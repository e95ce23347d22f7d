"""How fast is one load-generator process, and how much latency does it add? aiohttp vs httpx.

The fake OpenAI server (tests/support/fake_openai_server.py) runs in its own process pinned to one core and
answers instantly (TTFT 0, ITL 0: the whole 32-token SSE stream in one write); the client runs in this
process pinned to another core. For each client library:

1. closed loop, 64 and 256 in flight: completed streamed requests per second and the client's CPU seconds
   per request (process CPU time / requests),
2. open loop (constant rate) sweep: achieved rate, p99 lag between a request's scheduled and actual send,
   and whether the rate is sustained (achieved >= 97 % of offered, every request completed, p99 lag < 5 ms),
3. added latency at 100 req/s (Poisson): median TTFT minus the server's known delay, against the instant
   server and against a server with TTFT 20 ms; and, more exactly, mean TTFT minus the mean time the server
   itself measured from reading the request to writing the first token (its /metrics TTFT histogram sum/count),
   which removes the server's own timer overshoot.

Usage: .venv/bin/python experiments/loadgen-capacity/run.py [--quick] [--out results.md]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import numpy as np  # noqa: E402

from tests.support.fake_openai_server import spawn_fake_server  # noqa: E402
from tuner.measure.loadgen import RunConfig, RunResult, _body, _Run, run_async, run_fresh  # noqa: E402
from tuner.measure.metrics import summarise  # noqa: E402
from tuner.measure.records import RequestPlan, RequestRecord  # noqa: E402
from tuner.measure.scrape import scrape  # noqa: E402
from tuner.measure.tokenize import ByteTokenizer, Tokenizer  # noqa: E402
from tuner.measure.workload import arrival_times  # noqa: E402

N_OUT = 32
N_IN = 32


class HttpxClient:
    """The same request/record logic as tuner.measure.loadgen._Client, over httpx (kept here only)."""

    def __init__(self, cfg: RunConfig, client: httpx.AsyncClient, tok: Tokenizer, t0: float) -> None:
        self.cfg, self.client, self.tok, self.t0 = cfg, client, tok, t0
        self.url = cfg.url
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}

    async def send(self, plan: RequestPlan, scheduled_s: float, warmup: bool) -> RequestRecord:
        data = _body(self.cfg, plan, self.tok.synth(plan.prompt_tokens, plan.index))
        clock, t0 = time.perf_counter, self.t0
        sent = clock() - t0
        times: list[float] = []
        usage: dict[str, Any] | None = None
        status: int | None = None
        error: str | None = None
        try:
            async with self.client.stream("POST", self.url, content=data, headers=self.headers) as resp:
                status = resp.status_code
                if status != 200:
                    error = "http_5xx" if status >= 500 else "http_4xx"
                    await resp.aread()
                else:
                    buf, done = b"", False
                    async for chunk in resp.aiter_raw():
                        now = clock() - t0
                        buf += chunk
                        if b"\n\n" not in buf:
                            continue
                        events = buf.split(b"\n\n")
                        buf = events.pop()
                        for ev in events:
                            payload = ev.strip()[5:].strip()
                            if payload == b"[DONE]":
                                done = True
                                continue
                            d = json.loads(payload)
                            ch = d.get("choices")
                            if ch and ch[0].get("text"):
                                times.append(now)
                            if d.get("usage"):
                                usage = d["usage"]
                    if not done:
                        error = "stream_broken"
        except httpx.TimeoutException:
            error = "timeout"
        except httpx.HTTPError:
            error = "connect" if status is None else "stream_broken"
        n_out = int(usage["completion_tokens"]) if usage else len(times)
        return RequestRecord(index=plan.index, scheduled_s=scheduled_s, sent_s=sent,
                             first_token_s=times[0] if times else None, done_s=clock() - t0,
                             prompt_tokens=plan.prompt_tokens, output_tokens=n_out, token_times_s=tuple(times),
                             status=status, error=error, warmup=warmup)


async def run_httpx(cfg: RunConfig, plans: Sequence[RequestPlan], tok: Tokenizer) -> RunResult:
    n = cfg.concurrency if cfg.closed_loop and cfg.concurrency else 10_000
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(cfg.timeout_s)) as hc:
        t0 = time.perf_counter()
        run = _Run(cfg, HttpxClient(cfg, hc, tok, t0), plans, None)  # type: ignore[arg-type]
        await (run.closed() if cfg.closed_loop else run.open())
        return RunResult(records=run.records, wall_s=time.perf_counter() - t0, max_concurrent=run.max_concurrent)


def run(lib: str, cfg: RunConfig, plans: Sequence[RequestPlan]) -> tuple[RunResult, float]:
    tok = ByteTokenizer()
    cpu0 = time.process_time()
    if lib == "aiohttp":
        res = run_fresh(run_async(cfg, plans, tok=tok))  # uvloop when installed
    elif lib == "aiohttp-asyncio":
        res = asyncio.run(run_async(cfg, plans, tok=tok))  # the stock asyncio loop
    else:
        res = run_fresh(run_httpx(cfg, plans, tok))
    return res, time.process_time() - cpu0


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def closed(lib: str, url: str, conc: int, n: int, server_pid: int) -> dict[str, float]:
    plans = [RequestPlan(index=i, arrival_s=0.0, prompt_tokens=N_IN, output_tokens=N_OUT) for i in range(n)]
    cfg = RunConfig(base_url=url, model="fake", num_requests=n, concurrency=conc)
    srv0 = proc_cpu_s(server_pid)
    res, cpu = run(lib, cfg, plans)
    srv_cpu = proc_cpu_s(server_pid) - srv0
    s = summarise(res.records)
    return {"req_per_s": s["request_throughput"], "failed": s["failed"],
            "cpu_us_per_req": cpu / n * 1e6, "server_cpu_us_per_req": srv_cpu / n * 1e6,
            "wall_s": res.wall_s, "median_ttft_ms": s["median_ttft_ms"]}


def open_loop(lib: str, url: str, rate: float, seconds: float, kind: str = "constant",
              seed: int = 0) -> dict[str, float]:
    n = int(rate * seconds)
    t = arrival_times(kind, rate, n, np.random.default_rng(seed))
    plans = [RequestPlan(index=i, arrival_s=float(t[i]), prompt_tokens=N_IN, output_tokens=N_OUT)
             for i in range(n)]
    cfg = RunConfig(base_url=url, model="fake", num_requests=n, closed_loop=False)
    before = scrape(url + "/metrics")
    res, _ = run(lib, cfg, plans)
    after = scrape(url + "/metrics")
    s = summarise(res.records)
    server_ttft_ms = float("nan")
    if before and after:
        hb, ha = before.hists["ttft_ms"], after.hists["ttft_ms"]
        server_ttft_ms = (ha.sum - hb.sum) / max(ha.count - hb.count, 1) * 1000
    lag = np.array([(r.sent_s - r.scheduled_s) * 1000 for r in res.records])
    sched_span = float(t[-1] - t[0])
    achieved = s["completed"] / max(s["duration"], 1e-9)
    return {"offered": (n - 1) / sched_span, "achieved": achieved, "failed": s["failed"],
            "lag_p99_ms": float(np.percentile(lag, 99)), "median_ttft_ms": s["median_ttft_ms"],
            "p99_ttft_ms": s["p99_ttft_ms"], "median_itl_ms": s["median_itl_ms"],
            "mean_ttft_ms": s["mean_ttft_ms"], "server_ttft_ms": server_ttft_ms,
            "sustained": float(achieved >= 0.97 * (n - 1) / sched_span and s["failed"] == 0
                               and np.percentile(lag, 99) < 10.0)}


def renice(pid: int, prio: int = -10) -> bool:
    """Raise a process's CPU priority (needs root); the machine is shared with other jobs."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, prio)
        return True
    except OSError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(Path(__file__).with_name("results.md")))
    a = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    client_cpu, server_cpu = cpus[0], cpus[-1]
    os.sched_setaffinity(0, {client_cpu})
    reniced = renice(os.getpid())
    n_closed = 3000 if a.quick else 10_000
    secs = 2.0 if a.quick else 4.0
    rates = [500, 1000, 1500, 2000, 2500, 3000, 3500, 4000]
    lines = [f"client on CPU {client_cpu}, server on CPU {server_cpu}; {N_OUT} streamed tokens per request; "
             f"python {sys.version.split()[0]}", ""]
    out: dict[str, Any] = {}
    load0 = os.getloadavg()
    with spawn_fake_server(ttft_ms=0, itl_ms=0, cpu=server_cpu, uvloop=True) as fast, \
            spawn_fake_server(ttft_ms=20, itl_ms=1, cpu=server_cpu, uvloop=True) as slow:
        renice(fast.proc.pid)
        renice(slow.proc.pid)
        for lib in ("aiohttp", "aiohttp-asyncio", "httpx"):
            closed(lib, fast.url, 16, 500, fast.proc.pid)  # warm up
            out[lib] = {"closed": {c: closed(lib, fast.url, c, n_closed, fast.proc.pid) for c in (64, 256)}}
            sweep = {}
            for r in rates:
                sweep[r] = open_loop(lib, fast.url, r, secs)
                if not sweep[r]["sustained"]:
                    break
            out[lib]["open"] = sweep
            lat0 = open_loop(lib, fast.url, 100, 10.0 if not a.quick else 5.0, kind="poisson", seed=1)
            lat20 = open_loop(lib, slow.url, 100, 10.0 if not a.quick else 5.0, kind="poisson", seed=2)
            out[lib]["latency"] = {"instant": lat0, "ttft20": lat20}
    load1 = os.getloadavg()
    lines += [f"machine load average (1, 5, 15 min) at start {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, "
              f"at end {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} ({os.cpu_count()} cores, shared with other "
              f"jobs); client and server reniced to -10: {reniced}", ""]
    lines += ["## Closed loop (instant server)", "",
              "| client | in flight | streamed req/s | failed | client CPU us/req | client req/s per CPU-second "
              "| client CPU busy % | server CPU us/req | median TTFT ms |",
              "|---|---|---|---|---|---|---|---|---|"]
    for lib, d in out.items():
        for c, x in d["closed"].items():
            busy = 100 * x["cpu_us_per_req"] * x["req_per_s"] / 1e6
            lines.append(f"| {lib} | {c} | {x['req_per_s']:.0f} | {x['failed']:.0f} | {x['cpu_us_per_req']:.0f} "
                         f"| {1e6 / x['cpu_us_per_req']:.0f} | {busy:.0f} | {x['server_cpu_us_per_req']:.0f} "
                         f"| {x['median_ttft_ms']:.2f} |")
    lines += ["", "## Open loop, constant rate (instant server)", "",
              "| client | offered req/s | achieved req/s | failed | p99 send lag ms | median TTFT ms "
              "| p99 TTFT ms | sustained |", "|---|---|---|---|---|---|---|---|"]
    for lib, d in out.items():
        for x in d["open"].values():
            lines.append(f"| {lib} | {x['offered']:.0f} | {x['achieved']:.0f} | {x['failed']:.0f} "
                         f"| {x['lag_p99_ms']:.2f} | {x['median_ttft_ms']:.3f} | {x['p99_ttft_ms']:.3f} "
                         f"| {'yes' if x['sustained'] else 'no'} |")
    lines += ["", "## Added latency at 100 req/s (Poisson)", "",
              "| client | server TTFT ms (nominal) | median TTFT ms | median - nominal ms "
              "| mean TTFT - server's own mean TTFT ms | p99 TTFT ms | median ITL ms (server 1 ms) |",
              "|---|---|---|---|---|---|---|"]
    for lib, d in out.items():
        for name, known in (("instant", 0.0), ("ttft20", 20.0)):
            x = d["latency"][name]
            itl = f"{x['median_itl_ms']:.3f}" if name == "ttft20" else "-"
            lines.append(f"| {lib} | {known:.0f} | {x['median_ttft_ms']:.3f} | {x['median_ttft_ms'] - known:.3f} "
                         f"| {x['mean_ttft_ms'] - x['server_ttft_ms']:.3f} | {x['p99_ttft_ms']:.3f} | {itl} |")
    text = "\n".join(lines) + "\n"
    print(text)
    Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
