"""`tuner bench` and `vllm bench serve` (from .venv-vllm) on the same server and load, in interleaved rounds.

Each round runs both clients one after the other, the order alternating from round to round, so that both
see the same load on a busy machine; each tool's median per round is computed from its own per-request
records with one definition per metric (TTFT; TPOT = (latency - TTFT) / (output tokens - 1); ITL, every
gap between chunks; E2EL), and the two agree when the gap between their medians over the rounds is within
the round-to-round spread of either tool (the noise), or within `floor_frac` of the figure.
`simultaneous` runs both at once instead, so that they see the same load at the same moments. Two closed
loops run together lock into phase with the server's steps: one tool's requests then keep arriving at a
better moment than the other's, and its median TTFT read 40 % lower in one run and 2.5x higher in the next
(E2EL equal); with `Load.rate_per_s` both send Poisson arrivals instead (open loop: each arrival's moment
independent of the server's steps) and their TTFTs agreed within 10 %.
Used by the vLLM-tier test and experiments/interop/vs_vllm_bench.py.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tuner.measure.loadgen import ONE_BURST_S  # a stream whose tokens all came at once: the server held them

ROOT = Path(__file__).resolve().parents[2]
VLLM_BIN = ROOT / ".venv-vllm" / "bin" / "vllm"
METRICS = ("ttft", "tpot", "itl", "e2el")



@dataclass(frozen=True)
class Load:
    requests: int = 100
    concurrency: int = 4
    prompt_tokens: int = 128
    output_tokens: int = 32
    warmups: int = 4
    rate_per_s: float | None = None  # open loop: Poisson arrivals at this rate, no concurrency limit


def vllm_bench_argv(url: str, model: str, tokenizer: Path, out: Path, load: Load, *, seed: int) -> list[str]:
    return [str(VLLM_BIN), "bench", "serve", "--backend", "openai", "--base-url", url, "--model", model,
            "--tokenizer", str(tokenizer), "--dataset-name", "random", "--random-input-len",
            str(load.prompt_tokens), "--random-output-len", str(load.output_tokens), "--num-prompts",
            str(load.requests), *_vllm_arrivals(load), "--num-warmups", str(load.warmups),
            "--ignore-eos", "--seed", str(seed), "--save-result", "--save-detailed", "--disable-tqdm",
            "--result-dir", str(out.parent), "--result-filename", out.name,
            "--percentile-metrics", "ttft,tpot,itl,e2el"]


def _vllm_arrivals(load: Load) -> list[str]:
    if load.rate_per_s is None:
        return ["--max-concurrency", str(load.concurrency)]
    return ["--request-rate", str(load.rate_per_s), "--burstiness", "1.0"]


def _tuner_arrivals(load: Load) -> list[str]:
    if load.rate_per_s is None:
        return ["--concurrency", str(load.concurrency)]
    return ["--rate", str(load.rate_per_s), "--arrival", "poisson"]


def tuner_bench_argv(url: str, model: str, out: Path, load: Load, *, seed: int) -> list[str]:
    return [sys.executable, "-m", "tuner.cli", "bench", "--url", url, "--model", model, "--requests",
            str(load.requests), *_tuner_arrivals(load), "--prompt-tokens", str(load.prompt_tokens),
            "--output-tokens", str(load.output_tokens), "--warmup-requests", str(load.warmups), "--ignore-eos",
            "--seed", str(seed), "--json", str(out)]


def medians(res: dict[str, Any]) -> dict[str, float]:
    """Medians (ms) from a --save-detailed / --json result's per-request lists, one definition for both."""
    ok = [i for i, t in enumerate(res["ttfts"]) if t is not None and res["latencies"][i] is not None
          and not res["errors"][i]]
    ttft = [res["ttfts"][i] * 1000 for i in ok]
    e2el = [res["latencies"][i] * 1000 for i in ok]
    tpot = [(res["latencies"][i] - res["ttfts"][i]) * 1000 / (res["output_lens"][i] - 1)
            for i in ok if res["output_lens"][i] > 1]
    itl = [x * 1000 for i in ok for x in res["itls"][i]]
    multi = [i for i in ok if res["output_lens"][i] > 1]
    burst = [i for i in multi if res["latencies"][i] - res["ttfts"][i] <= ONE_BURST_S]
    return {"ttft": statistics.median(ttft), "tpot": statistics.median(tpot), "itl": statistics.median(itl),
            "e2el": statistics.median(e2el), "completed": float(len(ok)),
            "one_burst_frac": len(burst) / len(multi) if multi else 0.0,
            "request_throughput": float(res["request_throughput"]),
            "prompt_tokens": float(statistics.median(res["input_lens"][i] for i in ok))}


@dataclass
class Rounds:
    vllm: list[dict[str, float]] = field(default_factory=list)
    tuner: list[dict[str, float]] = field(default_factory=list)
    loads: list[str] = field(default_factory=list)  # the load average at each round's start
    tuner_raw: list[dict[str, Any]] = field(default_factory=list)


def _run(argv: list[str], log: Path, timeout_s: float) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with log.open("ab") as out:
        p = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s, env=env, cwd=ROOT)
    if p.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{argv[:4]} exited with {p.returncode}:\n{tail}")


def interleaved(url: str, model: str, tokenizer: Path, work: Path, load: Load, *, rounds: int = 3,
                timeout_s: float = 600.0) -> Rounds:
    """`rounds` rounds of both clients, vLLM's first in odd rounds, the tuner's first in even ones."""
    out = Rounds()
    work.mkdir(parents=True, exist_ok=True)
    for r in range(rounds):
        out.loads.append(" ".join(f"{x:.1f}" for x in os.getloadavg()))
        order = ("vllm", "tuner") if r % 2 == 0 else ("tuner", "vllm")
        for tool in order:
            res_path = work / f"{tool}-{r}.json"
            res_path.unlink(missing_ok=True)
            if tool == "vllm":
                _run(vllm_bench_argv(url, model, tokenizer, res_path, load, seed=r), work / "vllm.log", timeout_s)
            else:
                _run(tuner_bench_argv(url, model, res_path, load, seed=r), work / "tuner.log", timeout_s)
            res = json.loads(res_path.read_text())
            getattr(out, tool).append(medians(res))
            if tool == "tuner":
                out.tuner_raw.append(res)
    return out


def _slice(res: dict[str, Any], idx: list[int], span_s: float) -> dict[str, Any]:
    """The result's per-request lists cut to `idx`, its request rate over `span_s`."""
    keys = ("ttfts", "latencies", "itls", "output_lens", "input_lens", "errors")
    out: dict[str, Any] = {k: [res[k][i] for i in idx] for k in keys}
    out["request_throughput"] = len(idx) / span_s if span_s > 0 else 0.0
    return out


def simultaneous(url: str, model: str, tokenizer: Path, work: Path, load: Load, *, slices: int = 3,
                 timeout_s: float = 600.0, lead_s: float = 60.0) -> Rounds:
    """Both clients at once, each with `load` (the server sees twice its concurrency or rate): `vllm bench
    serve` runs longer (six times the requests; open loop: `lead_s` more of them at its rate, time for the
    tuner's start), `tuner bench` starts once vLLM's main run has started; the tuner's run is cut into `slices`
    consecutive time slices, and each tool's medians per slice come from its requests sent in that slice
    (both clocks are CLOCK_MONOTONIC: vLLM's start_times, the tuner's clock_origin_s + start_times). Both
    tools see the same load at the same moments, whatever the rest of the machine does."""
    import time

    work.mkdir(parents=True, exist_ok=True)
    v_path, t_path, v_log = work / "vllm-sim.json", work / "tuner-sim.json", work / "vllm-sim.log"
    for p in (v_path, t_path):
        p.unlink(missing_ok=True)
    longer = load.requests * 6 if load.rate_per_s is None else load.requests + round(load.rate_per_s * lead_s)
    long_load = replace(load, requests=longer)
    out = Rounds(loads=[" ".join(f"{x:.1f}" for x in os.getloadavg())])
    with v_log.open("wb") as log:
        proc = subprocess.Popen(vllm_bench_argv(url, model, tokenizer, v_path, long_load, seed=0), stdout=log,
                                stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline = time.monotonic() + timeout_s
        while b"Starting main benchmark run" not in v_log.read_bytes():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"vllm bench serve did not start its run:\n{v_log.read_text()[-3000:]}")
            time.sleep(0.2)
        _run(tuner_bench_argv(url, model, t_path, load, seed=1), work / "tuner-sim.log", timeout_s)
        proc.wait(timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    v, t = json.loads(v_path.read_text()), json.loads(t_path.read_text())
    origin = t["tuner"]["clock_origin_s"]
    t_start = [origin + x for x in t["start_times"]]
    lo, hi = min(t_start), max(t_start)
    if not (v["start_times"][0] <= lo and v["start_times"][-1] >= hi):
        raise RuntimeError("vllm bench serve did not run over the whole of tuner bench's run")
    edges = [lo + (hi - lo) * k / slices for k in range(slices + 1)]
    span = (hi - lo) / slices
    for k in range(slices):
        def within(ts: list[float], k: int = k) -> list[int]:
            return [i for i, x in enumerate(ts) if edges[k] <= x <= edges[k + 1]]
        out.vllm.append(medians(_slice(v, within(v["start_times"]), span)))
        out.tuner.append(medians(_slice(t, within(t_start), span)))
    out.tuner_raw.append(t)
    return out


def verdict(rounds: Rounds, metric: str, *, floor_frac: float = 0.05) -> dict[str, float | bool]:
    """The two tools' medians over the rounds, their gap, the noise (round-to-round spread), agreement."""
    v = [x[metric] for x in rounds.vllm]
    t = [x[metric] for x in rounds.tuner]
    mv, mt = statistics.median(v), statistics.median(t)
    noise = max(max(v) - min(v), max(t) - min(t))
    gap = mt - mv
    return {"vllm": mv, "tuner": mt, "gap_frac": gap / mv if mv else 0.0, "noise": noise,
            "agree": abs(gap) <= max(noise, floor_frac * abs(mv))}


# ---------------------------------------------------------------------------- the same streams, two rules
async def _record_one(session: Any, url: str, body: dict[str, Any]) -> tuple[float, list[tuple[float, bytes]]]:
    import time

    t0 = time.perf_counter()
    events: list[tuple[float, bytes]] = []
    buf = b""
    async with session.post(url, json=body) as resp:
        async for data in resp.content.iter_any():
            now = time.perf_counter() - t0
            buf += data
            *done, buf = buf.split(b"\n\n")
            events += [(now, e.strip()[5:].strip()) for e in done if e.strip().startswith(b"data:")]
    return t0, events


def record_streams(url: str, model: str, *, requests: int = 40, concurrency: int = 4, prompt_chars: int = 128,
                   output_tokens: int = 32) -> list[list[tuple[float, bytes]]]:
    """The SSE events (arrival s since the request was sent, payload) of streamed completions."""
    import asyncio

    import aiohttp

    async def main() -> list[list[tuple[float, bytes]]]:
        out: list[list[tuple[float, bytes]]] = []
        async with aiohttp.ClientSession() as s:
            for b in range(0, requests, concurrency):
                bodies = [{"model": model, "prompt": f"{i:06d} " + ("the cat sat on the mat " * 99)[:prompt_chars - 7],
                           "max_tokens": output_tokens, "stream": True, "ignore_eos": True,
                           "stream_options": {"include_usage": True}} for i in range(b, b + concurrency)]
                got = await asyncio.gather(*[_record_one(s, url.rstrip("/") + "/v1/completions", body)
                                             for body in bodies])
                out += [ev for _, ev in got]
        return out

    return asyncio.run(main())


def first_chunk_rules(streams: list[list[tuple[float, bytes]]]) -> dict[str, Any]:
    """TTFT of each recorded stream by vLLM's rule (the first event with a choice, its text empty or not),
    by the rule the tuner used before (the first non-empty text), and by tuner.measure.stream's reader."""
    from tuner.measure.stream import StreamReader

    vllm_rule, old_rule, reader_rule, empty_first = [], [], [], 0
    for events in streams:
        parsed = [(t, json.loads(p)) for t, p in events if p != b"[DONE]"]
        with_choice = [(t, d["choices"][0].get("text")) for t, d in parsed if d.get("choices")]
        vllm_rule.append(with_choice[0][0] * 1000)
        old_rule.append(next(t for t, text in with_choice if text) * 1000)
        empty_first += not with_choice[0][1]
        r = StreamReader(chat=False)
        for t, p in events:
            r.feed(p, t)
        r.end()
        reader_rule.append(r.chunk_times[0] * 1000)
    return {"requests": len(streams), "first_chunk_empty": empty_first,
            "median_ttft_vllm_rule_ms": statistics.median(vllm_rule),
            "median_ttft_old_rule_ms": statistics.median(old_rule),
            "reader_equals_vllm_rule": reader_rule == vllm_rule,
            "old_rule_later_frac": statistics.median(old_rule) / statistics.median(vllm_rule) - 1}
