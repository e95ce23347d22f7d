"""Model presets and engine knobs. Pure Python: no torch import, so the tuner can read it cheaply.

Every field of `EngineConfig` is one command-line flag of the server (`--kebab-case`); booleans take
`--flag/--no-flag`. `validate(device)` rejects values that cannot apply on the device.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tuner.engine.varlen import VarlenAttention


class EngineConfigError(ValueError):
    """A knob value that is invalid, or cannot apply on this device. `field` names the knob."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class ModelConfig:
    """Shapes of a Llama-architecture decoder."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_model_len: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    eos_token_id: int | None = 256
    head_dim_override: int | None = None
    # Llama-3 style frequency scaling: {"factor", "low_freq_factor", "high_freq_factor",
    # "original_max_position_embeddings"}; None for plain RoPE.
    rope_scaling: dict[str, float] | None = None

    @property
    def head_dim(self) -> int:
        return self.head_dim_override or self.hidden_size // self.num_heads

    def param_count(self) -> int:
        d, f, hd = self.hidden_size, self.intermediate_size, self.head_dim
        attn = d * hd * (self.num_heads * 2 + self.num_kv_heads * 2)
        per_layer = attn + 3 * d * f + 2 * d
        emb = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + emb + d


PRESETS: dict[str, ModelConfig] = {
    # CPU tests: about 3.4 M parameters.
    "tiny": ModelConfig(vocab_size=512, hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=4,
                        intermediate_size=768, max_model_len=512),
    # about 110 M parameters.
    "small": ModelConfig(vocab_size=32000, hidden_size=768, num_layers=12, num_heads=12, num_kv_heads=4,
                         intermediate_size=2048, max_model_len=2048),
    # 1.10 B parameters, the shapes of the H200 reference measurements (a TinyLlama-1.1B-like stack).
    "1b": ModelConfig(vocab_size=32000, hidden_size=2048, num_layers=16, num_heads=32, num_kv_heads=8,
                      intermediate_size=8192, max_model_len=2048),
    # Llama-3-8B shapes (8.03 B parameters).
    "8b": ModelConfig(vocab_size=128256, hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
                      intermediate_size=14336, max_model_len=8192, rope_theta=500000.0,
                      eos_token_id=128001),
}

DTYPES = ("float32", "bfloat16", "float16")
BATCHING = ("static", "continuous")
POLICIES = ("fcfs", "priority", "shortest-prompt-first")
QUANTIZATION = ("none", "int8")
STREAM_PRIORITY = ("normal", "high")
ATTENTION = ("sdpa", "matmul", "flash")
DEVICES = ("auto", "cpu", "cuda")


def _knob(default: Any, help: str, choices: tuple[str, ...] | None = None, minimum: float | None = None,
          gpu_only: bool = False) -> Any:
    return field(default=default, metadata={"help": help, "choices": choices, "min": minimum,
                                            "gpu_only": gpu_only, "knob": True})


@dataclass(frozen=True)
class EngineConfig:
    """What the engine runs and every tunable knob. Defaults are a plain, untuned server."""

    preset: str = field(default="tiny", metadata={"help": "model shapes", "choices": tuple(PRESETS)})
    weights: str | None = field(default=None, metadata={
        "help": "directory of a Hugging Face Llama checkpoint (safetensors); random weights when unset"})
    device: str = field(default="auto", metadata={"help": "auto picks cuda when available",
                                                   "choices": DEVICES})
    seed: int = field(default=0, metadata={"help": "seed of the random weights"})
    max_model_len: int | None = field(default=None, metadata={
        "help": "context length (prompt + output) per sequence; the preset's when unset", "min": 8})
    # ---- knobs
    dtype: str = _knob("float32", "weights and activations", DTYPES)
    quantization: str = _knob("none", "int8: weight-only INT8 linear layers", QUANTIZATION)
    kv_pool_mb: int = _knob(256, "size of the KV-cache pool; each sequence takes one max_model_len slot",
                            minimum=1)
    pre_allocate: bool = _knob(False, "allocate the whole KV pool at start-up (else grow on demand)")
    batching: str = _knob("static", "static: collect a batch then run it to completion; "
                          "continuous: requests join and leave at every iteration", BATCHING)
    max_batch_size: int = _knob(8, "most sequences in one batch", minimum=1)
    batch_timeout_ms: float = _knob(50.0, "static batching: longest wait for a batch to fill", minimum=0)
    prefill_chunk_tokens: int = _knob(512, "prompt tokens per prefill chunk (and per iteration)",
                                      minimum=1)
    attention: str = _knob("sdpa", "decode attention: sdpa (torch picks the kernel), matmul (two batched "
                           "matmuls around a softmax) or flash (FlashAttention's varlen kernel reading each "
                           "sequence's own length; CUDA, bfloat16/float16)", ATTENTION)
    scheduling_policy: str = _knob("fcfs", "order of the waiting queue", POLICIES)
    cuda_graphs: bool = _knob(False, "decode under CUDA graphs (needs pre_allocate)", gpu_only=True)
    cuda_graph_max_batch: int = _knob(64, "largest decode batch captured in a graph", minimum=1)
    compile: bool = _knob(False, "torch.compile the decode step")
    async_output: bool = _knob(False, "non-blocking D2H copies of new tokens into pinned memory; the "
                               "next step is scheduled while the GPU runs", gpu_only=True)
    stream_priority: str = _knob("normal", "priority of the engine's CUDA stream", STREAM_PRIORITY,
                                 gpu_only=True)
    warmup: bool = _knob(False, "allocate, capture and run dummy batches before reporting ready")
    cpu_threads: int | None = field(default=None, metadata={
        "help": "torch intra-op threads (torch's default when unset)", "min": 1})
    step_log: str | None = field(default=None, metadata={
        "help": "append one JSON line per engine iteration to this file: its duration and what it computed "
                "(prefill chunks and tokens, decode rows and attention length); fits the simulator's step cost"})
    step_delay_ms: float = field(default=0.0, metadata={
        "help": "sleep this long before every engine iteration: a deliberately slower engine (tests of "
                "host-sized workloads)", "min": 0})
    step_slowdown_frac: float = field(default=0.0, metadata={
        "help": "after every engine iteration sleep this fraction of the time it took: each step takes "
                "(1 + frac) times as long whatever the host's speed (a server slowdown of a known size)",
        "min": 0})

    # ------------------------------------------------------------------ helpers
    def model_config(self) -> ModelConfig:
        base = PRESETS[self.preset]
        if self.max_model_len is not None:
            base = dataclasses.replace(base, max_model_len=self.max_model_len)
        return base

    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def validate(self, device: str, *, runs_here: tuple[str, ...] = (), varlen: VarlenAttention | None = None) -> None:
        """Raise EngineConfigError naming the knob, its value and the rule.

        runs_here: GPU-only knobs that can apply on this device all the same (the engine's graph backend
        says so for `cuda_graphs` when it is a stand-in that runs anywhere).
        varlen: the kernel `attention=flash` would run (default: torch's flash kernel), which says whether it
        can run on this device and dtype."""
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            choices = f.metadata.get("choices")
            if choices and v not in choices:
                raise EngineConfigError(f"{f.name}={v!r} is not one of {', '.join(choices)}", f.name)
            minimum = f.metadata.get("min")
            if minimum is not None and v is not None and v < minimum:
                raise EngineConfigError(f"{f.name}={v!r} must be >= {minimum}", f.name)
            if f.metadata.get("gpu_only") and device != "cuda" and v != f.default and f.name not in runs_here:
                raise EngineConfigError(
                    f"{f.name}={v!r} cannot apply on device {device!r}: it needs a CUDA GPU", f.name)
        if device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise EngineConfigError("device 'cuda' requested but torch sees no CUDA GPU", "device")
        if self.attention == "flash":
            self._check_flash(device, varlen)
        if self.cuda_graphs and not self.pre_allocate:
            raise EngineConfigError("cuda_graphs=True needs pre_allocate=True (graphs need fixed KV addresses)",
                                    "cuda_graphs")
        if self.weights is None:
            check_pool(self.model_config(), self.dtype, self.kv_pool_mb)

    def _check_flash(self, device: str, varlen: VarlenAttention | None) -> None:
        if varlen is None:
            from tuner.engine.varlen import VarlenAttention as Kernel

            varlen = Kernel()
        # a checkpoint's head dimension is known only once its config is read (the engine checks it then)
        why = varlen.unavailable(device, self.dtype, None if self.weights else self.model_config().head_dim)
        if why:
            raise EngineConfigError(f"attention='flash' cannot apply on device {device!r} in {self.dtype}: {why}; "
                                    "use attention=sdpa or matmul", "attention")

    def knobs(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata.get("knob")}


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def slot_bytes(mc: ModelConfig, dtype: str) -> int:
    """KV bytes of one sequence slot: max_model_len + 1 positions (one scratch), all layers, k and v."""
    return mc.num_layers * 2 * mc.num_kv_heads * (mc.max_model_len + 1) * mc.head_dim * DTYPE_BYTES[dtype]


def check_pool(mc: ModelConfig, dtype: str, pool_mb: int) -> int:
    """The pool's capacity in sequences; EngineConfigError if it cannot hold one."""
    per = slot_bytes(mc, dtype)
    capacity = (pool_mb * 2**20) // per
    if capacity < 1:
        need = -(-per // 2**20)
        raise EngineConfigError(
            f"kv_pool_mb={pool_mb} cannot hold one sequence of max_model_len={mc.max_model_len} "
            f"({per / 2**20:.1f} MiB per sequence in {dtype}); use kv_pool_mb >= {need}", "kv_pool_mb")
    return capacity


def knob_value_error(name: str, value: Any) -> str | None:
    """Why one value of knob `name` is refused whatever the other knobs are (its kind, its choices, its
    minimum), or None: what a search space may offer the engine. Device rules are not checked here."""
    f = next((f for f in dataclasses.fields(EngineConfig) if f.name == name), None)
    if f is None or value is None and "None" in str(f.type):
        return None
    kind = str(f.type).replace(" | None", "")
    if kind == "bool":
        ok = isinstance(value, bool)
    elif kind == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind == "float":
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    else:
        ok = isinstance(value, str)
    if not ok:
        what = {"bool": "true or false", "int": "an integer", "float": "a finite number"}.get(kind, "a string")
        return f"{name} takes {what} (got {value!r})"
    choices = f.metadata.get("choices")
    if choices and value not in choices:
        return f"{name} must be one of {', '.join(choices)} (got {value!r})"
    minimum = f.metadata.get("min")
    if minimum is not None and value < minimum:
        return f"{name} must be >= {minimum:g} (got {value!r})"
    return None


def knob_names() -> list[str]:
    return [f.name for f in dataclasses.fields(EngineConfig) if f.metadata.get("knob")]


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per EngineConfig field: --kebab-case, booleans as --flag/--no-flag."""
    for f in dataclasses.fields(EngineConfig):
        kw: dict[str, Any] = {"dest": f.name, "default": f.default, "help": f.metadata.get("help", "")}
        if f.type in ("bool", bool):
            parser.add_argument(flag_name(f.name), action=argparse.BooleanOptionalAction, **kw)
            continue
        if f.metadata.get("choices"):
            kw["choices"] = list(f.metadata["choices"])
        kind = {"int": int, "int | None": int, "float": float, "str": str, "str | None": str}[str(f.type)]
        parser.add_argument(flag_name(f.name), type=kind, **kw)


def config_from_namespace(ns: argparse.Namespace) -> EngineConfig:
    return EngineConfig(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(EngineConfig)})


def to_argv(values: dict[str, Any]) -> list[str]:
    """Flags for the given knob values (names as in EngineConfig)."""
    names = {f.name: f for f in dataclasses.fields(EngineConfig)}
    argv: list[str] = []
    for k, v in values.items():
        if k not in names:
            raise EngineConfigError(f"unknown engine option {k!r}; valid: {', '.join(sorted(names))}")
        if v is None:
            continue
        if isinstance(v, bool):
            argv.append(flag_name(k) if v else "--no-" + k.replace("_", "-"))
        else:
            argv += [flag_name(k), str(v)]
    return argv
