"""The Target seam: deploy(params, ctx) -> Deployment (a context manager whose teardown always runs)."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel

from tuner.measure.measurement import Measurement
from tuner.search.space import SearchSpace
from tuner.spec import WorkloadSpec


@dataclass
class TrialContext:
    """What a deployment needs to know about the trial it serves."""

    trial_number: int
    state_dir: Path
    gpus: tuple[int, ...] = ()
    seed: int = 0
    stop_event: threading.Event = field(default_factory=threading.Event)
    label: str = ""  # e.g. "trial-7" or "verify-champion-2": names the log file
    # tuner.measure.early_stop.EarlyStopRule: a measure() stops once its partial measurement breaks an SLO by
    # far (Measurement.early_stop says why); None: every run goes to its end
    early_stop: Any = None

    @property
    def log_dir(self) -> Path:
        d = self.state_dir / "logs"
        d.mkdir(parents=True, exist_ok=True)
        return d

    @property
    def log_name(self) -> str:
        return self.label or f"trial-{self.trial_number}"


class Deployment(ABC):
    """A running configuration. Used inside `with target.deploy(...) as dep:`."""

    cold_start_s: float = 0.0
    endpoint: str | None = None  # base URL for HTTP deployments
    log_path: Path | None = None

    @abstractmethod
    def measure(self, workload: WorkloadSpec, *, goodput_ms: Mapping[str, float], seed: int) -> Measurement:
        """Drive the workload against this deployment and summarise it."""

    def quality_probe(self) -> list[list[int]] | None:
        """Greedy token ids for the target's fixed probe prompts, or None if unsupported."""
        return None


class Target(ABC):
    """A kind of serving stack. Options are validated by the class's `Options` model at load time."""

    kind: ClassVar[str]
    Options: ClassVar[type[BaseModel]]

    def __init__(self, options: BaseModel, *, agent_dir: Path) -> None:
        self.options = options
        self.agent_dir = agent_dir

    @abstractmethod
    def deploy(self, params: Mapping[str, Any], ctx: TrialContext) -> AbstractContextManager[Deployment]:
        """Start the configuration; teardown on exit is idempotent and kills everything it started."""

    def describe(self) -> dict[str, str]:
        """Engine version and hardware, for MLflow tags and for detecting a changed target."""
        return {"kind": self.kind}

    def facts(self) -> dict[str, Any]:
        """Facts about the host for the search space's conditions (e.g. {"device": "cpu"})."""
        return {}

    def gpus_needed(self, params: Mapping[str, Any]) -> int:
        """How many GPUs of the pool a trial with these params claims (0: none)."""
        return 0

    def gpus_available(self) -> int | None:
        """How many GPUs a single trial can be given at most (None: not known; nothing is bounded)."""
        return None

    def resource_violations(self, params: Mapping[str, Any]) -> list[str]:
        """What the full configuration `params` needs beyond this target's real resources (GPUs, memory), one
        sentence each; [] when it fits. The search space checks it wherever it checks the declared constraints
        (SearchSpace.bind_resources), so no design point or proposal asks for more than the target has."""
        have = self.gpus_available()
        need = self.gpus_needed(params)
        if have is not None and need > have:
            return [f"needs {need} GPUs, the target has {have}"]
        return []

    def check_space(self, space: SearchSpace) -> None:
        """Raise ConfigError if the search space names a knob this target cannot apply."""

    def command_preview(self, params: Mapping[str, Any], ctx: TrialContext) -> tuple[list[str], dict[str, str]] | None:
        """The argv and extra environment a deployment of `params` would launch, if it launches one."""
        return None


