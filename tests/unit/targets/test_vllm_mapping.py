"""The vLLM 0.33 mapping: every parameter of search_spaces/vllm.yaml, dotted -cc keys, boolean negations,
no removed flag ever, every setting at most once, located errors."""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

import pytest

from tuner.agent import load_agent, show_command
from tuner.errors import ConfigError, InfeasibleConfig
from tuner.search.space import load_space, parse_space
from tuner.targets.base import TrialContext
from tuner.targets.vllm import (
    FLAGS,
    REMOVED_FLAGS,
    VllmOptions,
    VllmTarget,
    engine_args,
    flag_args,
    setting_of,
)

REPO = Path(__file__).resolve().parents[3]
SPACE = REPO / "search_spaces" / "vllm.yaml"
AGENTS = sorted((REPO / "agents").glob("vllm-8xa100*.yaml"))

# Expected argv for each parameter of search_spaces/vllm.yaml, for every value the space can take
# (ranges: a few values). Adding a parameter to the space without a row here fails test_every_space_param_...
EXPECTED: dict[str, list[tuple[Any, list[str]]]] = {
    "performance_mode": [("balanced", ["--performance-mode", "balanced"]),
                         ("interactivity", ["--performance-mode", "interactivity"]),
                         ("throughput", ["--performance-mode", "throughput"])],
    "max_num_seqs": [(16, ["--max-num-seqs", "16"]), (256, ["--max-num-seqs", "256"]),
                     (1024, ["--max-num-seqs", "1024"])],
    "max_num_batched_tokens": [(512, ["--max-num-batched-tokens", "512"]),
                               (2048, ["--max-num-batched-tokens", "2048"]),
                               (32768, ["--max-num-batched-tokens", "32768"])],
    "gpu_memory_utilization": [(0.8, ["--gpu-memory-utilization", "0.8"]),
                               (0.92, ["--gpu-memory-utilization", "0.92"]),
                               (0.96, ["--gpu-memory-utilization", "0.96"])],
    "cudagraph_mode": [(m, [f"-cc.cudagraph_mode={m}"])
                       for m in ("NONE", "PIECEWISE", "FULL_DECODE_ONLY", "FULL", "FULL_AND_PIECEWISE")],
    "max_cudagraph_capture_size": [(n, [f"-cc.max_cudagraph_capture_size={n}"])
                                   for n in (32, 64, 128, 256, 512, 1024)],
    "enable_chunked_prefill": [(True, ["--enable-chunked-prefill"]), (False, ["--no-enable-chunked-prefill"])],
    "long_prefill_token_threshold": [(n, ["--long-prefill-token-threshold", str(n)])
                                     for n in (0, 256, 512, 1024, 2048, 4096)],
    "enable_prefix_caching": [(True, ["--enable-prefix-caching"]), (False, ["--no-enable-prefix-caching"])],
    "block_size": [(n, ["--block-size", str(n)]) for n in (8, 16, 32)],
    "kv_cache_dtype": [(d, ["--kv-cache-dtype", d]) for d in ("auto", "fp8", "fp8_e5m2")],
    "async_scheduling": [(True, ["--async-scheduling"]), (False, ["--no-async-scheduling"])],
    "scheduling_policy": [("fcfs", ["--scheduling-policy", "fcfs"]), ("priority", ["--scheduling-policy", "priority"])],
    "tensor_parallel_size": [(n, ["--tensor-parallel-size", str(n)]) for n in (1, 2, 4, 8)],
    "data_parallel_size": [(n, ["--data-parallel-size", str(n)]) for n in (1, 2, 4, 8)],
}


def target(tmp_path: Path | None = None, **opts: Any) -> VllmTarget:
    opts.setdefault("model", "meta-llama/Llama-3.1-8B-Instruct")
    return VllmTarget(VllmOptions(**opts), agent_dir=tmp_path or REPO / "agents")


def test_every_space_param_is_in_the_flag_table_and_has_expected_rows() -> None:
    space = load_space(SPACE)
    names = [p.name for p in space.params]
    assert set(names) <= set(FLAGS)
    assert set(names) == set(EXPECTED), "every parameter of the space needs expected argv rows"
    for p in space.params:  # the rows cover every choice the space offers
        if p.spec.type in ("categorical", "bool"):
            assert {v for v, _ in EXPECTED[p.name]} == set(p.grid()), p.name


@pytest.mark.parametrize(("name", "value", "argv"),
                         [(n, v, a) for n, rows in EXPECTED.items() for v, a in rows])
def test_mapping_of_each_value(name: str, value: Any, argv: list[str]) -> None:
    assert flag_args(FLAGS[name], value) == argv
    assert engine_args({name: value}) == argv


def test_table_spellings() -> None:
    assert flag_args(FLAGS["optimization_level"], 3) == ["-O", "3"]
    assert flag_args(FLAGS["enforce_eager"], False) == ["--no-enforce-eager"]
    assert flag_args(FLAGS["disable_log_stats"], True) == ["--disable-log-stats"]
    assert flag_args(FLAGS["disable_log_stats"], False) == []
    assert flag_args(FLAGS["compilation_mode"], 3) == ["-cc.mode=3"]
    assert flag_args(FLAGS["cudagraph_mode"], "full_decode_only") == ["-cc.cudagraph_mode=FULL_DECODE_ONLY"]
    assert flag_args(FLAGS["max_model_len"], "auto") == ["--max-model-len", "auto"]
    assert flag_args(FLAGS["max_num_seqs"], None) == []  # None: vLLM's own default
    for f in FLAGS.values():  # no table row spells a removed flag
        assert f"--{f.setting}" not in REMOVED_FLAGS


def test_bad_values_are_infeasible() -> None:
    with pytest.raises(InfeasibleConfig, match="block_size"):
        flag_args(FLAGS["block_size"], 0)
    with pytest.raises(InfeasibleConfig, match="not one of"):
        flag_args(FLAGS["kv_cache_dtype"], "int3")
    with pytest.raises(InfeasibleConfig, match="true or false"):
        flag_args(FLAGS["enable_prefix_caching"], "yes")
    with pytest.raises(InfeasibleConfig, match="integer"):
        flag_args(FLAGS["max_num_seqs"], 2.5)


def _random_config(space: Any, rng: random.Random) -> dict[str, Any]:
    chosen: dict[str, Any] = {}
    for p in space.params:
        if not space.active(p, chosen):
            continue
        s = p.spec
        if s.type in ("categorical", "bool"):
            chosen[p.name] = rng.choice(p.grid())
        elif s.type == "int":
            chosen[p.name] = rng.randint(int(s.low), int(s.high))
        else:
            chosen[p.name] = round(rng.uniform(s.low, s.high), 2)
    return space.full_config(chosen)


def test_no_removed_flag_and_no_setting_twice_over_many_samples() -> None:
    space = load_space(SPACE)
    rng = random.Random(0)
    emitted = 0
    extra = ["--max-model-len", "4096", "--dtype", "bfloat16"]
    for _ in range(500):
        cfg = _random_config(space, rng)
        try:
            argv = engine_args(cfg, extra)
        except InfeasibleConfig:
            continue
        emitted += 1
        settings = [st for a in argv if (st := setting_of(a)) is not None]
        assert len(settings) == len(set(settings)), argv
        for a in argv:
            name = "--" + a.lstrip("-").split("=", 1)[0]
            assert name not in REMOVED_FLAGS, a
        for a in argv:  # compilation settings only ever through the dotted -cc form
            assert not a.startswith(("--max-cudagraph-capture-size", "--cudagraph-capture-sizes",
                                     "--compilation-config"))
    assert emitted > 400


def test_conflicting_settings_are_infeasible() -> None:
    with pytest.raises(InfeasibleConfig, match="enforce_eager"):
        engine_args({"enforce_eager": True, "cudagraph_mode": "FULL"})
    with pytest.raises(InfeasibleConfig, match="-O 0"):
        engine_args({"optimization_level": 0, "cudagraph_mode": "PIECEWISE"})
    with pytest.raises(InfeasibleConfig, match="max_num_batched_tokens"):
        engine_args({"max_num_seqs": 512, "max_num_batched_tokens": 256})
    with pytest.raises(InfeasibleConfig, match="kv_cache_memory_bytes"):
        engine_args({"kv_cache_memory_bytes": 10**10, "gpu_memory_utilization": 0.9})
    # -O with a compatible explicit cudagraph_mode is allowed (the level only fills unset values)
    assert engine_args({"optimization_level": 3, "cudagraph_mode": "FULL_DECODE_ONLY"}) == [
        "-O", "3", "-cc.cudagraph_mode=FULL_DECODE_ONLY"]


def test_same_setting_from_params_and_extra_args_is_refused() -> None:
    for extra in (["--max-cudagraph-capture-size", "256"], ["--compilation-config.max_cudagraph_capture_size=256"],
                  ["-cc.max_cudagraph_capture_size=256"]):
        with pytest.raises(ConfigError, match="already sets"):
            engine_args({"max_cudagraph_capture_size": 512}, extra)
    with pytest.raises(ConfigError, match="already sets"):
        engine_args({"tensor_parallel_size": 2}, ["-tp", "4"])
    with pytest.raises(ConfigError, match="already sets"):
        engine_args({"enable_prefix_caching": True}, ["--no-enable-prefix-caching"])


@pytest.mark.parametrize("flag", sorted(REMOVED_FLAGS))
def test_removed_flags_are_refused_in_extra_args(flag: str) -> None:
    with pytest.raises(ValueError, match="removed in vLLM 0.33"):
        VllmOptions(model="m", extra_args=[flag, "1"])


def test_extra_args_may_not_repeat_a_setting_or_set_the_port() -> None:
    with pytest.raises(ValueError, match="second time"):
        VllmOptions(model="m", extra_args=["-O3", "--optimization-level", "2"])
    with pytest.raises(ValueError, match="set by the tuner"):
        VllmOptions(model="m", extra_args=["--port", "9000"])
    with pytest.raises(ValueError, match="removed"):
        VllmOptions(model="m", extra_args=["-cc.level=3"])


def test_removed_flag_in_agent_is_a_located_config_error(tmp_path: Path) -> None:
    text = (REPO / "agents" / "vllm-8xa100.yaml").read_text().replace(
        'extra_args: ["--max-model-len", "4096", "--dtype", "bfloat16"]',
        'extra_args: ["--swap-space", "4"]')
    assert "--swap-space" in text
    (tmp_path / "agents").mkdir()
    p = tmp_path / "agents" / "a.yaml"
    p.write_text(text.replace("../search_spaces/vllm.yaml", str(SPACE)))
    with pytest.raises(ConfigError) as ei:
        load_agent(p)
    msg = str(ei.value)
    assert "--swap-space was removed in vLLM 0.33" in msg
    assert ei.value.line is not None and "extra_args" in text.splitlines()[ei.value.line - 1]


def test_unknown_parameter_is_a_config_error_listing_valid_ones() -> None:
    space = parse_space({"params": {"swap_space": {"type": "int", "low": 0, "high": 8, "default": 4}}},
                        file="space.yaml")
    with pytest.raises(ConfigError) as ei:
        target().check_space(space)
    msg = str(ei.value)
    assert "space.yaml" in msg and "'swap_space'" in msg and "removed in vLLM 0.33" in msg
    assert "max_num_seqs" in msg and "cudagraph_mode" in msg  # the valid names are listed
    space2 = parse_space({"params": {"max_num_seqz": {"type": "int", "low": 1, "high": 8, "default": 4}}},
                         file="s2.yaml")
    with pytest.raises(ConfigError, match="unknown vLLM parameter 'max_num_seqz'"):
        target().check_space(space2)


def test_check_space_accepts_the_shipped_space_and_refuses_a_clash_with_extra_args() -> None:
    space = load_space(SPACE)
    target(extra_args=["--max-model-len", "4096"]).check_space(space)
    with pytest.raises(ConfigError, match="also sets"):
        target(extra_args=["--max-cudagraph-capture-size", "128"]).check_space(space)


class _MiniVllmParser(argparse.ArgumentParser):
    """An argparse parser shaped like `vllm serve`'s, with -cc dotted keys, but missing some flags."""

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        out = []
        for a in args or []:
            out += (["--compilation-config", a[4:]] if a.startswith("-cc.") else
                    ["--optimization-level"] if a == "-O" else [a])
        return super().parse_args(out, namespace)


def _mini_parser(omit: str = "", choices: dict[str, list[str]] | None = None) -> argparse.ArgumentParser:
    p = _MiniVllmParser(prog="vllm serve", exit_on_error=True)
    p.add_argument("model_tag", nargs="?")
    for f in FLAGS.values():
        if f.name == omit or f.kind in ("cc", "env"):
            continue
        if f.kind == "bool":
            p.add_argument(f.flag, action=argparse.BooleanOptionalAction)
        elif f.kind == "store_true":
            p.add_argument(f.flag, action="store_true")
        elif f.kind == "opt_level":
            p.add_argument("--optimization-level", type=int)
        else:
            p.add_argument(f.flag, choices=(choices or {}).get(f.name))
    p.add_argument("--compilation-config", action="append")
    return p


def test_check_against_a_parser_locates_the_rejected_parameter() -> None:
    space = load_space(SPACE)
    t = target()
    t.check_against_parser(space, _mini_parser())  # a parser that knows every flag: fine
    with pytest.raises(ConfigError) as ei:
        t.check_against_parser(space, _mini_parser(omit="scheduling_policy"), label="vLLM 9.9")
    assert ei.value.field == "params.(baseline)"  # the baseline already uses --scheduling-policy
    assert "vLLM 9.9 rejects" in str(ei.value) and "unrecognized arguments: --scheduling-policy" in str(ei.value)
    with pytest.raises(ConfigError) as ei:
        t.check_against_parser(space, _mini_parser(choices={"kv_cache_dtype": ["auto", "fp8"]}))
    assert ei.value.field == "params.kv_cache_dtype"
    assert ei.value.file == str(SPACE) and "fp8_e5m2" in str(ei.value)


def test_gpus_needed_and_facts() -> None:
    t = target(gpus_per_node=8)
    assert t.gpus_needed({}) == 1
    assert t.gpus_needed({"tensor_parallel_size": 2, "data_parallel_size": 4}) == 8
    assert t.gpus_needed({"tensor_parallel_size": 2, "pipeline_parallel_size": 2}) == 4
    assert target(extra_args=["-tp", "2"]).gpus_needed({"data_parallel_size": 2}) == 4
    assert t.facts() == {"node_gpus": 8}
    space = load_space(SPACE).bind_facts(target(gpus_per_node=4).facts())
    base = space.defaults()
    assert space.violations({**base, "tensor_parallel_size": 4, "data_parallel_size": 2}) == [
        "tensor_parallel_size * data_parallel_size <= node_gpus"]
    assert space.violations({**base, "tensor_parallel_size": 2, "data_parallel_size": 2}) == []


def test_build_command(tmp_path: Path) -> None:
    t = target(tmp_path, model="./models/llama", load_format="dummy", served_model_name="llama",
               env={"VLLM_LOGGING_LEVEL": "INFO"}, executable=["/opt/venv/bin/vllm"])
    ctx = TrialContext(trial_number=1, state_dir=tmp_path, gpus=(4, 5))
    argv, env = t.build_command({"max_num_seqs": 64, "enable_prefix_caching": False}, ctx, 12345)
    assert argv[:8] == ["/opt/venv/bin/vllm", "serve", str((tmp_path / "models" / "llama").resolve()),
                        "--host", "127.0.0.1", "--port", "12345", "--served-model-name"]
    assert argv[8:] == ["llama", "--load-format", "dummy", "--max-num-seqs", "64", "--no-enable-prefix-caching"]
    assert env == {"VLLM_LOGGING_LEVEL": "INFO"}
    assert t.model_name({}) == "llama"
    preview_argv, preview_env = t.command_preview({}, ctx)
    assert preview_env["CUDA_VISIBLE_DEVICES"] == "4,5" and "8000" in preview_argv
    with pytest.raises(ConfigError, match="unknown vLLM parameter 'swap_space'"):
        t.build_command({"swap_space": 4}, ctx, 1)


def test_describe_without_vllm_or_gpu_says_so(tmp_path: Path) -> None:
    d = target(executable=[str(tmp_path / "no-vllm-here")]).describe()
    assert d["kind"] == "vllm" and d["vllm_version"] == "not installed"
    assert d["gpu_model"] and d["gpu_count"]


@pytest.mark.parametrize("agent", AGENTS, ids=lambda p: p.name)
def test_agents_load_and_show_a_command_without_removed_flags(agent: Path) -> None:
    a = load_agent(agent)
    out = show_command(a)
    shell_line = out.splitlines()[-1]
    assert shell_line.startswith("CUDA_VISIBLE_DEVICES=0 vllm serve meta-llama/Llama-3.1-8B-Instruct ")
    for flag in REMOVED_FLAGS:
        assert flag not in out
    assert "-cc.cudagraph_mode=FULL_AND_PIECEWISE" in shell_line
    assert "--gpu-memory-utilization 0.92" in shell_line
    t = VllmTarget(a.target_options, agent_dir=agent.parent)
    t.check_space(a.space.bind_facts(t.facts()))


def test_cli_validate_show_command_prints_no_removed_flag() -> None:
    from typer.testing import CliRunner

    from tuner.cli.main import app

    res = CliRunner().invoke(app, ["validate", str(REPO / "agents" / "vllm-8xa100.yaml"), "--show-command"])
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())  # the console may wrap long lines
    assert "vllm serve meta-llama/Llama-3.1-8B-Instruct" in out
    assert "-cc.cudagraph_mode=FULL_AND_PIECEWISE" in out and "CUDA_VISIBLE_DEVICES=0" in out
    for flag in REMOVED_FLAGS:
        assert flag not in out
