"""The cost of one engine step: roofline (FLOPs vs bytes) + launch overhead + tensor-parallel all-reduce.

    step_s = max(gpu_s, host_launch_s) + graph_residual_s + allreduce_s + host_s
    gpu_s  = max(FLOPs / (peak x MFU), bytes / (HBM bandwidth x MBU))      per GPU (TP splits both)

CUDA graphs remove the host launch time for batches they cover: FULL graphs for every batch up to the
capture size, FULL_DECODE_ONLY / FULL_AND_PIECEWISE full graphs for decode-only batches, PIECEWISE graphs
(and FULL_AND_PIECEWISE for mixed batches) leave attention's launches (PIECEWISE_EAGER_FRACTION) eager.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from tuner.sim import calibration as cal
from tuner.sim.config import EngineConfig


@dataclass(frozen=True)
class StepShape:
    """What one step computes. Context sums are in tokens."""

    decode_tokens: int = 0
    decode_context: int = 0  # sum of context lengths the decode tokens attend to
    prefill_tokens: int = 0
    prefill_attention: float = 0.0  # sum over chunks of chunk x (prior context + chunk / 2)
    prefill_context: int = 0  # sum over chunks of (prior context + chunk): KV read by prefill attention
    sampled: int = 0  # sequences that sample a token this step (lm head rows)
    seqs: int = 0  # sequences scheduled


class StepCost:
    """Precomputed constants of one configuration; `seconds(...)` prices a step."""

    def __init__(self, cfg: EngineConfig) -> None:
        m, hw, tp = cfg.model, cfg.hardware, cfg.tensor_parallel_size
        speed = cal.COMPILE_SPEEDUP if cfg.compiled else 1.0
        self.flops_per_s = hw.peak_flops_per_s * cal.MFU / speed
        self.bytes_per_s = hw.hbm_bytes_per_s * cal.MBU / speed
        self.linear_flops_per_token = 2.0 * m.linear_params / tp
        self.head_flops_per_sample = 2.0 * m.hidden * m.vocab / tp
        self.attn_flops_per_pair = 4.0 * m.layers * m.heads * m.head_dim / tp
        self.weight_bytes = float(cfg.memory.weight_bytes)
        self.kv_bytes_per_token = float(cfg.memory.kv_bytes_per_token)
        self.act_bytes_per_token = float(cal.ACT_BYTES_PER_TOKEN_FACTOR * (m.hidden + m.ffn // tp) * m.layers)
        self.launch_s = m.layers * cal.EAGER_LAUNCH_S_PER_LAYER
        self.residual_s = m.layers * cal.GRAPH_RESIDUAL_S_PER_LAYER
        self.mode = cfg.cudagraph_mode
        self.sizes = list(cfg.capture_sizes)
        self.cap = self.sizes[-1] if self.sizes else 0
        self.full_any = self.mode == "FULL"
        self.full_decode = self.mode in ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
        self.piecewise = self.mode in ("PIECEWISE", "FULL_AND_PIECEWISE")
        if tp > 1:
            ring = 2.0 * (tp - 1) / tp
            n = cal.ALLREDUCES_PER_LAYER * m.layers
            self.ar_fixed_s = n * cal.ALLREDUCE_LATENCY_S
            self.ar_s_per_token = n * ring * m.hidden * 2 / (hw.nvlink_bytes_per_s * cal.NVLINK_EFFICIENCY)
        else:
            self.ar_fixed_s = 0.0
            self.ar_s_per_token = 0.0

    def graph_kind(self, tokens: int, decode_only: bool) -> str:
        """'full', 'piecewise' or 'eager' for a batch of `tokens` tokens."""
        if tokens <= self.cap:
            if self.full_any or (decode_only and self.full_decode):
                return "full"
            if self.piecewise:
                return "piecewise"
        return "eager"

    def seconds(self, decode_tokens: int, decode_context: int, prefill_tokens: int = 0,
                prefill_attention: float = 0.0, prefill_context: int = 0, sampled: int = -1,
                seqs: int = -1) -> tuple[float, str]:
        """(step time in seconds, graph kind). `sampled` and `seqs` default to `decode_tokens`."""
        tokens = decode_tokens + prefill_tokens
        if sampled < 0:
            sampled = decode_tokens
        if seqs < 0:
            seqs = decode_tokens
        kind = self.graph_kind(tokens, prefill_tokens == 0)
        padded = tokens
        if kind != "eager":
            padded = self.sizes[bisect_left(self.sizes, tokens)]
        flops = (self.linear_flops_per_token * padded + self.head_flops_per_sample * sampled
                 + self.attn_flops_per_pair * (decode_context + prefill_attention))
        moved = (self.weight_bytes + self.kv_bytes_per_token * (decode_context + prefill_context)
                 + self.act_bytes_per_token * padded)
        gpu = max(flops / self.flops_per_s, moved / self.bytes_per_s)
        if kind == "full":
            launch = 0.0
        elif kind == "piecewise":
            launch = self.launch_s * cal.PIECEWISE_EAGER_FRACTION
        else:
            launch = self.launch_s
        t = (max(gpu, launch) + self.residual_s + self.ar_fixed_s + self.ar_s_per_token * padded
             + cal.HOST_S_PER_STEP + cal.HOST_S_PER_SEQ * seqs)
        return t, kind

    def shape_seconds(self, s: StepShape) -> float:
        return self.seconds(s.decode_tokens, s.decode_context, s.prefill_tokens, s.prefill_attention,
                            s.prefill_context, s.sampled, s.seqs)[0]
