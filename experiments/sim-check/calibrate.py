"""Simulated step times next to the H200 reference measurements (tuner/sim/calibration.py holds their figures).

Usage: .venv/bin/python experiments/sim-check/calibrate.py
The measured figures come from plain PyTorch (no vLLM host overhead), so the simulated columns leave out
HOST_S_PER_STEP/HOST_S_PER_SEQ and the torch.compile speed-up (optimization_level 0, graphs forced).
"""

from __future__ import annotations

from tuner.sim import calibration as cal
from tuner.sim.config import resolve_config
from tuner.sim.cost import StepCost
from tuner.sim.profiles import HARDWARE, MODELS

H200 = HARDWARE["h200"]
# (model, context, batch, eager ms, graph ms) from h200.md
DECODE = [
    ("llama-1.1b", 1024, 1, 5.78, 1.18), ("llama-1.1b", 1024, 8, 5.43, 1.31),
    ("llama-1.1b", 1024, 32, 5.64, 1.49), ("llama-1.1b", 1024, 128, 5.64, 2.38),
    ("llama-1.1b", 1024, 256, 5.45, 3.56),
    ("llama-3-8b", 2048, 1, 8.32, 5.29), ("llama-3-8b", 2048, 16, 8.04, 6.30),
    ("llama-3-8b", 2048, 64, 9.93, 9.30), ("llama-3-8b", 2048, 128, 14.15, 13.49),
]
# (model, batch, tokens, ms) prefill from h200.md
PREFILL = [
    ("llama-1.1b", 1, 256, 4.66), ("llama-1.1b", 1, 1024, 4.63), ("llama-1.1b", 1, 4096, 17.3),
    ("llama-1.1b", 1, 16384, 100.0), ("llama-1.1b", 8, 1024, 31.8), ("llama-1.1b", 32, 512, 61.7),
    ("llama-3-8b", 1, 2048, 51.2),
]


def cost(model: str, mode: str, tokens: int = 8192) -> StepCost:
    p = {"optimization_level": 0, "cudagraph_mode": mode, "max_num_seqs": 256, "max_num_batched_tokens": tokens,
         "max_cudagraph_capture_size": 512}
    return StepCost(resolve_config(p, hardware=H200, model=MODELS[model], num_gpus=1, max_model_len=4096))


def host(seqs: int) -> float:
    return cal.HOST_S_PER_STEP + cal.HOST_S_PER_SEQ * seqs


def main() -> None:
    print("decode step on H200 (ms): measured vs simulated")
    print(f"{'model':<11} {'ctx':>5} {'batch':>5} | {'eager':>6} {'sim':>6} {'err':>5} | "
          f"{'graph':>6} {'sim':>6} {'err':>5}")
    for model, ctx, b, eager_ms, graph_ms in DECODE:
        se = (cost(model, "NONE").seconds(b, b * ctx)[0] - host(b)) * 1e3
        sg = (cost(model, "FULL").seconds(b, b * ctx)[0] - host(b)) * 1e3
        print(f"{model:<11} {ctx:>5} {b:>5} | {eager_ms:>6.2f} {se:>6.2f} {se / eager_ms - 1:>+5.0%} | "
              f"{graph_ms:>6.2f} {sg:>6.2f} {sg / graph_ms - 1:>+5.0%}")
    print("\nprefill on H200, eager (ms): measured vs simulated")
    print(f"{'model':<11} {'batch':>5} {'tokens':>6} | {'meas':>6} {'sim':>6} {'err':>5}")
    for model, b, n, ms in PREFILL:
        c = cost(model, "NONE", tokens=max(8192, b * n))
        s = (c.seconds(0, 0, b * n, b * n * n / 2, b * n, sampled=b, seqs=b)[0] - host(b)) * 1e3
        print(f"{model:<11} {b:>5} {n:>6} | {ms:>6.2f} {s:>6.2f} {s / ms - 1:>+5.0%}")


if __name__ == "__main__":
    main()
