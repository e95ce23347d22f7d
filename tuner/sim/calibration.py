"""Every calibration constant of the simulator, in one place.

The efficiencies and overheads below were fitted to the figures measured on the lent H200 (the H200
reference measurements of the design notes, "h200.md" below: 2026-11-29, plain PyTorch, bf16; the figures
used are quoted next to each constant). experiments/sim-check/calibrate.py prints the simulated step times
next to those measurements.
"""

from __future__ import annotations

GIB = 1024**3

# ---------------------------------------------------------------- step cost (roofline + overheads)
# Achievable fraction of the HBM bandwidth. h200.md decode with CUDA graphs: MBU (floor at 4.3 TB/s over
# measured step) climbs from 44% at batch 1 to 87% at Llama-3-8B batch 128; a constant 0.85 of the 4.8 TB/s
# datasheet figure plus the per-layer residual below reproduces that curve within ~10% (8B: 5.07 vs 5.29 ms
# at batch 1, 9.28 vs 9.30 ms at batch 64, 13.47 vs 13.49 ms at batch 128).
MBU = 0.85
# Achievable fraction of dense bf16 peak. h200.md prefill MFU: 51-60% (1.1B, >= 1024 tokens), 67% (8B x 2048)
MFU = 0.60
# Work that stays on the GPU even inside a CUDA graph (small kernels, syncs), per layer and step.
# h200.md: 1.1B graph step at batch 1 is 1.18 ms against a 0.52 ms floor -> ~0.035 ms per layer (16 layers);
# 8B: 5.29 ms against a 3.8 ms floor -> ~0.04 ms per layer (32 layers).
GRAPH_RESIDUAL_S_PER_LAYER = 0.035e-3
# Host-side kernel launch time per layer when a step runs eagerly. h200.md: "eager decode is launch-bound
# (about 5.5 ms per step whatever the batch: roughly 0.35 ms of launches per layer)" for the 1.1B model;
# the 8B eager figures (8.3 ms at batch 1, 32 layers) imply ~0.26 ms. 0.30 ms splits the difference.
# Launches overlap GPU work, so an eager step costs max(GPU time, launch time).
EAGER_LAUNCH_S_PER_LAYER = 0.30e-3
# Share of those launches left in PIECEWISE graphs (attention runs outside the graph).
PIECEWISE_EAGER_FRACTION = 0.25
# torch.compile fusions (any mode but enforce_eager / O0): fewer bytes and FLOPs moved through HBM.
COMPILE_SPEEDUP = 0.96
# Engine host work per step not hidden by async scheduling: constant plus per scheduled sequence.
HOST_S_PER_STEP = 0.15e-3
HOST_S_PER_SEQ = 2.0e-6
# Tensor-parallel all-reduce: 2 per layer (after attention and after the MLP), ring algorithm.
ALLREDUCES_PER_LAYER = 2
ALLREDUCE_LATENCY_S = 6.0e-6
NVLINK_EFFICIENCY = 0.8  # achieved bus bandwidth / datasheet per-direction NVLink bandwidth
# Activations written and read per token (bf16 hidden states and MLP intermediates), bytes per (d + ffn/tp).
ACT_BYTES_PER_TOKEN_FACTOR = 8

# ---------------------------------------------------------------- memory
CUDA_CONTEXT_BYTES = int(0.6 * GIB)  # CUDA context, cuBLAS workspaces, allocator slack
NCCL_BYTES = int(0.3 * GIB)  # NCCL and custom all-reduce buffers when tensor_parallel_size > 1
# Peak activation memory of the profiling run, per token of max_num_batched_tokens: (10 d + 4 ffn/tp) x 2 bytes
ACT_PEAK_D_FACTOR = 10
ACT_PEAK_FFN_FACTOR = 4
SAMPLER_BYTES_PER_SEQ_VOCAB = 8  # float32 logits plus probabilities for max_num_seqs rows
GRAPH_POOL_BYTES_PER_SIZE = 3 * 1024**2  # CUDA graph memory pool per captured size and graph kind
BLOCK_SIZE = 16  # vLLM's default KV block size (tokens)

# ---------------------------------------------------------------- cold start
PROCESS_START_S = 6.0  # interpreter, imports, engine and API server processes
WEIGHT_LOAD_BYTES_PER_S = 2.5e9  # safetensors from local NVMe / page cache, per GPU in parallel
TP_INIT_S = 2.0  # NCCL communicators and custom all-reduce, once when tensor_parallel_size > 1
DP_INIT_S = 1.5  # DP coordinator and engine handshakes, once when data_parallel_size > 1
PROFILE_RUN_S = 1.5  # memory profiling run and KV cache allocation
COMPILE_BASE_S = 10.0  # torch.compile (Dynamo + Inductor), cold cache ...
COMPILE_S_PER_LAYER = 0.5  # ... plus per layer; h200.md: a compile of the 1.1B decode step took 33.6 s
# CUDA graph capture per size: h200.md measured 5-10 ms per batch size for one full 1.1B decode graph (16
# layers) -> ~0.5 ms per layer; piecewise graphs are captured per layer piece and cost more.
FULL_CAPTURE_S_PER_LAYER = 0.5e-3
PIECEWISE_CAPTURE_S_PER_LAYER = 4.0e-3
