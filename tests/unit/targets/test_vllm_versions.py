"""The vllm target against the installed vLLM's own parser: parameters outside the 0.33 table, environment
parameters, the `mapping` option, and located errors naming the version when a parameter is missing.

The reader of the installed vLLM (which runs vLLM's interpreter) is replaced by a double passed in: an
argparse parser shaped like an older `vllm serve` that lacks some 0.33 flags. The real reader runs in
tests/integration/test_vllm_cpu.py against the real vLLM."""

from __future__ import annotations

import argparse
import contextlib
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tuner.errors import ConfigError
from tuner.search.space import parse_space
from tuner.targets.base import TrialContext
from tuner.targets.vllm import FLAGS, VllmOptions, VllmTarget, command_args, cpu_has_bf16, shebang_interpreter
from tuner.targets.vllm_cli import VllmCli
from tuner.targets.vllm_probe import describe

OLD_VERSION = "0.32.0+cpu"


def _old_parser() -> argparse.ArgumentParser:
    """`vllm serve` of an older release: no --performance-mode, no --max-num-active-seqs; a dtype list; a
    flag the 0.33 table never heard of (--cpu-offload-gb)."""
    p = argparse.ArgumentParser(prog="vllm serve")
    p.add_argument("model_tag", nargs="?")
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction)
    p.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction)
    p.add_argument("--block-size", type=int)
    p.add_argument("--dtype", choices=["auto", "bfloat16", "float32"])
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--disable-log-stats", action="store_true")
    p.add_argument("--cpu-offload-gb", type=float)
    return p


class Reader:
    """Stands for read_cli: answers from `_old_parser` and counts its calls."""

    def __init__(self, env: Sequence[str] = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND")) -> None:
        self.parser = _old_parser()
        self.env = env
        self.calls: list[tuple[str, list[list[str]]]] = []

    def __call__(self, python: str, argvs: Sequence[Sequence[str]], *, file: str | None = None) -> VllmCli:
        self.calls.append((python, [list(a) for a in argvs]))
        errors = []
        for argv in argvs:
            err = io.StringIO()
            try:
                with contextlib.redirect_stderr(err):
                    self.parser.parse_args(list(argv))
                errors.append(None)
            except SystemExit:
                errors.append(err.getvalue().strip().splitlines()[-1])
        return VllmCli.from_json({"version": OLD_VERSION, "actions": describe(self.parser), "env": list(self.env),
                                  "errors": errors})


def _target(tmp_path: Path, reader: Reader, **opts: Any) -> VllmTarget:
    opts.setdefault("model", "./m")
    opts.setdefault("python", "../venv/bin/python")
    opts.setdefault("device", "cpu")
    return VllmTarget(VllmOptions(**opts), agent_dir=tmp_path / "agents", cli_reader=reader)


def _space(params: dict[str, Any], **extra: Any) -> Any:
    return parse_space({"params": params, **extra}, file="space.yaml")


def test_a_parameter_the_installed_version_lacks_is_a_located_error_naming_it(tmp_path: Path) -> None:
    space = _space({"max_num_seqs": {"type": "int", "low": 1, "high": 64, "default": 8},
                    "performance_mode": {"type": "categorical", "choices": ["balanced", "throughput"],
                                         "default": "balanced"}})
    with pytest.raises(ConfigError) as ei:
        _target(tmp_path, Reader()).check_space(space)
    assert ei.value.file == "space.yaml" and ei.value.field == "params.performance_mode"
    assert f"vLLM {OLD_VERSION} has no --performance-mode" in str(ei.value)


def test_values_are_parsed_by_the_installed_parser_in_one_run(tmp_path: Path) -> None:
    reader = Reader()
    space = _space({"max_num_seqs": {"type": "int", "low": 1, "high": 64, "default": 8},
                    "dtype": {"type": "categorical", "choices": ["auto", "bfloat16", "half"], "default": "auto"}})
    with pytest.raises(ConfigError) as ei:
        _target(tmp_path, reader).check_space(space)
    assert ei.value.field == "params.dtype" and "invalid choice: 'half'" in str(ei.value)
    assert f"vLLM {OLD_VERSION} rejects" in str(ei.value)
    assert len(reader.calls) == 1  # interface and verdicts from one run of vLLM's interpreter
    python, argvs = reader.calls[0]
    assert python == str(tmp_path / "venv" / "bin" / "python")  # relative to the agent file
    assert argvs[0] == [str((tmp_path / "agents" / "m").resolve()), "--max-num-seqs", "8", "--dtype", "auto"]


def test_parameters_outside_the_table_map_to_the_installed_parser(tmp_path: Path) -> None:
    assert "cpu_offload_gb" not in FLAGS
    reader = Reader()
    t = _target(tmp_path, reader)
    space = _space({"cpu_offload_gb": {"type": "float", "low": 0, "high": 2, "default": 0},
                    "enforce_eager": {"type": "bool", "default": False}})
    t.check_space(space)
    argv, env = t.build_command({"cpu_offload_gb": 1.5, "enforce_eager": True}, TrialContext(0, tmp_path), 8001)
    assert argv[-3:] == ["--cpu-offload-gb", "1.5", "--enforce-eager"] and env == {}
    with pytest.raises(ConfigError, match="unknown vLLM parameter 'swap_space'"):
        t.check_space(_space({"swap_space": {"type": "int", "low": 0, "high": 4, "default": 1}}))


def test_environment_parameters(tmp_path: Path) -> None:
    args, env = command_args({"cpu_kvcache_space_gib": 2, "cpu_omp_threads_bind": "0-1", "max_num_seqs": 4})
    assert args == ["--max-num-seqs", "4"]
    assert env == {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": "0-1"}
    t = _target(tmp_path, Reader(), env={"VLLM_LOGGING_LEVEL": "INFO"},
                mapping={"reserved_cores": "env:VLLM_CPU_NUM_OF_RESERVED_CPU", "offload": "--cpu-offload-gb"})
    argv, env = t.build_command({"cpu_kvcache_space_gib": 1, "reserved_cores": 1, "offload": 0.5},
                                TrialContext(0, tmp_path), 8001)
    assert env == {"VLLM_LOGGING_LEVEL": "INFO", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}
    assert argv[-2:] == ["--cpu-offload-gb", "0.5"]
    assert argv[:3] == [str(tmp_path / "venv" / "bin" / "python"), "-m", "vllm.entrypoints.cli.main"]
    # an environment variable the installed vLLM does not read is a located error naming the version
    space = _space({"cpu_kvcache_space_gib": {"type": "int", "low": 1, "high": 4, "default": 1},
                    "reserved_cores": {"type": "int", "low": 0, "high": 1, "default": 0}})
    with pytest.raises(ConfigError) as ei:
        t.check_space(space)
    assert ei.value.field == "params.reserved_cores"
    assert f"vLLM {OLD_VERSION} has no environment variable VLLM_CPU_NUM_OF_RESERVED_CPU" in str(ei.value)
    # the same variable from the env option and a parameter is refused
    t2 = _target(tmp_path, Reader(), env={"VLLM_CPU_KVCACHE_SPACE": "4"})
    with pytest.raises(ConfigError, match="VLLM_CPU_KVCACHE_SPACE"):
        t2.check_space(_space({"cpu_kvcache_space_gib": {"type": "int", "low": 1, "high": 4, "default": 1}}))
    with pytest.raises(ConfigError, match="must be >= 1"):
        _target(tmp_path, Reader()).check_space(
            _space({"cpu_kvcache_space_gib": {"type": "int", "low": 0, "high": 4, "default": 1}}))


def test_mapping_spellings_are_checked_at_load() -> None:
    for bad in ("max-num-seqs", "env:1BAD", "--swap-space", "env:"):
        with pytest.raises(ValueError):
            VllmOptions(model="m", mapping={"x": bad})


def test_a_missing_interpreter_is_a_located_error(tmp_path: Path) -> None:
    from tuner.targets.vllm_cli import read_cli

    t = VllmTarget(VllmOptions(model="m", python="../nowhere/bin/python"), agent_dir=tmp_path, cli_reader=read_cli)
    with pytest.raises(ConfigError) as ei:
        t.check_space(_space({"max_num_seqs": {"type": "int", "low": 1, "high": 4, "default": 1}}))
    assert ei.value.field == "target.python" and "make vllm-cpu" in str(ei.value)


def test_cpu_device_claims_no_gpu_and_reports_cpu_facts(tmp_path: Path) -> None:
    t = _target(tmp_path, Reader())
    assert t.gpus_needed({"tensor_parallel_size": 1}) == 0
    facts = t.facts()
    assert facts["cpu_cores"] >= 1 and isinstance(facts["cpu_bf16"], bool)
    assert cpu_has_bf16("processor: 0\nflags\t\t: fpu avx512f avx512_bf16\n")
    assert not cpu_has_bf16("processor: 0\nflags\t\t: fpu avx2\n")


def test_the_interpreter_of_a_vllm_script(tmp_path: Path) -> None:
    script = tmp_path / "vllm"
    script.write_text("#!/opt/venv/bin/python3\nimport sys\n")
    assert shebang_interpreter(str(script)) == "/opt/venv/bin/python3"
    script.write_text("no shebang\n")
    assert shebang_interpreter(str(script)) is None
    assert shebang_interpreter(str(tmp_path / "missing")) is None
