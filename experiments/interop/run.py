"""Interop: what third-party OpenAI-compatible servers accept from `tuner bench`, and whether `tuner bench` and
guidellm agree when they measure the same server under the same load.

    .venv/bin/python experiments/interop/run.py [--quick]      # after `make interop-venvs`; writes results.md

Part 1 runs each request variant against each server (guidellm's mock server, `transformers serve` with a
tiny local model on the CPU, the tuner's own reference engine) and tabulates what each accepts and what was
measured. Part 2 runs `guidellm run` and `tuner bench` in turns against guidellm's mock server (the same
prompt length under the same tokenizer, the same output length, the same closed-loop concurrency) and
compares median TTFT and median per-request TPOT, both computed from each tool's per-request records with
one definition: TPOT = (latency - TTFT) / (output tokens - 1) (vLLM's TPOT; guidellm calls it ITL).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.thirdparty import (  # noqa: E402
    GUIDELLM_VENV,
    free_port,
    guidellm_mock_argv,
    hfserve_argv,
    hfserve_env,
    running,
)
from tests.support.tiny_model import make_tiny_model  # noqa: E402

TUNER = [str(ROOT / ".venv" / "bin" / "tuner")]

VARIANTS: list[tuple[str, list[str]]] = [
    ("defaults (completions, stream, ignore_eos)", []),
    ("chat", ["--endpoint", "chat"]),
    ("no stream", ["--no-stream"]),
    ("chat, no stream", ["--endpoint", "chat", "--no-stream"]),
    ("no ignore_eos", ["--no-ignore-eos"]),
    ("token-id prompts", ["--prompt-format", "token_ids"]),
    ("extra body {temperature: 0}", ["--extra-body", '{"temperature": 0}']),
]


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def bench(url: str, model: str, out: Path, args: list[str], *, requests: int, prompt: int, output: int,
          concurrency: int, tokenizer: str | None, warmup: int = 0) -> dict[str, Any]:
    argv = [*TUNER, "bench", "--url", url, "--model", model, "--requests", str(requests), "--concurrency",
            str(concurrency), "--prompt-tokens", str(prompt), "--output-tokens", str(output),
            "--warmup-requests", str(warmup), "--json", str(out), *args]
    if tokenizer and "--tokenizer" not in args:
        argv += ["--tokenizer", tokenizer]
    out.unlink(missing_ok=True)
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    res: dict[str, Any] = json.loads(out.read_text()) if out.is_file() else {}
    res["_stdout"] = p.stdout
    return res


def fmt(v: Any, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def accept_row(server: str, variant: str, res: dict[str, Any], extra_ok: list[str]) -> str:
    t = res.get("tuner", {})
    errs = t.get("error_details", {})
    if res.get("completed", 0) == 0:
        first = next(iter(errs.items()), ("?", {"first_detail": res.get("_stdout", "")[-200:]}))
        detail = str(first[1]["first_detail"]).replace("|", "/").replace("\n", " ")[:90]
        return f"| {server} | {variant} | refused: {first[0]} `{detail}` | | | | | |"
    ends = sorted(set(t.get("stream_ends", [])) - {""})
    multi = sum(t.get("multi_token_chunks", []))
    outs = res.get("output_lens", [])
    return (f"| {server} | {variant} | ok {res['completed']}/{res['num_prompts']} "
            f"| {fmt(res.get('median_ttft_ms'))} | {fmt(res.get('median_tpot_ms'))} | {fmt(res.get('median_e2el_ms'))} "
            f"| {min(outs)}-{max(outs)} / {statistics.median(res['input_lens']):.0f} "
            f"| {', '.join(ends) or 'not streamed'}{f'; {multi} multi-token chunks' if multi else ''}"
            f"{'; ' + '; '.join(extra_ok) if extra_ok else ''} |")


def part1(work: Path, tiny: Path, quick: bool) -> list[str]:
    n = 4 if quick else 8
    rows = ["| server | variant | result | median TTFT ms | median TPOT ms | median E2EL ms "
            "| output tokens (min-max) / server prompt tokens (median) | how streams ended |",
            "|---|---|---|---|---|---|---|---|"]
    servers = []
    port = free_port()
    servers.append(("guidellm mock-server 0.8.1", guidellm_mock_argv(port, model="mock", ttft_ms=20, itl_ms=5),
                    port, "mock", {}, None))
    port = free_port()
    servers.append(("transformers serve 5.23.0 (tiny model, CPU)", hfserve_argv(port, tiny), port, str(tiny),
                    hfserve_env(work / "hub"), str(tiny)))
    port = free_port()
    servers.append(("tuner serve-engine (tiny preset, CPU)",
                    [str(ROOT / ".venv" / "bin" / "python"), "-m", "tuner.engine.server", "--port", str(port),
                     "--preset", "tiny", "--device", "cpu"], port, "torch-engine-tiny", {}, "byte"))
    for name, argv, port, model, env, tok in servers:
        print(f"[{time.strftime('%H:%M:%S')}] part 1: {name} (load {load()})", flush=True)
        with running(argv, port=port, model=model, log=work / f"{port}.log", env=env) as srv:
            for variant, args in VARIANTS:
                vargs = list(args)
                if variant == "token-id prompts" and tok is None:
                    vargs += ["--tokenizer", str(tiny)]
                res = bench(srv.url, model, work / "p1.json", vargs, requests=n, prompt=32, output=8,
                            concurrency=2, tokenizer=tok)
                notes = res.get("tuner", {}).get("notes", [])
                extra = ["refused ignore_eos: sent without it"] if any("refused ignore_eos" in x for x in notes) else []
                if any("prompt length mismatch" in x for x in notes):
                    extra.append("prompt length mismatch warned")
                rows.append(accept_row(name, variant, res, extra))
                print("  ", rows[-1], flush=True)
    return rows


# ------------------------------------------------------------------ part 2: guidellm vs tuner bench
def guidellm_run(url: str, model: str, out: Path, *, requests: int, prompt: int, output: int,
                 concurrency: int) -> list[dict[str, Any]]:
    scenario = {"spec": {
        "backend": {"kind": "openai_http", "target": url, "model": model, "request_format": "/v1/completions"},
        "profile": {"kind": "concurrent", "streams": concurrency},
        "data": [{"kind": "synthetic_text", "prompt_tokens": prompt, "output_tokens": output}],
        "tokenizer": {"kind": "hf_auto"},
        "constraints": [{"kind": "max_requests", "count": requests}],
        "outputs": [{"kind": "json", "path": str(out)}]}}
    sc = out.with_suffix(".scenario.json")
    sc.write_text(json.dumps(scenario))
    out.unlink(missing_ok=True)
    # its own process group: guidellm's worker processes go down with it if this script is stopped
    p = subprocess.Popen([str(GUIDELLM_VENV / "bin" / "guidellm"), "run", "-c", str(sc),
                          "--disable-console-interactive"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, start_new_session=True)
    try:
        text, _ = p.communicate(timeout=900)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    if not out.is_file():
        raise RuntimeError(f"guidellm failed ({p.returncode}): {text[-3000:]}")
    d = json.loads(out.read_text())
    return list(d["benchmarks"][0]["requests"]["successful"])


def part2_servers(work: Path, tiny: Path) -> list[tuple[str, list[str], int, str, str]]:
    """(label, argv, port, model = tokenizer dir, tuner's --tokenizer) for each server of part 2."""
    out = []
    for ttft_ms, itl_ms in ((50, 10), (200, 20)):
        port = free_port()
        # the model name is the tokenizer directory: guidellm loads its tokenizer from the model name
        out.append((f"guidellm mock-server ({ttft_ms} ms / {itl_ms} ms)",
                    guidellm_mock_argv(port, model=str(tiny), ttft_ms=ttft_ms, itl_ms=itl_ms), port, str(tiny),
                    str(tiny)))
    ckpt = work / "engine-ckpt"  # byte-level tokenizer: guidellm's prompts are as many bytes as the engine counts
    subprocess.run([*TUNER, "make-model", str(ckpt), "--preset", "tiny"], check=True, capture_output=True)
    port = free_port()
    out.append(("tuner reference engine (tiny, CPU, real compute)",
                [str(ROOT / ".venv" / "bin" / "python"), "-m", "tuner.engine.server", "--port", str(port),
                 "--device", "cpu", "--weights", str(ckpt), "--served-model-name", str(ckpt)],
                port, str(ckpt), "byte"))
    return out


def part2(work: Path, tiny: Path, quick: bool, with_engine: bool) -> tuple[list[str], list[str]]:
    from transformers import AutoTokenizer

    n, rounds = (30, 1) if quick else (60, 3)
    prompt, output, conc = 64, 32, 2
    rows = ["| server | round | tool | requests | prompt tokens under the tokenizer (median) "
            "| prompt tokens the server counted (median) | output tokens (median) | median TTFT ms "
            "| median TPOT ms | mean TPOT ms |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    verdicts = []
    for label, argv, port, model, tuner_tok in part2_servers(work, tiny):
        if "engine" in label and not with_engine:
            continue
        tok = AutoTokenizer.from_pretrained(model, local_files_only=True)
        print(f"[{time.strftime('%H:%M:%S')}] part 2: {label} (load {load()})", flush=True)
        med: dict[str, list[tuple[float, float]]] = {"guidellm": [], "tuner bench": []}
        with running(argv, port=port, model=model, log=work / f"gl{port}.log") as srv:
            for rnd in range(rounds):
                for tool in ("guidellm", "tuner bench"):
                    if tool == "guidellm":
                        reqs = guidellm_run(srv.url, model, work / "gl.json", requests=n + 2, prompt=prompt,
                                            output=output, concurrency=conc)
                        reqs = sorted(reqs, key=lambda r: r["request_start_time"])[2:]  # as the tuner's warm-up
                        ttft = [r["time_to_first_token_ms"] for r in reqs]
                        tpot = [(r["request_latency"] * 1000 - r["time_to_first_token_ms"]) / (r["output_tokens"] - 1)
                                for r in reqs]
                        p_tok = [len(tok.encode(json.loads(r["request_args"])["body"]["prompt"],
                                                add_special_tokens=False)) for r in reqs]
                        p_srv = [r["prompt_tokens"] for r in reqs]
                        o_tok = [r["output_tokens"] for r in reqs]
                    else:
                        res = bench(srv.url, model, work / "tb.json", [], requests=n, prompt=prompt,
                                    output=output, concurrency=conc, tokenizer=tuner_tok, warmup=2)
                        ok = [i for i, e in enumerate(res["errors"]) if not e]
                        ttft = [res["ttfts"][i] * 1000 for i in ok]
                        tpot = [(res["latencies"][i] - res["ttfts"][i]) * 1000 / (res["output_lens"][i] - 1)
                                for i in ok]
                        p_tok = [prompt] * len(ok)  # built to be exactly this long under the tokenizer
                        p_srv = [res["input_lens"][i] for i in ok]
                        o_tok = [res["output_lens"][i] for i in ok]
                    m_ttft, m_tpot = statistics.median(ttft), statistics.median(tpot)
                    med[tool].append((m_ttft, m_tpot))
                    rows.append(f"| {label} | {rnd + 1} | {tool} | {len(ttft)} | {statistics.median(p_tok):.0f} "
                                f"| {statistics.median(p_srv):.0f} | {statistics.median(o_tok):.0f} "
                                f"| {m_ttft:.2f} | {m_tpot:.3f} "
                                f"| {statistics.fmean(tpot):.3f} |")
                    print("  ", rows[-1], flush=True)
        g = [statistics.median(x[i] for x in med["guidellm"]) for i in (0, 1)]
        t = [statistics.median(x[i] for x in med["tuner bench"]) for i in (0, 1)]
        d_ttft, d_tpot = (t[0] - g[0]) / g[0], (t[1] - g[1]) / g[1]
        ok = abs(d_ttft) <= 0.10 and abs(d_tpot) <= 0.10
        verdicts.append(f"- {label}: median TTFT guidellm {g[0]:.2f} ms, tuner {t[0]:.2f} ms ({d_ttft:+.1%}); "
                        f"median TPOT guidellm {g[1]:.3f} ms, tuner {t[1]:.3f} ms ({d_tpot:+.1%}): "
                        f"{'within' if ok else 'NOT within'} 10 %")
        print(verdicts[-1], flush=True)
    return rows, verdicts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("results.md"))
    ap.add_argument("--skip-part1", action="store_true")
    ap.add_argument("--engine", action="store_true", help="also compare on the reference engine (real compute on "
                    "the CPU: slow, about 0.4 s per token per request on this loaded machine)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped run still takes its servers down
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load0 = load()
    with tempfile.TemporaryDirectory(prefix="interop-") as tmp:
        work = Path(tmp)
        tiny = make_tiny_model(work / "tiny")
        p1 = [] if args.skip_part1 else part1(work, tiny, args.quick)
        p2, verdicts = part2(work, tiny, args.quick, args.engine)
    lines = [f"# interop results ({started}{', --quick' if args.quick else ''})", "",
             f"Load average (1, 5, 15 min) at the start: {load0}; at the end: {load()} (2 cores, shared with "
             "other jobs: figures are wall-clock and noisy).", ""]
    if p1:
        lines += ["## What each server accepts (tuner bench, 32 prompt / 8 output tokens, 2 in flight)", "", *p1, ""]
    lines += ["## guidellm vs tuner bench (same server, same load)", "", *p2, "", *verdicts, ""]
    args.out.write_text("\n".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
