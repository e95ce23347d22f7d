"""Target kinds by name. Modules are imported lazily; an unknown kind lists the valid ones."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from tuner.base.yamlio import Loc, line_of, pydantic_to_config_error
from tuner.errors import ConfigError

if TYPE_CHECKING:
    from tuner.spec import TargetSpec
    from tuner.targets.base import Target

TARGETS: dict[str, str] = {
    "sim": "tuner.targets.sim:SimTarget",
    "torch_engine": "tuner.targets.torch_engine:TorchEngineTarget",
    "vllm": "tuner.targets.vllm:VllmTarget",
    "command": "tuner.targets.command:CommandTarget",
}


def target_class(kind: str) -> type[Target]:
    if kind not in TARGETS:
        raise ConfigError(f"unknown target kind {kind!r}; valid kinds: {', '.join(sorted(TARGETS))}")
    module, _, name = TARGETS[kind].partition(":")
    cls: type[Target] = getattr(importlib.import_module(module), name)
    return cls


def validate_target_options(spec: TargetSpec, *, file: str, lines: dict[Loc, int]) -> BaseModel:
    try:
        cls = target_class(spec.kind)
    except ConfigError as exc:
        raise ConfigError(exc.raw_message, file=file, line=line_of(lines, ("target", "kind")),
                          field="target.kind") from None
    try:
        return cls.Options.model_validate(spec.options)
    except ValidationError as exc:
        raise pydantic_to_config_error(exc, file, lines, prefix=("target",)) from None


def make_target(kind: str, options: BaseModel, agent_dir: Path, **extra: Any) -> Target:
    return target_class(kind)(options, agent_dir=agent_dir, **extra)
