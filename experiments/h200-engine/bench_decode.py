"""Decode throughput and memory-bandwidth utilisation (MBU) of the reference engine's decode step.

For the `1b` preset in bfloat16 at context ~1024, batch 1, 8, 32, 64, 128 and 256, with and without
CUDA graphs, and with each decode attention implementation of the engine (`--attention`: sdpa, matmul and,
where torch's flash kernel runs, flash),
this times the engine's real decode step (tuner.engine.runner.Runner.decode over a pre-allocated KV
pool) and writes a markdown table to $OUT/decode.md (or --out DIR), with each implementation's logits
against sdpa's. On a GPU it adds two diagnoses of the largest batch: one layer's attention alone under each
SDPA backend, the matmul form and the flash varlen form, against
the K/V bytes it must read (with the reasons torch gives for refusing a backend), and the top kernels
of one decode step by GPU time (torch.profiler).

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
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from tuner.engine.config import ATTENTION, EngineConfig, slot_bytes  # noqa: E402
from tuner.engine.engine import Engine  # noqa: E402
from tuner.engine.model import (  # noqa: E402
    FlashSeqs,
    decode_attention,
    decode_mask,
    flash_decode_attention,
    weight_bytes,
)
from tuner.engine.runner import Runner  # noqa: E402
from tuner.engine.varlen import VarlenAttention  # noqa: E402

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
    """Share of rows whose greedy token is the same from two runners' steps (eager and graph replay, or two
    attention implementations), and the largest logit difference between the two (relative to the logits'
    spread)."""
    with eager.stream_ctx():
        tok0 = torch.randint(0, 256, (b,), device=eager.dec_tok.device)
        eager.model.attention = eager.cfg.attention  # the model is shared by every runner of the bench
        eager.dec_tok[:b] = tok0
        eager.dec_pos[:b] = start
        le = eager.decode(b, start + 1).clone()
        a = eager.dec_tok[:b].clone()
        graph.model.attention = graph.cfg.attention
        graph.dec_tok[:b] = tok0
        graph.dec_pos[:b] = start
        lg = graph.decode(b, start + 1).clone()
        g = graph.dec_tok[:b].clone()
        sync(eager.device)  # the clones ran on the engine's stream; read them only once done
    rel = float((le.double() - lg.double()).abs().max() / le.double().std().clamp(min=1e-12))
    return float((a == g).float().mean()), rel


def measure(eager: Runner, graph: Runner, b: int, start: int, warmup: int, steps: int,
            graphs: bool) -> dict[str, Any]:
    """One batch size of one implementation: eager step time and, with graphs, capture, replay time and the
    replay's agreement with the eager step."""
    device = eager.device
    eager_s, ctx = time_steps(eager, b, start, warmup, steps, device)
    row: dict[str, Any] = {"b": b, "ctx": ctx, "eager_ms": eager_s * 1e3, "graph_ms": None, "capture_s": 0.0,
                           "agree": None, "logit_diff": None}
    if graphs:
        c0 = time.perf_counter()
        with graph.stream_ctx():
            graph.capture(b, graph.attn_bucket(start + 1))
        sync(device)
        row["capture_s"] = time.perf_counter() - c0
        graph_s, _ = time_steps(graph, b, start, warmup, steps, device)
        row["graph_ms"] = graph_s * 1e3
        row["agree"], row["logit_diff"] = agreement(eager, graph, b, start)
    return row


class SplitVarlen(VarlenAttention):
    """The engine's varlen call with FlashAttention's split-KV count forced (where torch's schema has it)."""

    def __init__(self, num_splits: int) -> None:
        self.num_splits = num_splits

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
                 max_q: int, max_k: int, seqused_k: torch.Tensor, scale: float) -> torch.Tensor:
        out: Any = torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, False, False,
                                                           scale=scale, seqused_k=seqused_k,
                                                           num_splits=self.num_splits)
        return out[0]


def attention_microbench(b: int, context: int, slot_len: int, mc: Any, dtype: torch.dtype, reps: int,
                         dev: str) -> list[str]:
    """One layer's decode attention at batch b over `context` keys, each way torch can run it, timed alone.

    Bytes: the K and V the step must read (b x context x kv_heads x head_dim x 2 tensors; for the flash rows,
    which read only each row's own length, those keys). The masked,
    grouped query is what the engine runs; "flash, no mask, enable_gqa" is the unmasked [b, heads, 1, hd]
    query of a plain benchmark whose rows all have the same length (a ceiling, not a correct engine step).
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    hkv, hd, g = mc.num_kv_heads, mc.head_dim, mc.num_heads // mc.num_kv_heads
    slots = torch.zeros(b, hkv, slot_len, hd, dtype=dtype, device=dev).normal_()
    keys = slots[:, :, :context]  # a view with the pool's strides, as in the engine
    vals_slots = torch.zeros_like(slots).normal_()
    vals = vals_slots[:, :, :context]
    q = torch.randn(b, hkv, g, hd, dtype=dtype, device=dev)
    pos = torch.randint(context - 32, context, (b,), device=dev)  # near-full rows, as in the decode table
    mask = decode_mask(pos, context, dtype)
    kv_bytes = 2 * b * context * hkv * hd * keys.element_size()

    def run(label: str, fn: Any, nbytes: int = kv_bytes) -> str:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                for _ in range(3):
                    fn()
                sync(dev)
                t0 = time.perf_counter()
                for _ in range(reps):
                    fn()
                sync(dev)
                dt = (time.perf_counter() - t0) / reps
                return f"| {label} | {dt * 1e6:.1f} | {nbytes / dt / 1e9:,.0f} | {nbytes / dt / PEAK_BW:.0%} | |"
            except Exception as exc:  # noqa: BLE001 - a refused backend is a finding, not a failure
                why = "; ".join(str(w.message).replace("|", "/")[:160] for w in caught[:3])
                return f"| {label} | - | - | - | {type(exc).__name__}: {str(exc)[:120]} {why} |"

    def backend(kind: Any, **kw: Any) -> Any:
        def fn() -> Any:
            with sdpa_kernel(kind):
                return torch.nn.functional.scaled_dot_product_attention(q, keys, vals, attn_mask=mask, **kw)
        return fn

    q_flat = q.reshape(b, hkv * g, 1, hd)
    rows = [run("sdpa, torch's choice (engine: attention=sdpa)", lambda: decode_attention(q, keys, vals, mask, "sdpa")),
            run("matmul (engine: attention=matmul)", lambda: decode_attention(q, keys, vals, mask, "matmul"))]
    for name in ("EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        kind = getattr(SDPBackend, name, None)
        if kind is not None:
            rows.append(run(f"sdpa forced to {name}", backend(kind)))

    def flash() -> Any:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q_flat, keys, vals, enable_gqa=True)

    rows.append(run("flash, no mask, enable_gqa (ceiling)", flash))
    if VarlenAttention().unavailable(dev, str(dtype).removeprefix("torch.")) is None:
        seqs = FlashSeqs.of(pos, hkv, slot_len, context)
        read = int(seqs.used.sum()) * hd * 2 * keys.element_size()  # it reads each row's own keys, no more
        rows.insert(2, run("flash varlen, each row's own length (engine: attention=flash)",
                           lambda: flash_decode_attention(VarlenAttention(), q, slots, vals_slots, seqs), read))
        if "num_splits" in str(torch.ops.aten._flash_attention_forward.default._schema):
            # whether FlashAttention's split-KV kernel (half the query tile of the plain one) would read faster
            rows[3:3] = [run(f"flash varlen, num_splits={n} forced (the engine lets the kernel choose)",
                             lambda n=n: flash_decode_attention(SplitVarlen(n), q, slots, vals_slots, seqs), read)
                         for n in (2, 4, 8)]
    chosen = "?"
    try:
        if dev != "cuda":
            raise RuntimeError("not a CUDA device")
        from torch.backends.cuda import SDPAParams, can_use_efficient_attention

        params = SDPAParams(q, keys, vals, mask, 0.0, False, False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ok = can_use_efficient_attention(params, True)
        chosen = f"can_use_efficient_attention: {ok}" + (
            "" if ok else " (" + "; ".join(str(w.message)[:200] for w in caught[:3]) + ")")
    except Exception as exc:  # noqa: BLE001 - the probe's API moves between torch versions
        chosen = f"backend probe unavailable: {type(exc).__name__}: {exc}"
    return [f"### One layer's attention alone: batch {b}, {context} keys, {mc.num_heads} heads on {hkv} KV heads "
            f"of {hd}, {str(dtype).removeprefix('torch.')}", "",
            f"K+V bytes per call: {kv_bytes / 1e6:.1f} MB. {chosen}.", "",
            "| implementation | us/call | GB/s | of 4.2 TB/s | refused because |", "|---|---:|---:|---:|---|", *rows]


def kernel_profile(runner: Runner, b: int, start: int, top: int = 12) -> list[str]:
    """The decode step's kernels by GPU time over 5 steps (eager: the same kernels a graph replays); on a
    CPU, its operators by CPU time."""
    from torch.profiler import ProfilerActivity, profile

    dev = runner.device
    kind = torch.autograd.DeviceType.CUDA if runner.is_cuda else torch.autograd.DeviceType.CPU
    activity = ProfilerActivity.CUDA if runner.is_cuda else ProfilerActivity.CPU

    runner.model.attention = runner.cfg.attention  # the model is shared by every runner of the bench
    with runner.stream_ctx():
        runner.dec_pos[:b] = start
        runner.decode(b, start + 1)
        sync(dev)
        with profile(activities=[activity]) as prof:
            for i in range(5):
                runner.decode(b, start + i + 2)
            sync(dev)
    stats: dict[str, list[float]] = {}
    for ev in prof.events():
        if runner.is_cuda:
            us = getattr(ev, "device_time", None) or getattr(ev, "cuda_time", 0.0)
        else:  # CPU operators nest: count the leaves' own time
            us = ev.self_cpu_time_total
        if ev.device_type == kind and us:
            acc = stats.setdefault(ev.name, [0.0, 0.0])
            acc[0] += us
            acc[1] += 1
    total = sum(v[0] for v in stats.values()) or 1.0
    where = "GPU" if runner.is_cuda else "CPU"
    lines = [f"### Kernels of one decode step, batch {b}, attention={runner.model.attention} "
             f"(torch.profiler, 5 steps): {total / 5 / 1e3:.3f} ms of {where} time per step", "",
             "| kernel | calls/step | us/step | share |", "|---|---:|---:|---:|"]
    for name, (us, n) in sorted(stats.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"| `{name[:90].replace('|', '/')}` | {n / 5:.0f} | {us / 5:,.1f} | {us / total:.0%} |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny preset, batches 1 and 4: checks the script")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--preset", default=None, help="model preset (default: 1b; tiny with --smoke)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="folder of decode.md (default $OUT)")
    ap.add_argument("--batches", default=None, help="comma-separated batch sizes")
    ap.add_argument("--attention", default=None,
                    help=f"comma-separated decode attention implementations, of {', '.join(ATTENTION)} (default: "
                         "each one that runs on the device in the dtype)")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--max-model-len", type=int, default=None,
                    help="the pool's slot length, as a server would size it (default: the preset's, e.g. 2048 "
                         "for 1b; at least context + 2): graphs replay the attention bucket covering the context")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                    help="bfloat16 on a GPU, float32 on a CPU by default")
    ap.add_argument("--diagnose", action=argparse.BooleanOptionalAction, default=None,
                    help="the attention microbenchmark and kernel profile at the largest batch (default: on a GPU)")
    args = ap.parse_args()
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    preset = args.preset or ("tiny" if args.smoke else "1b")
    batches = [int(b) for b in args.batches.split(",")] if args.batches else (
        [1, 4] if args.smoke else [1, 8, 32, 64, 128, 256])
    dtype = args.dtype or ("bfloat16" if device == "cuda" else "float32")
    flash_why = VarlenAttention().unavailable(device, dtype)
    if args.attention is None:
        impls = [a for a in ATTENTION if a != "flash" or flash_why is None]
    else:
        impls = [a.strip() for a in args.attention.split(",") if a.strip()]
    for a in impls:
        if a not in ATTENTION:
            ap.error(f"--attention: {a!r} is not one of {', '.join(ATTENTION)}")
        if a == "flash" and flash_why:
            ap.error(f"--attention: flash cannot run on {device} in {dtype}: {flash_why}")
    context = min(args.context, 256) if args.smoke else args.context
    steps = args.steps or (3 if args.smoke else 20)
    warmup = 1 if args.smoke else 3
    graphs = device == "cuda"
    # positions start-1 .. context-1 are decoded; the slot holds max_len + 1 positions (one scratch column)
    max_len = max(context + 2, args.max_model_len or EngineConfig(preset=preset).model_config().max_model_len)
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
    model = engine.model
    w_bytes = weight_bytes(model)
    kv_per_token = mc.num_layers * 2 * mc.num_kv_heads * mc.head_dim * (4 if dtype == "float32" else 2)
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    print(f"{preset}: {mc.param_count() / 1e9:.2f} B params, {w_bytes / 1e9:.2f} GB read per step, "
          f"{dtype} on {name}; pool {engine.pool.capacity} slots; built in {load_s:.1f} s", flush=True)

    header = [
        f"# Decode step of the reference engine: `{preset}` preset, {dtype}, context ~{context}",
        "",
        f"Device: {name}; torch {torch.__version__}. Weights read per step: {w_bytes / 1e9:.2f} GB; "
        f"KV read per step: batch x context x {kv_per_token} B. floor = bytes / {PEAK_BW / 1e12:.1f} TB/s; "
        "MBU = floor / measured step. Steps timed with the engine's own Runner.decode "
        f"({steps} steps after {warmup} warm-up, host-synchronised); graphs replay the attention-length "
        f"bucket {engine.runner.attn_bucket(start + 1)} (of a {engine.runner.L + 1}-position slot).",
        "",
    ]
    out = Path(args.out)
    rows: list[dict[str, Any]] = []
    runners: dict[str, tuple[Runner, Runner]] = {}
    failures: list[str] = []
    for impl in impls:
        model.attention = impl
        eager_runner = Runner(dataclasses.replace(cfg, cuda_graphs=False, attention=impl), model, engine.pool, device)
        graph_runner = Runner(dataclasses.replace(cfg, attention=impl), model, engine.pool, device)
        runners[impl] = (eager_runner, graph_runner)
        for b in batches:
            try:
                row = measure(eager_runner, graph_runner, b, start, warmup, steps, graphs)
            except Exception as exc:  # noqa: BLE001 - one implementation's failure must not lose the others' rows
                failures.append(f"- attention={impl} failed at batch {b}: {type(exc).__name__}: {str(exc)[:300]}")
                print(failures[-1], flush=True)
                runners.pop(impl)
                break
            floor_s = (w_bytes + b * row["ctx"] * kv_per_token) / PEAK_BW
            eager_s, graph_s = row["eager_ms"] / 1e3, (row["graph_ms"] or 0) / 1e3
            row.update(impl=impl, floor_ms=floor_s * 1e3, mbu_eager=floor_s / eager_s, tok_eager=b / eager_s,
                       mbu_graph=floor_s / graph_s if graph_s else None, tok_graph=b / graph_s if graph_s else None)
            rows.append(row)
            write(out, [*header, *table(rows, impls), "", f"(still measuring: the last row is attention={impl}, "
                                                          f"batch {b})"])
            print(f"{impl} batch {b}: eager {row['eager_ms']:.3f} ms" + (
                f", graph {row['graph_ms']:.3f} ms (x{eager_s / graph_s:.1f}), MBU graph {row['mbu_graph']:.0%}, "
                f"capture {row['capture_s']:.3f} s, token agreement {row['agree']:.0%}, max logit diff "
                f"{row['logit_diff']:.2g} std" if graph_s else ""), flush=True)

    lines = header + table(rows, impls) + (["", *failures] if failures else [])
    write(out, lines)
    if "sdpa" in runners:
        lines.append("")
        for impl in (i for i in runners if i != "sdpa"):
            try:
                same, diff = agreement(runners["sdpa"][0], runners[impl][0], bmax, start)
                lines.append(f"- attention={impl} against sdpa (eager step, batch {bmax}): greedy agreement "
                             f"{same:.0%}, max logit diff {diff:.2g} std")
            except Exception as exc:  # noqa: BLE001
                lines.append(f"- attention={impl} against sdpa: failed: {type(exc).__name__}: {str(exc)[:300]}")
    if args.diagnose or (args.diagnose is None and device == "cuda"):
        for label, fn in [("attention microbenchmark", lambda: attention_microbench(
                              bmax, context, max_len + 1, mc, engine.pool.dtype, 20, device)),
                          *[(f"kernel profile ({impl})", lambda impl=impl: kernel_profile(
                              runners[impl][0], bmax, start)) for impl in runners]]:
            try:
                lines += ["", *fn()]
            except Exception as exc:  # noqa: BLE001 - a diagnosis must not lose the table above
                lines += ["", f"({label} failed: {type(exc).__name__}: {exc})"]
            write(out, lines)  # after each diagnosis: a time limit never loses what is done
            print(f"{label} done", flush=True)
    print(write(out, lines))
    return 0


def table(rows: list[dict[str, Any]], impls: list[str]) -> list[str]:
    """The decode table and the targets' verdicts."""
    def f(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    lines = ["| attention | batch | eager ms/step | CUDA graph ms/step | graph speed-up | floor ms | MBU eager "
             "| MBU graph | tok/s eager | tok/s graph | capture s | greedy agreement | max logit diff (std) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        speed = r["eager_ms"] / r["graph_ms"] if r["graph_ms"] else None
        lines.append(
            f"| {r['impl']} | {r['b']} | {r['eager_ms']:.3f} | {f(r['graph_ms'], '.3f')} | {f(speed, '.1f')}x "
            f"| {r['floor_ms']:.3f} | {r['mbu_eager']:.0%} | {f(r['mbu_graph'], '.0%')} | {r['tok_eager']:,.0f} "
            f"| {f(r['tok_graph'], ',.0f')} | {r['capture_s']:.3f} | {f(r['agree'], '.0%')} "
            f"| {f(r['logit_diff'], '.2g')} |")
    verdicts = []
    for impl in impls:
        by_b = {r["b"]: r for r in rows if r["impl"] == impl}
        if 1 in by_b and by_b[1]["graph_ms"]:
            s = by_b[1]["eager_ms"] / by_b[1]["graph_ms"]
            verdicts.append(f"- attention={impl}: graphs vs eager at batch 1: {s:.1f}x (target >= "
                            f"{TARGET_GRAPH_SPEEDUP_B1:.0f}x): {'met' if s >= TARGET_GRAPH_SPEEDUP_B1 else 'NOT met'}")
        if 256 in by_b and by_b[256]["mbu_graph"]:
            m = by_b[256]["mbu_graph"]
            verdicts.append(f"- attention={impl}: MBU at batch 256 with graphs: {m:.0%} (target >= "
                            f"{TARGET_MBU_B256:.0%}): {'met' if m >= TARGET_MBU_B256 else 'NOT met'}")
    return lines + (["", *verdicts] if verdicts else [])


def write(out: Path, lines: list[str]) -> str:
    """decode.md in `out`, replaced whole (a reader never sees half a file)."""
    text = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "decode.md.tmp"
    tmp.write_text(text)
    tmp.replace(out / "decode.md")
    return text


if __name__ == "__main__":
    sys.exit(main())
