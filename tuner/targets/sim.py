"""The `sim` target: an in-process simulated vLLM-like stack (tuner.sim), for fast, deterministic tuning."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, Field, field_validator

import tuner
from tuner.errors import ConfigError, Interrupted
from tuner.measure.measurement import Measurement
from tuner.measure.metrics import summarise
from tuner.search.space import SearchSpace
from tuner.sim.config import (
    BATCHING_MODES,
    CUDAGRAPH_MODES,
    KNOBS,
    KV_CACHE_DTYPES,
    EngineConfig,
    min_bytes_per_gpu,
    resolve_config,
)
from tuner.sim.engine import simulate
from tuner.sim.profiles import HARDWARE, MODELS
from tuner.spec import MAX_GPUS, MAX_TOKENS, SEED_MAX, WorkloadSpec
from tuner.targets.base import Deployment, Target, TrialContext

_MASK = 0xFFFFFFFF
_INT_MAX = 2**31 - 1  # vLLM's counts and sizes are C ints


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) or isinstance(v, float) and v.is_integer()


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


def _count(v: Any) -> bool:
    return _is_int(v) and 1 <= v <= _INT_MAX


def _one_of(*allowed: Any) -> Any:
    return lambda v: not isinstance(v, bool) and v in allowed


def _flag(v: Any) -> bool:
    return isinstance(v, bool) or isinstance(v, str) and v.lower() in ("true", "false")


# each knob's rule on one value (what resolve_config refuses whatever the other knobs are): the sim target's
# `validate` refuses a space that can hand the simulator a value it would refuse at every trial
KNOB_RULES: dict[str, tuple[str, Any]] = {
    "tensor_parallel_size": ("an integer >= 1", _count),
    "data_parallel_size": ("an integer >= 1", _count),
    "max_num_seqs": (f"an integer in [1, {_INT_MAX}]", _count),
    "max_num_batched_tokens": (f"an integer in [1, {_INT_MAX}]", _count),
    "max_cudagraph_capture_size": (f"an integer in [1, {_INT_MAX}]", _count),
    "max_model_len": (f"an integer in [1, {_INT_MAX}]", _count),
    "gpu_memory_utilization": ("a number in (0, 1]", lambda v: _is_number(v) and 0 < v <= 1),
    "optimization_level": ("0, 1, 2 or 3", lambda v: _is_int(v) and v in (0, 1, 2, 3)),
    "cudagraph_mode": (f"one of {', '.join(CUDAGRAPH_MODES)}",
                       lambda v: isinstance(v, str) and v.upper() in CUDAGRAPH_MODES),
    "kv_cache_dtype": (f"one of {', '.join(KV_CACHE_DTYPES)}", lambda v: isinstance(v, str) and v in KV_CACHE_DTYPES),
    "block_size": ("8, 16 or 32", lambda v: _is_int(v) and v in (8, 16, 32)),
    "batching": (f"one of {', '.join(BATCHING_MODES)}", lambda v: isinstance(v, str) and v in BATCHING_MODES),
    "batch_timeout_ms": ("a number >= 0", lambda v: _is_number(v) and v >= 0),
    "dtype": ("auto or bfloat16 (the simulator models bfloat16 weights)", _one_of("auto", "bfloat16")),
    "enforce_eager": ("true or false", _flag),
    "enable_chunked_prefill": ("true or false", _flag),
    "enable_prefix_caching": ("true or false", _flag),
}
_INTEGER_KNOBS = {k for k, (rule, _) in KNOB_RULES.items() if rule.startswith(("an integer", "0, 1", "8, 16"))}


def _knob_value_errors(space: SearchSpace, heads: int) -> list[tuple[str, str]]:
    """(field, message) for every value the space can hand the simulator that a knob's rule refuses: all
    choices, a range's ends and default, fixed values; integer knobs need an int (or categorical) param."""
    out: list[tuple[str, str]] = []
    for p in getattr(space, "params", []):
        if p.name in _INTEGER_KNOBS and p.spec.type == "float":
            out.append((f"params.{p.name}.type", f"{p.name} takes integers: use type int (or categorical)"))
    floats = {f for f, _ in out}
    for name, field, value in space.offered_values(every_int=("optimization_level", "block_size",
                                                              "tensor_parallel_size")):
        if value is None or f"params.{name}.type" in floats:
            continue  # null: the simulator's own default
        rule, ok = KNOB_RULES.get(name, ("", None))
        if ok is not None and not ok(value):
            out.append((field, f"{name} must be {rule} (got {value!r})"))
        elif name == "tensor_parallel_size" and heads % int(value):
            out.append((field, f"tensor_parallel_size {value!r} does not divide the model's {heads} attention "
                               "heads (vLLM refuses it)"))
        if len(out) > 20:
            break
    return out


class SimDeployment(Deployment):
    """A resolved configuration; each measure() is one simulated benchmark run."""

    def __init__(self, cfg: EngineConfig, options: SimTarget.Options, ctx: TrialContext, agent_dir: Path) -> None:
        self.cfg = cfg
        self.options = options
        self.ctx = ctx
        self.agent_dir = agent_dir
        self.cold_start_s = cfg.cold_start_s
        # the configuration is part of the noise stream: two configurations measured with the same seed
        # (an interleaved A/B verification) see independent machine noise, as on a real machine
        self._config_key = int.from_bytes(hashlib.sha256(repr(cfg).encode()).digest()[:4], "little")

    def measure(self, workload: WorkloadSpec, *, goodput_ms: Mapping[str, float], seed: int) -> Measurement:
        """Simulate `workload` once.

        Plans (lengths, arrivals; datasets and traces too, with approximate token counts) come from the
        workload's own seed: the same requests every run. `seed`, the target option `seed` and the
        configuration draw the machine noise, so noise_cv=0 gives identical runs whatever the seed.
        """
        from tuner.measure.datasets import plans_for
        from tuner.measure.tokenize import load_tokenizer

        if self.ctx.stop_event.is_set():
            raise Interrupted("stop requested before the measurement")
        tok = load_tokenizer(None, seed=workload.seed)
        plans, notes = plans_for(workload, seed=workload.seed, tok=tok, base_dir=self.agent_dir)
        a = workload.arrival
        concurrency = a.concurrency if a.kind == "closed" else None
        stop = None
        if workload.duration_s is not None:
            stop = workload.warmup_s + workload.duration_s
        rng = np.random.default_rng(np.random.SeedSequence([self.options.seed & _MASK, seed & _MASK,
                                                            self._config_key]))
        res = simulate(self.cfg, plans, concurrency=concurrency, timeout_s=workload.timeout_s,
                       noise_cv=self.options.noise_cv, rng=rng, stop_sending_s=stop, warmup_s=workload.warmup_s)
        st = res.stats
        cfg = self.cfg
        steps = max(st.steps, 1)
        telemetry = {
            "sim_kv_capacity_tokens": float(cfg.memory.kv_capacity_tokens),
            "sim_kv_cache_gib_per_gpu": cfg.memory.kv_bytes / 2**30,
            "sim_weights_gib_per_gpu": cfg.memory.weight_bytes / 2**30,
            "sim_max_concurrency": cfg.memory.kv_capacity_tokens / cfg.max_model_len,
            "sim_preemptions": float(st.preemptions),
            "sim_steps": float(st.steps),
            "sim_graph_step_fraction": st.graph_steps / steps,
            "sim_mean_batch_tokens": st.batch_tokens / steps,
            "sim_mean_running": st.running_sum / steps,
            "sim_peak_waiting": float(st.peak_waiting),
            "sim_timeouts": float(st.timeouts),
            "sim_rejected": float(st.rejected),
            "sim_gpus": float(cfg.gpus),
            "sim_noise_factor": res.noise_factor,
            "sim_busy_fraction": st.busy_s / max(res.end_s * cfg.data_parallel_size, 1e-9),
        }
        records, stopped = list(res.records), None
        if self.ctx.early_stop is not None:  # what a live run watched by the rule would have kept
            from tuner.measure.early_stop import replay

            records, stopped = replay(records, self.ctx.early_stop)
            if stopped is not None:
                notes = [*notes, f"stopped early at {stopped.at_s:.1f} s of simulated time: {stopped.text()}"]
        return Measurement(summary=summarise(records, goodput_ms=goodput_ms or None), records=tuple(records),
                           cold_start_s=cfg.cold_start_s,
                           telemetry=telemetry, notes=tuple(notes),
                           early_stop=stopped.to_attr() if stopped is not None else None)


class SimTarget(Target):
    kind = "sim"

    class Options(BaseModel, extra="forbid"):
        hardware: str = "a100-80gb-sxm"
        model: str = "llama-3-8b"
        num_gpus: int = Field(default=8, ge=1, le=MAX_GPUS)
        noise_cv: float = Field(default=0.0, ge=0.0, lt=1.0)
        seed: int = Field(default=0, ge=0, le=SEED_MAX)
        max_model_len: int = Field(default=8192, ge=16, le=MAX_TOKENS)

        @field_validator("hardware")
        @classmethod
        def _hardware(cls, v: str) -> str:
            if v not in HARDWARE:
                raise ValueError(f"unknown hardware {v!r}; valid: {', '.join(sorted(HARDWARE))}")
            return v

        @field_validator("model")
        @classmethod
        def _model(cls, v: str) -> str:
            if v not in MODELS:
                raise ValueError(f"unknown model {v!r}; valid: {', '.join(sorted(MODELS))}")
            return v

    options: Options

    def resolve(self, params: Mapping[str, Any]) -> EngineConfig:
        """The validated engine configuration of `params` (raises the classified deploy errors)."""
        o = self.options
        return resolve_config(params, hardware=HARDWARE[o.hardware], model=MODELS[o.model],
                              num_gpus=o.num_gpus, max_model_len=o.max_model_len)

    @contextmanager
    def deploy(self, params: Mapping[str, Any], ctx: TrialContext) -> Iterator[Deployment]:
        cfg = self.resolve(params)
        yield SimDeployment(cfg, self.options, ctx, self.agent_dir)

    def describe(self) -> dict[str, str]:
        o = self.options
        return {"kind": "sim", "engine": f"sim-{tuner.__version__}", "hardware": o.hardware, "model": o.model,
                "gpus": str(o.num_gpus)}

    def gpus_needed(self, params: Mapping[str, Any]) -> int:
        tp = params.get("tensor_parallel_size") or 1
        dp = params.get("data_parallel_size") or 1
        return int(tp) * int(dp)

    def gpus_available(self) -> int:
        return self.options.num_gpus

    def resource_violations(self, params: Mapping[str, Any]) -> list[str]:
        """GPUs beyond num_gpus, and weights that do not fit a GPU's memory at any utilisation."""
        out = super().resource_violations(params)
        tp = params.get("tensor_parallel_size") or 1
        if _count(tp):
            hw, model = HARDWARE[self.options.hardware], MODELS[self.options.model]
            need = min_bytes_per_gpu(model, int(tp))
            if need > hw.memory_bytes:
                out.append(f"{model.name} needs {need / 2**30:.1f} GiB per GPU at tensor_parallel_size={tp}, "
                           f"a {hw.name} has {hw.memory_gib:.1f} GiB")
        return out

    def check_space(self, space: SearchSpace) -> None:
        names = [p.name for p in getattr(space, "params", [])] + list(getattr(space, "fixed", {}))
        unknown = sorted(set(names) - set(KNOBS))
        if unknown:
            raise ConfigError(f"the sim target has no knob(s) {unknown}; valid knobs: {', '.join(sorted(KNOBS))}",
                              file=getattr(space, "source", None))
        bad = _knob_value_errors(space, MODELS[self.options.model].heads)
        if bad:
            field, msg = bad[0]
            more = f" (and {len(bad) - 1} more value(s) the simulator refuses)" if len(bad) > 1 else ""
            raise ConfigError(msg + more, file=getattr(space, "source", None), field=field)
