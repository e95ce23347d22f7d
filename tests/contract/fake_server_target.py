"""A second command-like target, written by following docs/ARCHITECTURE.md ("A target"): a ProcessTarget
subclass that only builds its argv. It serves the fake OpenAI server of tests/support (whose latencies are
its knobs), so the contract suite runs a target defined outside the tuner package. A real one would live in
tuner/targets/<kind>.py and be registered in tuner/targets/registry.py; this one is passed in."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from tuner.errors import ConfigError
from tuner.search.space import SearchSpace
from tuner.targets.base import TrialContext
from tuner.targets.process import ProcessTarget

FAKE = Path(__file__).resolve().parents[1] / "support" / "fake_openai_server.py"
KNOBS = {"ttft_ms": "--ttft-ms", "itl_ms": "--itl-ms"}


class FakeServerOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    model: str = "fake"
    startup_timeout_s: float = 60.0


class FakeServerTarget(ProcessTarget):
    kind = "fake_server"
    Options = FakeServerOptions
    options: FakeServerOptions

    def build_command(self, params: Mapping[str, Any], ctx: TrialContext, port: int
                      ) -> tuple[list[str], dict[str, str]]:
        argv = [sys.executable, str(FAKE), "--port", str(port), "--model", self.options.model]
        for name, flag in KNOBS.items():
            if name in params:
                argv += [flag, str(params[name])]
        return argv, {}

    def model_name(self, params: Mapping[str, Any]) -> str:
        return self.options.model

    def startup_timeout_s(self) -> float:
        return self.options.startup_timeout_s

    def describe(self) -> dict[str, str]:
        return {"kind": self.kind, "server": FAKE.name, "model": self.options.model}

    def check_space(self, space: SearchSpace) -> None:
        unknown = sorted(p.name for p in space.params if p.name not in KNOBS)
        if unknown:
            raise ConfigError(f"the fake server has no knob(s) {unknown}; valid: {sorted(KNOBS)}")
