"""The torch_engine target (kind `torch_engine`): the reference PyTorch serving engine as a subprocess.

    target:
      kind: torch_engine
      preset: auto            # tiny on a CPU, 1b on a GPU; or tiny, small, 1b, 8b
      device: auto            # cpu, cuda
      weights: null           # a local Hugging Face Llama checkpoint dir (relative to the agent file)
      startup_timeout_s: 120
      step_delay_ms: 0        # > 0: a deliberately slower engine (sleeps before every iteration)
      step_log: false         # true: the engine logs every iteration to logs/<trial>.steps.jsonl (its shape
                              # and wall time: what the reference-engine simulator's step cost is fitted to)

A trial's parameters (the knobs of tuner.engine.config.EngineConfig) become `--kebab-case` flags of
`python -m tuner.engine.server`. The search space can read the fact `device` ("cpu" or "cuda") in its
conditions, so GPU-only knobs are never sampled on a CPU.
"""

from __future__ import annotations

import contextlib
import functools
import json
import platform
import sys
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tuner.engine.config import PRESETS, EngineConfig, EngineConfigError, knob_value_error, to_argv
from tuner.errors import ConfigError, InfeasibleConfig
from tuner.search.space import SearchSpace
from tuner.spec import MAX_TRIAL_S
from tuner.targets.base import TrialContext
from tuner.targets.process import HttpDeployment, ProcessTarget

# Fixed prompts of the quality probe (bytes of ASCII text, as the engine's tokenizer sees them).
PROBE_PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "1, 2, 3, 4, 5,",
)
PROBE_TOKENS = 16

# EngineConfig fields the target sets itself (from its options), never from the search space
_TARGET_FIELDS = {"preset", "weights", "device", "step_delay_ms", "step_log"}


class TorchEngineOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    preset: Literal["auto", "tiny", "small", "1b", "8b"] = Field(
        default="auto", description="model shapes; auto: tiny on a CPU, 1b on a GPU")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    weights: str | None = Field(default=None, description="local Hugging Face Llama checkpoint dir")
    startup_timeout_s: float = Field(default=120.0, gt=0, le=MAX_TRIAL_S)
    host: str = "127.0.0.1"
    cpu_threads: int | None = Field(default=None, ge=1, le=4096, description="torch intra-op threads of the server")
    python: str | None = Field(default=None, description="interpreter of the server (the tuner's by default)")
    step_delay_ms: float = Field(default=0.0, ge=0, le=10_000, description="a deliberately slower engine: "
                                 "sleep this long before every iteration (tests of host-sized workloads)")
    step_log: bool = Field(default=False, description="the engine writes one JSON line per iteration to "
                           "logs/<trial>.steps.jsonl under the state dir (simulator calibration)")


@functools.lru_cache(maxsize=1)
def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


# bfloat16 counts as fast on a CPU whose bfloat16 matmul takes at most this many times float32's
BFLOAT16_SLOWDOWN_LIMIT = 2.0


@functools.cache
def cpu_bfloat16_slowdown() -> float:
    """How many times longer a bfloat16 matmul of the tiny model's MLP shape (16 rows, 256 x 768) takes than the
    same in float32 on this CPU, on one thread (the best of 5 rounds of 10; about 0.1 s). Where the CPU has no
    bfloat16 instructions torch emulates them: 30-50x measured on an AVX2-only host, where every bfloat16 trial
    of the quickstart broke an SLO; below 1 on the host whose bfloat16 prompt tokens cost half of float32's."""
    import time

    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        best: dict[Any, float] = {}
        for dtype in (torch.float32, torch.bfloat16):
            a, b = torch.ones(16, 256, dtype=dtype), torch.ones(256, 768, dtype=dtype)
            a @ b  # first call: kernel selection
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(10):
                    a @ b
                best[dtype] = min(best.get(dtype, float("inf")), time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return best[torch.bfloat16] / max(best[torch.float32], 1e-9)


class TorchEngineDeployment(HttpDeployment):
    """The process target's HTTP deployment (same state) plus the engine's quality probe."""

    def __init__(self, inner: HttpDeployment) -> None:  # noqa: D107 - adopts inner's state
        self.__dict__.update(inner.__dict__)

    def quality_probe(self) -> list[list[int]] | None:
        """Greedy token ids (temperature 0) for PROBE_PROMPTS, through the HTTP API."""
        out = []
        for prompt in PROBE_PROMPTS:
            body = json.dumps({"model": self.model, "prompt": prompt, "max_tokens": PROBE_TOKENS,
                               "temperature": 0, "ignore_eos": True, "return_token_ids": True}).encode()
            req = urllib.request.Request(f"{self.base_url}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310 - our own local server
                data = json.loads(resp.read())
            out.append([int(t) for t in data["choices"][0]["token_ids"]])
        return out


def step_log_path(ctx: TrialContext) -> Path:
    """Where a trial's engine writes its step log (target option `step_log`)."""
    return ctx.log_dir / f"{ctx.log_name}.steps.jsonl"


class TorchEngineTarget(ProcessTarget):
    kind = "torch_engine"
    Options = TorchEngineOptions
    options: TorchEngineOptions

    def __init__(self, options: BaseModel, *, agent_dir: Path) -> None:
        super().__init__(options, agent_dir=agent_dir)
        assert isinstance(options, TorchEngineOptions)

    # ------------------------------------------------------------------ resolution
    def device(self) -> str:
        if self.options.device != "auto":
            return self.options.device
        return "cuda" if _cuda_available() else "cpu"

    def preset(self) -> str:
        if self.options.preset != "auto":
            return self.options.preset
        return "1b" if self.device() == "cuda" else "tiny"

    def weights_dir(self) -> Path | None:
        if not self.options.weights:
            return None
        p = Path(self.options.weights)
        return p if p.is_absolute() else self.agent_dir / p

    def facts(self) -> dict[str, Any]:
        """device: cpu or cuda; fast_bfloat16: whether bfloat16 runs about as fast as float32 here (measured on a
        CPU, cpu_bfloat16_slowdown; assumed on a GPU, which the tuner's own process does not initialise), so that
        a space can offer the dtype only where it can pay (agents/quickstart.yaml)."""
        device = self.device()
        fast = device == "cuda" or cpu_bfloat16_slowdown() <= BFLOAT16_SLOWDOWN_LIMIT
        return {"device": device, "fast_bfloat16": fast}

    def model_name(self, params: Mapping[str, Any]) -> str:
        return f"torch-engine-{self.preset()}"

    def tokenizer(self, params: Mapping[str, Any]) -> str | None:
        return "byte"

    def startup_timeout_s(self) -> float:
        return self.options.startup_timeout_s

    def host(self) -> str:
        return self.options.host

    def gpus_needed(self, params: Mapping[str, Any]) -> int:
        return 1 if self.device() == "cuda" else 0

    # ------------------------------------------------------------------ command
    def engine_config(self, params: Mapping[str, Any]) -> EngineConfig:
        """The EngineConfig a trial runs, checked as the server will check it."""
        bad = sorted(set(params) & _TARGET_FIELDS)
        if bad:
            raise InfeasibleConfig(f"{bad} are target options (target.preset/device/weights/step_delay_ms), "
                                   "not parameters")
        fields = set(EngineConfig.__dataclass_fields__)
        unknown = sorted(set(params) - fields)
        if unknown:
            raise InfeasibleConfig(f"unknown engine knob(s) {unknown}; valid: {', '.join(sorted(fields))}")
        weights = self.weights_dir()
        knobs = {"cpu_threads": self.options.cpu_threads, **params}  # a tuned cpu_threads wins (as in argv)
        cfg = EngineConfig(preset=self.preset(), device=self.device(),
                           weights=str(weights) if weights else None, step_delay_ms=self.options.step_delay_ms,
                           **knobs)
        try:
            cfg.validate(self.device())
        except EngineConfigError as exc:
            raise InfeasibleConfig(str(exc)) from None
        return cfg

    def build_command(self, params: Mapping[str, Any], ctx: TrialContext, port: int
                      ) -> tuple[list[str], dict[str, str]]:
        values = dict(params)
        argv = [self.options.python or sys.executable, "-m", "tuner.engine.server",
                "--host", self.options.host, "--port", str(port),
                "--served-model-name", self.model_name(params),
                "--preset", self.preset(), "--device", self.device()]
        weights = self.weights_dir()
        if weights is not None:
            argv += ["--weights", str(weights)]
        if self.options.step_delay_ms > 0:
            argv += ["--step-delay-ms", str(self.options.step_delay_ms)]
        if self.options.step_log:
            argv += ["--step-log", str(step_log_path(ctx))]
        if self.options.cpu_threads is not None and "cpu_threads" not in values:
            values["cpu_threads"] = self.options.cpu_threads
        try:
            argv += to_argv(values)
        except EngineConfigError as exc:
            raise InfeasibleConfig(str(exc)) from None
        return argv, {}

    def check_space(self, space: SearchSpace) -> None:
        fields = set(EngineConfig.__dataclass_fields__) - _TARGET_FIELDS
        names = [p.name for p in space.params] + list(space.fixed)
        unknown = sorted(n for n in names if n not in fields)
        if unknown:
            raise ConfigError(f"search space names knob(s) the torch engine lacks: {unknown}; "
                              f"valid: {', '.join(sorted(fields))}", file=getattr(space, "source", None))
        # a value the engine refuses whatever the other knobs are would make every trial that draws it infeasible
        bad = [(field, why) for name, field, value in space.offered_values()
               if (why := knob_value_error(name, value)) is not None]
        if bad:
            field, why = bad[0]
            more = f" (and {len(bad) - 1} more value(s) the engine refuses)" if len(bad) > 1 else ""
            raise ConfigError(why + more, file=getattr(space, "source", None), field=field)

    @contextlib.contextmanager
    def deploy(self, params: Mapping[str, Any], ctx: TrialContext) -> Iterator[TorchEngineDeployment]:
        self.engine_config(params)  # a knob that cannot apply is infeasible before anything starts
        with super().deploy(params, ctx) as inner:
            yield TorchEngineDeployment(inner)

    def describe(self) -> dict[str, str]:
        import torch

        device = self.device()
        if device == "cuda" and _cuda_available():
            name = torch.cuda.get_device_name(0)
        else:
            name = f"cpu ({platform.processor() or platform.machine()})"
        mc = PRESETS[self.preset()]
        return {"kind": self.kind, "engine": "tuner.engine", "torch": torch.__version__, "device": device,
                "device_name": name, "preset": self.preset(), "params": f"{mc.param_count() / 1e6:.1f}M",
                "weights": str(self.weights_dir() or "random"),
                **({"step_delay_ms": str(self.options.step_delay_ms)} if self.options.step_delay_ms else {})}
