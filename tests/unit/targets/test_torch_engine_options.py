"""Review: a search space may tune cpu_threads even when the target option sets a default for it."""

from __future__ import annotations

from pathlib import Path

from tuner.targets.base import TrialContext
from tuner.targets.torch_engine import TorchEngineOptions, TorchEngineTarget


def test_cpu_threads_param_overrides_the_option(tmp_path: Path) -> None:
    target = TorchEngineTarget(TorchEngineOptions(device="cpu", preset="tiny", cpu_threads=1), agent_dir=tmp_path)
    cfg = target.engine_config({"cpu_threads": 2})
    assert cfg.cpu_threads == 2
    argv, _ = target.build_command({"cpu_threads": 2}, TrialContext(trial_number=0, state_dir=tmp_path), 8000)
    assert argv[argv.index("--cpu-threads") + 1] == "2"


def test_cpu_threads_option_applies_without_param(tmp_path: Path) -> None:
    target = TorchEngineTarget(TorchEngineOptions(device="cpu", preset="tiny", cpu_threads=3), agent_dir=tmp_path)
    assert target.engine_config({}).cpu_threads == 3
