"""The command target (kind `command`): any OpenAI-compatible server started from an argument-list template.

    target:
      kind: command
      command: ["{python}", "server.py", "--port", "{port}", "--batch", "{max_batch}", "--gpus={gpus}"]
      model: my-model
      gpus_per_trial: 1            # or the name of a parameter that gives it, e.g. tensor_parallel_size

Each template element becomes exactly one argument after substitution; nothing is re-split or read by a
shell. Placeholders: {port} (a free port), {gpus} (the claimed GPU ids, comma-separated), {host}, {model},
{python} (the tuner's interpreter) and {<param>} for any parameter or fixed value of the search space.
`{{` and `}}` are literal braces. Relative paths in the template are relative to the agent file's folder
(the server's working directory).

Parameters may instead map to optional flags, appended after the template:

      flags:
        max_num_seqs: --max-num-seqs                  # --max-num-seqs 256; absent at the space's default or null
        enable_prefix_caching: {flag: --enable-prefix-caching, style: pair}   # --x / --no-x
        enforce_eager: {flag: --enforce-eager, style: switch}                 # --x when true, absent when false

A flag is left out when its parameter is null, not set in the trial (a `when` that is false), or at the
search space's default (`omit_default: false` passes it anyway), so the baseline can be the server's own
defaults with no knob passed. Styles: `separate` (`--flag VALUE`), `equals` (`--flag=VALUE`), `switch`,
`pair` (`--flag` / `--no-flag`, or `negative:`); `auto` (the default) is `switch` for booleans, else
`separate`.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tuner.errors import ConfigError, InfeasibleConfig
from tuner.search.space import SearchSpace
from tuner.spec import MAX_GPUS, MAX_TRIAL_S
from tuner.targets.base import TrialContext
from tuner.targets.process import ProcessTarget

_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}|\{|\}")
BUILTIN_PLACEHOLDERS = ("port", "gpus", "host", "model", "python")


def placeholders(element: str) -> list[str]:
    """The names an element refers to. Raises ValueError on a stray brace or an unnamed placeholder."""
    names = []
    for m in _PLACEHOLDER.finditer(element):
        tok = m.group(0)
        if tok in ("{{", "}}"):
            continue
        if m.group(1) is None:
            raise ValueError(f"stray {tok!r} in {element!r} (write {{{{ or }}}} for a literal brace, "
                             "or {name} for a placeholder)")
        names.append(m.group(1))
    return names


def render(element: str, values: Mapping[str, str]) -> str:
    """Substitute placeholders in one element; KeyError names a missing value."""
    def sub(m: re.Match[str]) -> str:
        tok = m.group(0)
        if tok == "{{":
            return "{"
        if tok == "}}":
            return "}"
        return values[m.group(1)]

    return _PLACEHOLDER.sub(sub, element)


def fmt_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


class FlagSpec(BaseModel):
    """How one parameter becomes an optional command-line flag."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    flag: str = Field(pattern=r"^-{1,2}[A-Za-z0-9][A-Za-z0-9_.-]*$", description="e.g. --max-num-seqs")
    style: Literal["auto", "separate", "equals", "switch", "pair"] = "auto"
    negative: str | None = Field(default=None, pattern=r"^-{1,2}[A-Za-z0-9][A-Za-z0-9_.-]*$",
                                 description="style pair: the false form (default --no-<flag>)")
    omit_default: bool = Field(default=True, description="leave the flag out at the search space's default")

    def args(self, value: Any, default: Any, has_default: bool) -> list[str]:
        """The arguments for `value` (none when the flag is left out)."""
        if value is None or (self.omit_default and has_default and value == default
                             and type(value) is type(default)):
            return []
        style = self.style
        if style == "auto":
            style = "switch" if isinstance(value, bool) else "separate"
        if style in ("switch", "pair"):
            if not isinstance(value, bool):
                raise InfeasibleConfig(f"flag {self.flag} ({style}) needs a true/false value, got {value!r}")
            if value:
                return [self.flag]
            if style == "switch":
                return []
            return [self.negative or "--no-" + self.flag.lstrip("-")]
        if style == "equals":
            return [f"{self.flag}={fmt_value(value)}"]
        return [self.flag, fmt_value(value)]


class CommandOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    command: list[str] = Field(min_length=1, description="argument-list template, one element per argument")
    model: str = Field(default="default", description="the model name requests carry")
    host: str = "127.0.0.1"
    health_path: str = "/health"
    metrics_path: str | None = Field(default=None, description="Prometheus endpoint to scrape, if any")
    startup_timeout_s: float = Field(default=300.0, gt=0, le=MAX_TRIAL_S)
    env: dict[str, str] = Field(default_factory=dict)
    gpus_per_trial: int | str = Field(default=0, description="GPUs per trial, or a parameter giving it")
    tokenizer: str | None = Field(default=None, description='"byte" or a local tokenizer dir')
    flags: dict[str, FlagSpec] = Field(default_factory=dict, description="parameter -> optional flag")

    @field_validator("flags", mode="before")
    @classmethod
    def _flag_shorthand(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {k: ({"flag": x} if isinstance(x, str) else x) for k, x in v.items()}
        return v

    @field_validator("command")
    @classmethod
    def _template(cls, v: list[str]) -> list[str]:
        for el in v:
            placeholders(el)  # raises ValueError on a malformed element
        if "port" not in {n for el in v for n in placeholders(el)}:
            raise ValueError("the command must pass {port} to the server (the tuner picks a free port)")
        return v

    @model_validator(mode="after")
    def _flags_apart(self) -> CommandOptions:
        both = sorted(set(self.flags) & {n for el in self.command for n in placeholders(el)})
        if both:
            raise ValueError(f"parameter(s) {both} are both in the command template and in flags: use one")
        return self

    @field_validator("health_path", "metrics_path")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError(f"must start with / (got {v!r})")
        return v

    @field_validator("gpus_per_trial")
    @classmethod
    def _gpus(cls, v: int | str) -> int | str:
        if isinstance(v, int) and not 0 <= v <= MAX_GPUS:
            raise ValueError(f"must be between 0 and {MAX_GPUS} (got {v})")
        return v


class CommandTarget(ProcessTarget):
    kind = "command"
    Options = CommandOptions

    options: CommandOptions

    def __init__(self, options: BaseModel, *, agent_dir: Path) -> None:
        super().__init__(options, agent_dir=agent_dir)
        assert isinstance(options, CommandOptions)
        self.health_path = options.health_path
        self.metrics_path = options.metrics_path
        self.defaults: dict[str, Any] = {}  # the search space's defaults (check_space), for omit_default

    def template_names(self) -> set[str]:
        return {n for el in self.options.command for n in placeholders(el)} - set(BUILTIN_PLACEHOLDERS)

    def build_command(self, params: Mapping[str, Any], ctx: TrialContext, port: int
                      ) -> tuple[list[str], dict[str, str]]:
        values = {k: fmt_value(v) for k, v in params.items()}
        values.update(port=str(port), gpus=",".join(str(g) for g in ctx.gpus), host=self.options.host,
                      model=self.options.model, python=sys.executable)
        argv = []
        for el in self.options.command:
            try:
                argv.append(render(el, values))
            except KeyError as exc:
                raise InfeasibleConfig(f"command element {el!r} needs {exc.args[0]!r}, which this trial "
                                       "does not set") from None
        for name, flag in self.options.flags.items():
            argv += flag.args(params.get(name), self.defaults.get(name), name in self.defaults)
        return argv, dict(self.options.env)

    def model_name(self, params: Mapping[str, Any]) -> str:
        return self.options.model

    def describe(self) -> dict[str, str]:
        return {"kind": self.kind, "command": shlex.join(self.options.command)[:500], "model": self.options.model}

    def tokenizer(self, params: Mapping[str, Any]) -> str | None:
        return self.options.tokenizer

    def server_cwd(self) -> Path | None:
        return self.agent_dir

    def gpus_needed(self, params: Mapping[str, Any]) -> int:
        g = self.options.gpus_per_trial
        if isinstance(g, int):
            return g
        v = params.get(g)
        if v is None:
            raise InfeasibleConfig(f"gpus_per_trial names {g!r}, which this trial does not set")
        return int(v)

    def check_space(self, space: SearchSpace) -> None:
        file = getattr(space, "source", None)
        fixed = dict(getattr(space, "fixed", {}))
        names = {p.name for p in space.params} | set(fixed)
        self.defaults = {p.name: p.default for p in space.params}
        flagged = set(self.options.flags)
        unknown_flags = sorted(flagged - names)
        if unknown_flags:
            raise ConfigError(f"flags name unknown parameter(s) {unknown_flags}; the space has {sorted(names)}",
                              field=f"target.flags.{unknown_flags[0]}")
        used = self.template_names()
        unknown = used - names
        if unknown:
            raise ConfigError(f"command template names unknown parameter(s) {sorted(unknown)}; the space has "
                              f"{sorted(names)} and the built-ins are {list(BUILTIN_PLACEHOLDERS)}",
                              field="target.command")
        unused = [p.name for p in space.params if p.name not in used and p.name not in flagged]
        g = self.options.gpus_per_trial
        if isinstance(g, str):
            if g not in names:
                raise ConfigError(f"gpus_per_trial names {g!r}, which is not a parameter of the space "
                                  f"(valid: {sorted(names)})", field="target.gpus_per_trial")
            unused = [n for n in unused if n != g]
        if unused:
            raise ConfigError(f"parameter(s) {unused} are not passed to the server: add {{name}} to the command "
                              f"template (it uses {sorted(used) or 'none'}) or map it in flags", file=file,
                              field=f"params.{unused[0]}")
        conditional = [p.name for p in space.params if p.when is not None and p.name in used]
        if conditional:
            raise ConfigError(f"parameter(s) {conditional} have a `when` condition, but a command template "
                              "needs a value for every placeholder in every trial (map it in flags: a flag is "
                              "left out when its parameter is not set)", file=file,
                              field=f"params.{conditional[0]}")
