"""GPU telemetry check on a real GPU: does tuner/measure/gpu.py read power, energy and DRAM bandwidth right?

Three phases, each sampled by its own GpuSampler (0.2 s interval) on GPU 0:
  idle (3 s), bf16 matmul load (20 s, 8192^3: compute-bound), device-to-device copy (8 s, memory-bound).
Cross-checks: energy from nvmlDeviceGetTotalEnergyConsumption vs mean power x time; GPM DRAM bandwidth
utilisation vs the copy's own bytes/s (as % of the nominal peak given by --peak-gbs, H200: 4800 GB/s);
matmul TFLOP/s from torch's side.

Needs only torch, numpy and nvidia-ml-py (loads gpu.py by file path: no pydantic or other tuner deps).
Writes $OUT/gpu_telemetry.md (and .json). Total time about 40 s.

Usage: python experiments/gpu-telemetry/run.py [--gpu 0] [--matmul-s 20] [--copy-s 8] [--peak-gbs 4800]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def load_gpu_module() -> Any:
    spec = importlib.util.spec_from_file_location("tuner_measure_gpu", ROOT / "tuner" / "measure" / "gpu.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--idle-s", type=float, default=3.0)
    ap.add_argument("--matmul-s", type=float, default=20.0)
    ap.add_argument("--copy-s", type=float, default=8.0)
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--peak-gbs", type=float, default=4800.0, help="nominal DRAM bandwidth (H200: 4800 GB/s)")
    ap.add_argument("--interval-s", type=float, default=0.2)
    ap.add_argument("--copy-mib", type=int, default=2048, help="size of each copy buffer")
    ap.add_argument("--cpu-dry-run", action="store_true", help="exercise the script on the CPU (no telemetry)")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    out_dir = Path(os.environ.get("OUT", "out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    gpu = load_gpu_module()
    import torch

    lines = ["# GPU telemetry check", ""]
    if a.cpu_dry_run:
        dev = torch.device("cpu")
        name = "CPU (dry run)"

        def sync() -> None:
            pass
    elif not torch.cuda.is_available():
        lines.append("No CUDA device: nothing measured.")
        (out_dir / "gpu_telemetry.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
        return 1
    else:
        dev = torch.device("cuda", a.gpu)
        torch.cuda.set_device(dev)
        name = torch.cuda.get_device_name(dev)

        def sync() -> None:
            torch.cuda.synchronize()
    results: dict[str, dict[str, float]] = {}
    extra: dict[str, dict[str, float]] = {}

    # ---------------------------------------------------------------- idle
    sync()
    with gpu.GpuSampler([a.gpu], interval_s=a.interval_s) as s:
        t0 = time.monotonic()
        time.sleep(a.idle_s)
        wall = time.monotonic() - t0
    results["idle"] = s.result()
    extra["idle"] = {"wall_s": wall}

    # ---------------------------------------------------------------- matmul (compute-bound)
    n = a.n
    x = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    y = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    z = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        torch.matmul(x, y, out=z)
    sync()
    iters = 0
    with gpu.GpuSampler([a.gpu], interval_s=a.interval_s) as s:
        t0 = time.monotonic()
        while time.monotonic() - t0 < a.matmul_s:
            for _ in range(20):
                torch.matmul(x, y, out=z)
            iters += 20
            sync()
        wall = time.monotonic() - t0
    results["matmul_bf16"] = s.result()
    extra["matmul_bf16"] = {"wall_s": wall, "tflops": 2 * n**3 * iters / wall / 1e12}
    del x, y, z

    # ---------------------------------------------------------------- copy (memory-bound)
    numel = (a.copy_mib << 20) // 2  # bf16 elements per buffer
    src = torch.empty(numel, device=dev, dtype=torch.bfloat16).fill_(1.0)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync()
    iters = 0
    with gpu.GpuSampler([a.gpu], interval_s=a.interval_s) as s:
        t0 = time.monotonic()
        while time.monotonic() - t0 < a.copy_s:
            for _ in range(10):
                dst.copy_(src)
            iters += 10
            sync()
        wall = time.monotonic() - t0
    gbs = 2 * src.numel() * src.element_size() * iters / wall / 1e9  # read + write
    results["copy_d2d"] = s.result()
    extra["copy_d2d"] = {"wall_s": wall, "achieved_gbs": gbs, "achieved_pct_of_peak": 100 * gbs / a.peak_gbs}
    del src, dst

    # ---------------------------------------------------------------- report
    keys = ["gpu_samples", "gpu_util_pct_mean", "gpu_mem_busy_pct_mean", "gpu_memory_used_mb_max",
            "gpu_power_w_mean", "gpu_power_w_max", "gpu_energy_j", "gpu_sm_clock_mhz_mean", "gpu_sm_clock_mhz_min",
            "gpu_throttle_power_frac", "gpu_throttle_thermal_frac", "gpu_throttle_hw_frac",
            "gpu_clocks_event_reasons_mask", "gpu_dram_bw_util_pct_mean", "gpu_dram_bw_util_pct_max",
            "gpu_sm_util_pct_mean", "gpu_sm_occupancy_pct_mean", "gpu_tensor_util_pct_mean"]
    phases = list(results)
    lines += [f"device: {name} (GPU {a.gpu}); torch {torch.__version__}; sampler interval {a.interval_s} s", ""]
    lines += ["| key | " + " | ".join(phases) + " |", "|---" * (len(phases) + 1) + "|"]
    for k in keys:
        lines.append(f"| {k} | " + " | ".join(
            f"{results[p][k]:.4g}" if k in results[p] else "-" for p in phases) + " |")
    lines += ["", "## Cross-checks", "", "| phase | check | value |", "|---|---|---|"]
    for p in phases:
        r, e = results[p], extra[p]
        lines.append(f"| {p} | wall time s | {e['wall_s']:.2f} |")
        if "gpu_energy_j" in r and "gpu_power_w_mean" in r:
            approx = r["gpu_power_w_mean"] * r.get("gpu_sampled_s", e["wall_s"])
            lines.append(f"| {p} | energy J (NVML counter) vs mean power x time | {r['gpu_energy_j']:.1f} vs "
                         f"{approx:.1f} |")
        if "tflops" in e:
            lines.append(f"| {p} | achieved bf16 TFLOP/s (torch) | {e['tflops']:.1f} |")
        if "achieved_gbs" in e:
            lines.append(f"| {p} | achieved copy GB/s (torch; % of {a.peak_gbs:.0f}) | {e['achieved_gbs']:.0f} "
                         f"({e['achieved_pct_of_peak']:.1f} %) |")
            if "gpu_dram_bw_util_pct_mean" in r:
                lines.append(f"| {p} | GPM DRAM bandwidth util % (mean) | {r['gpu_dram_bw_util_pct_mean']:.1f} |")
    if not any("gpu_dram_bw_util_pct_mean" in r for r in results.values()):
        lines += ["", "GPM DRAM bandwidth: not reported (nvmlGpmQueryDeviceSupport says unsupported, or reads "
                  "failed: see the log)."]
    text = "\n".join(lines) + "\n"
    (out_dir / "gpu_telemetry.md").write_text(text)
    (out_dir / "gpu_telemetry.json").write_text(json.dumps({"results": results, "extra": extra}, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
