"""Review: a search space may tune cpu_threads even when the target option sets a default for it."""

from __future__ import annotations

from pathlib import Path

import pytest

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


def test_step_log_option_gives_the_engine_a_log_per_trial_and_is_no_parameter(tmp_path: Path) -> None:
    from tuner.errors import InfeasibleConfig
    from tuner.targets.torch_engine import step_log_path

    ctx = TrialContext(trial_number=4, state_dir=tmp_path)
    on = TorchEngineTarget(TorchEngineOptions(device="cpu", preset="tiny", step_log=True), agent_dir=tmp_path)
    argv, _ = on.build_command({}, ctx, 8000)
    assert argv[argv.index("--step-log") + 1] == str(step_log_path(ctx)) == str(tmp_path / "logs/trial-4.steps.jsonl")
    off = TorchEngineTarget(TorchEngineOptions(device="cpu", preset="tiny"), agent_dir=tmp_path)
    assert "--step-log" not in off.build_command({}, ctx, 8000)[0]
    with pytest.raises(InfeasibleConfig, match="target option"):
        off.engine_config({"step_log": "x"})  # a target option, not a parameter
