"""Engine knobs (vLLM's names and 0.33 defaults), their validation, the memory plan and the cold start.

`resolve_config` raises what a real deployment would: InfeasibleConfig (more GPUs than the pool),
DeployError(cause="invalid_config") (vLLM refuses the arguments), OutOfMemoryError (weights or KV cache
do not fit).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuner.errors import DeployError, InfeasibleConfig, OutOfMemoryError
from tuner.sim import calibration as cal
from tuner.sim.profiles import HardwareProfile, ModelProfile

CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
KV_CACHE_DTYPES = {"auto": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
BATCHING_MODES = ("continuous", "static")

# Every knob the simulator understands. None: derived from hardware and other knobs, as vLLM does.
KNOBS: dict[str, Any] = {
    "max_num_seqs": None,  # 256 on A100, 1024 on H100/H200 (>= 70 GiB, not A100)
    "max_num_batched_tokens": None,  # 2048 on A100, 8192 on H100/H200
    "gpu_memory_utilization": 0.92,
    "enforce_eager": False,
    "optimization_level": 2,  # O2: torch.compile + FULL_AND_PIECEWISE graphs
    "cudagraph_mode": None,  # from optimization_level
    "max_cudagraph_capture_size": None,  # min(max_num_seqs * 2, 512)
    "enable_chunked_prefill": True,
    "tensor_parallel_size": 1,
    "data_parallel_size": 1,
    "kv_cache_dtype": "auto",
    "block_size": cal.BLOCK_SIZE,
    "max_model_len": None,  # the target option max_model_len
    "batching": "continuous",
    "batch_timeout_ms": 100.0,  # static batching: longest wait for a batch to fill
    "dtype": "bfloat16",  # accepted for compatibility with vllm search spaces; only bf16 is modelled
    "enable_prefix_caching": True,  # accepted; the simulated workloads share no prefixes
}


def _invalid(msg: str) -> DeployError:
    return DeployError(msg, cause="invalid_config")


def _as_int(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int | float) or float(v) != int(v):
        raise _invalid(f"{name} must be an integer (got {v!r})")
    return int(v)


def _as_bool(name: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "false"):
        return v.lower() == "true"
    raise _invalid(f"{name} must be true or false (got {v!r})")


def capture_sizes(max_size: int, max_num_tokens: int) -> list[int]:
    """vLLM's automatic CUDA graph sizes: [1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16)."""
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, max_size + 1, 16)]
    sizes = [s for s in sizes if s <= max_size and s <= max_num_tokens]
    top = min(max_size, max_num_tokens)
    if not sizes or sizes[-1] != top:
        sizes.append(top)
    return sorted(set(sizes))


@dataclass(frozen=True)
class MemoryPlan:
    """Per-GPU memory of one replica (bytes) and the KV capacity that follows."""

    budget_bytes: int
    weight_bytes: int
    activation_bytes: int
    graph_bytes: int
    other_bytes: int
    kv_bytes: int
    kv_bytes_per_token: int  # per GPU
    kv_capacity_tokens: int  # per replica


@dataclass(frozen=True)
class EngineConfig:
    """A resolved, validated configuration of one simulated deployment."""

    hardware: HardwareProfile
    model: ModelProfile
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float
    compiled: bool
    cudagraph_mode: str
    max_cudagraph_capture_size: int
    capture_sizes: tuple[int, ...]
    enable_chunked_prefill: bool
    tensor_parallel_size: int
    data_parallel_size: int
    kv_cache_dtype: str
    kv_dtype_bytes: int
    block_size: int
    max_model_len: int
    batching: str
    batch_timeout_s: float
    memory: MemoryPlan
    cold_start_s: float

    @property
    def gpus(self) -> int:
        return self.tensor_parallel_size * self.data_parallel_size


def _default_batch(hw: HardwareProfile) -> tuple[int, int]:
    """vLLM 0.33 get_batch_defaults for `vllm serve`: (max_num_seqs, max_num_batched_tokens)."""
    if hw.memory_gib >= 160:
        return 1024, 16384
    if hw.memory_gib >= 70 and not hw.is_a100:
        return 1024, 8192
    return 256, 2048


def resolve_config(params: Mapping[str, Any], *, hardware: HardwareProfile, model: ModelProfile,
                   num_gpus: int, max_model_len: int) -> EngineConfig:
    """Apply vLLM 0.33 defaults to `params`, validate them and plan memory. Raises classified errors."""
    unknown = sorted(set(params) - set(KNOBS))
    if unknown:
        raise _invalid(f"unrecognized arguments: {', '.join(unknown)}; the simulator knows "
                       f"{', '.join(sorted(KNOBS))}")
    p = {k: v for k, v in params.items() if v is not None}
    get = p.get

    tp = _as_int("tensor_parallel_size", get("tensor_parallel_size", 1))
    dp = _as_int("data_parallel_size", get("data_parallel_size", 1))
    if tp < 1 or dp < 1:
        raise _invalid(f"tensor_parallel_size and data_parallel_size must be >= 1 (got {tp}, {dp})")
    if tp * dp > num_gpus:
        raise InfeasibleConfig(f"tensor_parallel_size * data_parallel_size = {tp} * {dp} = {tp * dp} GPUs, "
                               f"but the target has {num_gpus}")
    if model.heads % tp:
        raise _invalid(f"Total number of attention heads ({model.heads}) must be divisible by tensor "
                       f"parallel size ({tp})")

    mml = _as_int("max_model_len", get("max_model_len", max_model_len))
    if mml < 1:
        raise _invalid(f"max_model_len must be >= 1 (got {mml})")
    chunked = _as_bool("enable_chunked_prefill", get("enable_chunked_prefill", True))
    d_seqs, d_tokens = _default_batch(hardware)
    seqs = _as_int("max_num_seqs", get("max_num_seqs", d_seqs))
    if seqs < 1:
        raise _invalid(f"max_num_seqs must be >= 1 (got {seqs})")
    if "max_num_batched_tokens" in p:
        tokens = _as_int("max_num_batched_tokens", p["max_num_batched_tokens"])
        if not chunked and tokens < mml:
            raise _invalid(
                f"max_num_batched_tokens ({tokens}) is smaller than max_model_len ({mml}). This effectively "
                "limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject longer "
                "sequences. Please increase max_num_batched_tokens or decrease max_model_len.")
    else:
        tokens = min(d_tokens, seqs * mml)
        if not chunked:
            tokens = max(tokens, mml)
    if tokens < seqs:
        raise _invalid(f"max_num_batched_tokens ({tokens}) must be greater than or equal to max_num_seqs "
                       f"({seqs}).")

    gmu = get("gpu_memory_utilization", 0.92)
    if isinstance(gmu, bool) or not isinstance(gmu, int | float) or not 0 < float(gmu) <= 1:
        raise _invalid(f"gpu_memory_utilization must be in (0, 1] (got {gmu!r})")
    gmu = float(gmu)

    eager = _as_bool("enforce_eager", get("enforce_eager", False))
    level = _as_int("optimization_level", get("optimization_level", 2))
    if level not in (0, 1, 2, 3):
        raise _invalid(f"optimization_level must be 0, 1, 2 or 3 (got {level})")
    mode = get("cudagraph_mode")
    if mode is None:
        mode = {0: "NONE", 1: "PIECEWISE"}.get(level, "FULL_AND_PIECEWISE")
    mode = str(mode).upper()
    if mode not in CUDAGRAPH_MODES:
        raise _invalid(f"cudagraph_mode must be one of {', '.join(CUDAGRAPH_MODES)} (got {mode!r})")
    compiled = not eager and level > 0
    if eager:
        mode = "NONE"  # enforce_eager is -cc.mode=none -cc.cudagraph_mode=none
    cap = _as_int("max_cudagraph_capture_size", get("max_cudagraph_capture_size", min(seqs * 2, 512)))
    if cap < 1:
        raise _invalid(f"max_cudagraph_capture_size must be >= 1 (got {cap})")
    sizes = tuple(capture_sizes(cap, tokens)) if mode != "NONE" else ()

    kv_dtype = str(get("kv_cache_dtype", "auto"))
    if kv_dtype not in KV_CACHE_DTYPES:
        raise _invalid(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)} (got {kv_dtype!r})")
    if KV_CACHE_DTYPES[kv_dtype] == 1 and not hardware.fp8_kv:
        raise _invalid(f"kv_cache_dtype {kv_dtype} is not supported on {hardware.name}")
    block = _as_int("block_size", get("block_size", cal.BLOCK_SIZE))
    if block not in (8, 16, 32):
        raise _invalid(f"block_size must be 8, 16 or 32 on CUDA (got {block})")
    dtype = str(get("dtype", "bfloat16"))
    if dtype not in ("auto", "bfloat16"):
        raise _invalid(f"the simulator models bfloat16 weights only (dtype {dtype!r})")
    _as_bool("enable_prefix_caching", get("enable_prefix_caching", True))

    batching = str(get("batching", "continuous"))
    if batching not in BATCHING_MODES:
        raise _invalid(f"batching must be one of {', '.join(BATCHING_MODES)} (got {batching!r})")
    timeout_ms = get("batch_timeout_ms", 100.0)
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int | float) or timeout_ms < 0:
        raise _invalid(f"batch_timeout_ms must be a number >= 0 (got {timeout_ms!r})")

    memory = plan_memory(hardware, model, tp=tp, gmu=gmu, max_num_seqs=seqs, max_num_batched_tokens=tokens,
                         kv_dtype_bytes=KV_CACHE_DTYPES[kv_dtype], block_size=block, cudagraph_mode=mode,
                         n_sizes=len(sizes))
    if memory.kv_capacity_tokens < mml:
        raise OutOfMemoryError(
            f"To serve at least one request with the model's max seq len ({mml}), "
            f"{mml * memory.kv_bytes_per_token / cal.GIB:.2f} GiB KV cache is needed, which is larger than the "
            f"available KV cache memory ({memory.kv_bytes / cal.GIB:.2f} GiB). Based on the available memory, "
            f"the estimated maximum model length is {memory.kv_capacity_tokens}. Try increasing "
            "gpu_memory_utilization or decreasing max_model_len when initializing the engine.")
    cold = cold_start_s(model, tp=tp, dp=dp, weight_bytes=memory.weight_bytes, compiled=compiled,
                        cudagraph_mode=mode, n_sizes=len(sizes))
    return EngineConfig(
        hardware=hardware, model=model, max_num_seqs=seqs, max_num_batched_tokens=tokens,
        gpu_memory_utilization=gmu, compiled=compiled, cudagraph_mode=mode, max_cudagraph_capture_size=cap,
        capture_sizes=sizes, enable_chunked_prefill=chunked, tensor_parallel_size=tp, data_parallel_size=dp,
        kv_cache_dtype=kv_dtype, kv_dtype_bytes=KV_CACHE_DTYPES[kv_dtype], block_size=block,
        max_model_len=mml, batching=batching, batch_timeout_s=float(timeout_ms) / 1000.0, memory=memory,
        cold_start_s=cold,
    )


def min_bytes_per_gpu(model: ModelProfile, tp: int) -> int:
    """What a GPU holds before any KV cache or activation: its share of the weights, the CUDA context, NCCL."""
    return model.weight_bytes // tp + cal.CUDA_CONTEXT_BYTES + (cal.NCCL_BYTES if tp > 1 else 0)


def plan_memory(hw: HardwareProfile, model: ModelProfile, *, tp: int, gmu: float, max_num_seqs: int,
                max_num_batched_tokens: int, kv_dtype_bytes: int, block_size: int, cudagraph_mode: str,
                n_sizes: int) -> MemoryPlan:
    """What vLLM's profiling run finds on each GPU: budget - weights - activations - graphs -> KV cache."""
    budget = int(hw.memory_bytes * gmu)
    weights = model.weight_bytes // tp  # layers, embedding and lm head are all sharded (vocab-parallel)
    other = cal.CUDA_CONTEXT_BYTES + (cal.NCCL_BYTES if tp > 1 else 0)
    if min_bytes_per_gpu(model, tp) > hw.memory_bytes:
        raise OutOfMemoryError(
            f"CUDA out of memory loading weights: {model.name} needs {weights / cal.GIB:.1f} GiB per GPU at "
            f"tensor_parallel_size={tp}, but a {hw.name} has {hw.memory_gib:.1f} GiB")
    act = max_num_batched_tokens * (cal.ACT_PEAK_D_FACTOR * model.hidden
                                    + cal.ACT_PEAK_FFN_FACTOR * model.ffn // tp) * 2
    act += max_num_seqs * model.vocab * cal.SAMPLER_BYTES_PER_SEQ_VOCAB
    kinds = {"NONE": 0, "PIECEWISE": 1, "FULL": 1, "FULL_DECODE_ONLY": 1, "FULL_AND_PIECEWISE": 2}[cudagraph_mode]
    graphs = n_sizes * kinds * cal.GRAPH_POOL_BYTES_PER_SIZE
    kv = budget - weights - other - act - graphs
    kv_tok = model.kv_bytes_per_token(kv_dtype_bytes, tp)
    if kv <= 0:
        raise OutOfMemoryError(
            f"No available memory for the cache blocks. Try increasing gpu_memory_utilization when "
            f"initializing the engine (budget {budget / cal.GIB:.1f} GiB = {gmu} x {hw.memory_gib:.1f} GiB; "
            f"weights {weights / cal.GIB:.1f} GiB, activations {act / cal.GIB:.2f} GiB, "
            f"other {(other + graphs) / cal.GIB:.2f} GiB per GPU)")
    blocks = kv // (kv_tok * block_size)
    if blocks <= 0:
        raise OutOfMemoryError("No available memory for the cache blocks (less than one block). Try "
                               "increasing gpu_memory_utilization when initializing the engine.")
    return MemoryPlan(budget_bytes=budget, weight_bytes=weights, activation_bytes=act, graph_bytes=graphs,
                      other_bytes=other, kv_bytes=kv, kv_bytes_per_token=kv_tok,
                      kv_capacity_tokens=int(blocks * block_size))


def cold_start_s(model: ModelProfile, *, tp: int, dp: int, weight_bytes: int, compiled: bool,
                 cudagraph_mode: str, n_sizes: int) -> float:
    """Seconds from launch to ready: processes, weight load, NCCL, compile, profiling, graph capture."""
    t = cal.PROCESS_START_S + weight_bytes / cal.WEIGHT_LOAD_BYTES_PER_S + cal.PROFILE_RUN_S
    if tp > 1:
        t += cal.TP_INIT_S
    if dp > 1:
        t += cal.DP_INIT_S
    if compiled:
        t += cal.COMPILE_BASE_S + cal.COMPILE_S_PER_LAYER * model.layers
    full = cudagraph_mode in ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
    piecewise = cudagraph_mode in ("PIECEWISE", "FULL_AND_PIECEWISE")
    if full:
        t += n_sizes * model.layers * cal.FULL_CAPTURE_S_PER_LAYER
    if piecewise:
        t += n_sizes * model.layers * cal.PIECEWISE_CAPTURE_S_PER_LAYER
    return t
