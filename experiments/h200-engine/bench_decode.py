"""Decode throughput and memory-bandwidth utilisation (MBU) of the reference engine's decode step.

For the `1b` preset in bfloat16 at context ~1024, batch 1, 8, 32, 64, 128 and 256, with and without
CUDA graphs, this times the engine's real decode step (tuner.engine.runner.Runner.decode over a
pre-allocated KV pool) and writes a markdown table to $OUT/decode.md (or --out DIR).

MBU = (weight bytes + KV bytes read per step) / step time / 4.2 TB/s (H200 HBM3e). Needs only torch
(the engine modules it imports need nothing else). About 1-2 minutes on an H200.

    python experiments/h200-engine/bench_decode.py            # the H200 run
    python experiments/h200-engine/bench_decode.py --smoke    # tiny preset, 2 batch sizes, any device
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from tuner.engine.config import EngineConfig, slot_bytes  # noqa: E402
from tuner.engine.engine import Engine  # noqa: E402
from tuner.engine.model import weight_bytes  # noqa: E402
from tuner.engine.runner import Runner  # noqa: E402

PEAK_BW = 4.2e12  # bytes/s
TARGET_GRAPH_SPEEDUP_B1 = 3.0
TARGET_MBU_B256 = 0.70


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_steps(runner: Runner, b: int, start: int, warmup: int, steps: int, device: str) -> tuple[float, float]:
    """Seconds per decode step over `steps` steps from position `start`, and the mean context."""
    with runner.stream_ctx():
        runner.dec_pos[:b] = start
        for i in range(warmup):
            runner.decode(b, start + i + 1)
        runner.dec_pos[:b] = start
        sync(device)
        t0 = time.perf_counter()
        for i in range(steps):
            runner.decode(b, start + i + 1)
        sync(device)
        dt = (time.perf_counter() - t0) / steps
    return dt, start + (steps + 1) / 2.0


def agreement(eager: Runner, graph: Runner, b: int, start: int) -> tuple[float, float]:
    """Share of rows whose greedy token is the same from the eager step and the graph replay, and the
    largest logit difference between the two (relative to the logits' spread)."""
    with eager.stream_ctx():
        tok0 = torch.randint(0, 256, (b,), device=eager.dec_tok.device)
        eager.dec_tok[:b] = tok0
        eager.dec_pos[:b] = start
        le = eager.decode(b, start + 1).clone()
        a = eager.dec_tok[:b].clone()
        graph.dec_tok[:b] = tok0
        graph.dec_pos[:b] = start
        lg = graph.decode(b, start + 1).clone()
        g = graph.dec_tok[:b].clone()
        torch.cuda.synchronize()  # the clones ran on the engine's stream; read them only once done
    rel = float((le.double() - lg.double()).abs().max() / le.double().std().clamp(min=1e-12))
    return float((a == g).float().mean()), rel


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny preset, batches 1 and 4: checks the script")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="folder of decode.md (default $OUT)")
    ap.add_argument("--batches", default=None, help="comma-separated batch sizes")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                    help="bfloat16 on a GPU, float32 on a CPU by default")
    args = ap.parse_args()
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    preset = "tiny" if args.smoke else "1b"
    batches = [int(b) for b in args.batches.split(",")] if args.batches else (
        [1, 4] if args.smoke else [1, 8, 32, 64, 128, 256])
    context = min(args.context, 256) if args.smoke else args.context
    steps = args.steps or (3 if args.smoke else 20)
    warmup = 1 if args.smoke else 3
    graphs = device == "cuda"
    dtype = args.dtype or ("bfloat16" if device == "cuda" else "float32")
    max_len = context + 2  # positions start-1 .. context-1 are decoded; +1 scratch column in the pool
    start = context - steps
    bmax = max(batches)
    probe = EngineConfig(preset=preset, max_model_len=max_len)
    per_slot = slot_bytes(probe.model_config(), dtype)
    pool_mb = -(-bmax * per_slot // 2**20) + 1
    cfg = EngineConfig(preset=preset, device=device, dtype=dtype, max_model_len=max_len, kv_pool_mb=pool_mb,
                       pre_allocate=True, batching="continuous", max_batch_size=bmax, cuda_graphs=graphs,
                       cuda_graph_max_batch=bmax, warmup=False)
    t0 = time.perf_counter()
    engine = Engine(cfg, emit=lambda items: None)
    engine.load()
    load_s = time.perf_counter() - t0
    mc = engine.mc
    graph_runner = engine.runner
    eager_cfg = dataclasses.replace(cfg, cuda_graphs=False)
    eager_runner = Runner(eager_cfg, engine.model, engine.pool, device)
    w_bytes = weight_bytes(engine.model)
    kv_per_token = mc.num_layers * 2 * mc.num_kv_heads * mc.head_dim * (4 if dtype == "float32" else 2)
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    print(f"{preset}: {mc.param_count() / 1e9:.2f} B params, {w_bytes / 1e9:.2f} GB read per step, "
          f"{dtype} on {name}; pool {engine.pool.capacity} slots; built in {load_s:.1f} s", flush=True)

    rows = []
    for b in batches:
        eager_s, ctx = time_steps(eager_runner, b, start, warmup, steps, device)
        graph_s = None
        agree = None
        logit_diff = None
        capture_s = 0.0
        if graphs:
            c0 = time.perf_counter()
            with graph_runner.stream_ctx():
                graph_runner.capture(b)
            sync(device)
            capture_s = time.perf_counter() - c0
            graph_s, _ = time_steps(graph_runner, b, start, warmup, steps, device)
            agree, logit_diff = agreement(eager_runner, graph_runner, b, start)
        bytes_step = w_bytes + b * ctx * kv_per_token
        floor_s = bytes_step / PEAK_BW
        row = {"b": b, "eager_ms": eager_s * 1e3, "graph_ms": graph_s * 1e3 if graph_s else None,
               "floor_ms": floor_s * 1e3, "mbu_eager": floor_s / eager_s,
               "mbu_graph": floor_s / graph_s if graph_s else None, "tok_eager": b / eager_s,
               "tok_graph": b / graph_s if graph_s else None, "capture_s": capture_s, "agree": agree,
               "logit_diff": logit_diff}
        rows.append(row)
        print(f"batch {b}: eager {row['eager_ms']:.3f} ms" + (
            f", graph {row['graph_ms']:.3f} ms (x{eager_s / graph_s:.1f}), MBU graph {row['mbu_graph']:.0%}, "
            f"capture {capture_s:.3f} s, token agreement {agree:.0%}, max logit diff {logit_diff:.2g} std"
            if graph_s else ""), flush=True)

    def f(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    lines = [
        f"# Decode step of the reference engine: `{preset}` preset, {dtype}, context ~{context}",
        "",
        f"Device: {name}; torch {torch.__version__}. Weights read per step: {w_bytes / 1e9:.2f} GB; "
        f"KV read per step: batch x context x {kv_per_token} B. floor = bytes / {PEAK_BW / 1e12:.1f} TB/s; "
        "MBU = floor / measured step. Steps timed with the engine's own Runner.decode "
        f"({steps} steps after {warmup} warm-up, host-synchronised).",
        "",
        "| batch | eager ms/step | CUDA graph ms/step | graph speed-up | floor ms | MBU eager | MBU graph "
        "| tok/s eager | tok/s graph | capture s | greedy agreement | max logit diff (std) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        speed = r["eager_ms"] / r["graph_ms"] if r["graph_ms"] else None
        lines.append(
            f"| {r['b']} | {r['eager_ms']:.3f} | {f(r['graph_ms'], '.3f')} | {f(speed, '.1f')}x "
            f"| {r['floor_ms']:.3f} | {r['mbu_eager']:.0%} | {f(r['mbu_graph'], '.0%')} | {r['tok_eager']:,.0f} "
            f"| {f(r['tok_graph'], ',.0f')} | {r['capture_s']:.3f} | {f(r['agree'], '.0%')} "
            f"| {f(r['logit_diff'], '.2g')} |")
    verdicts = []
    by_b = {r["b"]: r for r in rows}
    if 1 in by_b and by_b[1]["graph_ms"]:
        s = by_b[1]["eager_ms"] / by_b[1]["graph_ms"]
        verdicts.append(f"- graphs vs eager at batch 1: {s:.1f}x (target >= {TARGET_GRAPH_SPEEDUP_B1:.0f}x): "
                        f"{'met' if s >= TARGET_GRAPH_SPEEDUP_B1 else 'NOT met'}")
    if 256 in by_b and by_b[256]["mbu_graph"]:
        m = by_b[256]["mbu_graph"]
        verdicts.append(f"- MBU at batch 256 with graphs: {m:.0%} (target >= {TARGET_MBU_B256:.0%}): "
                        f"{'met' if m >= TARGET_MBU_B256 else 'NOT met'}")
    if verdicts:
        lines += ["", *verdicts]
    text = "\n".join(lines) + "\n"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "decode.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
