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
from tuner.sim.config import KNOBS, EngineConfig, resolve_config
from tuner.sim.engine import simulate
from tuner.sim.profiles import HARDWARE, MODELS
from tuner.space import SearchSpace
from tuner.spec import WorkloadSpec
from tuner.targets.base import Deployment, Target, TrialContext

_MASK = 0xFFFFFFFF


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
        return Measurement(summary=summarise(res.records, goodput_ms=goodput_ms or None),
                           records=tuple(res.records), cold_start_s=cfg.cold_start_s, telemetry=telemetry,
                           notes=tuple(notes))


class SimTarget(Target):
    kind = "sim"

    class Options(BaseModel, extra="forbid"):
        hardware: str = "a100-80gb-sxm"
        model: str = "llama-3-8b"
        num_gpus: int = Field(default=8, ge=1)
        noise_cv: float = Field(default=0.0, ge=0.0, lt=1.0)
        seed: int = 0
        max_model_len: int = Field(default=8192, ge=16)

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

    def check_space(self, space: SearchSpace) -> None:
        names = [p.name for p in getattr(space, "params", [])] + list(getattr(space, "fixed", {}))
        unknown = sorted(set(names) - set(KNOBS))
        if unknown:
            raise ConfigError(f"the sim target has no knob(s) {unknown}; valid knobs: {', '.join(sorted(KNOBS))}",
                              file=getattr(space, "source", None))
