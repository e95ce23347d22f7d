"""The command target with real servers: template substitution, measure through loadgen, classified failures."""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tuner.agent import load_agent
from tuner.errors import ConfigError, InfeasibleConfig, WorkloadError
from tuner.search.space import parse_space
from tuner.spec import WorkloadSpec
from tuner.targets.base import TrialContext
from tuner.targets.command import CommandOptions, CommandTarget, FlagSpec
from tuner.targets.process import pid_alive

SUPPORT = Path(__file__).resolve().parents[2] / "support"
FAKE = SUPPORT / "fake_openai_server.py"
FAULTY = SUPPORT / "faulty_server.py"

WORKLOAD = WorkloadSpec.model_validate({
    "arrival": {"kind": "closed", "concurrency": 4},
    "prompt_tokens": {"dist": "fixed", "value": 16},
    "output_tokens": {"dist": "fixed", "value": 8},
    "num_requests": 24,
})


def target(tmp_path: Path, command: list[str], **opts: Any) -> CommandTarget:
    return CommandTarget(CommandOptions(command=command, **opts), agent_dir=tmp_path)


def test_fake_server_deploys_measures_and_tears_down(tmp_path: Path) -> None:
    t = target(tmp_path, ["{python}", str(FAKE), "--port", "{port}", "--model", "{model}",
                          "--ttft-ms", "{ttft_ms}", "--itl-ms", "{itl_ms}"], model="m1", metrics_path="/metrics")
    ctx = TrialContext(trial_number=0, state_dir=tmp_path / "state")
    with t.deploy({"ttft_ms": 40, "itl_ms": 4}, ctx) as dep:
        m = dep.measure(WORKLOAD, goodput_ms={"ttft": 1000}, seed=1)
        pid = dep.server.pid
    assert pid is not None and not pid_alive(pid)
    assert m.cold_start_s > 0 and m.cold_start_s == dep.cold_start_s
    assert m.summary["completed"] == 24 and m.summary["failed"] == 0
    assert m.summary["total_output_tokens"] == 24 * 8
    assert m.summary["median_ttft_ms"] >= 35  # the server waits 40 ms before the first token
    assert m.value("cold_start_s") == m.cold_start_s


def test_each_template_element_is_one_argument_never_a_shell(tmp_path: Path) -> None:
    evil = "a b; touch PWNED $(touch PWNED2) `id` | cat > x"
    t = target(tmp_path, ["{python}", str(FAULTY), "--port", "{port}", "--model", "{name}"])
    ctx = TrialContext(trial_number=0, state_dir=tmp_path / "state")
    argv, _ = t.build_command({"name": evil}, ctx, 1234)
    assert argv[-2:] == ["--model", evil]
    with t.deploy({"name": evil}, ctx) as dep:
        with urllib.request.urlopen(f"{dep.endpoint}/v1/models", timeout=5) as r:
            assert json.loads(r.read())["data"][0]["id"] == evil  # arrived as one argument, verbatim
        # the group leader is the server's guard: `python -I guard.py FD -- argv...`, argv passed through
        cmdline = Path(f"/proc/{dep.server.pid}/cmdline").read_bytes().split(b"\0")[:-1]
        server_argv = cmdline[cmdline.index(b"--") + 1:]
        assert len(server_argv) == len(argv) and server_argv[-1].decode() == evil
    assert not list(tmp_path.rglob("PWNED*"))


def test_placeholders_gpus_braces_and_env(tmp_path: Path) -> None:
    t = target(tmp_path, ["srv", "--port={port}", "--devices", "{gpus}", "--json={{\"b\": {batch}}}",
                          "--flag={on}", "--rate={rate}"], env={"A": "1"}, gpus_per_trial="tp")
    ctx = TrialContext(trial_number=0, state_dir=tmp_path, gpus=(2, 3))
    argv, env = t.build_command({"batch": 8, "on": True, "rate": 0.5, "tp": 2}, ctx, 9000)
    assert argv == ["srv", "--port=9000", "--devices", "2,3", '--json={"b": 8}', "--flag=true", "--rate=0.5"]
    assert env == {"A": "1"}
    assert t.gpus_needed({"tp": 2}) == 2
    _, penv = t.command_preview({"batch": 8, "on": True, "rate": 0.5, "tp": 2}, ctx)
    assert penv == {"CUDA_VISIBLE_DEVICES": "2,3", "A": "1"}
    with pytest.raises(InfeasibleConfig, match="'batch'"):
        t.build_command({"on": True, "rate": 1.0}, ctx, 1)


def test_options_validation() -> None:
    with pytest.raises(ValidationError, match=r"\{port\}"):
        CommandOptions(command=["srv", "--port", "8000"])
    with pytest.raises(ValidationError, match="stray"):
        CommandOptions(command=["srv", "{port}", "--x={oops"])
    with pytest.raises(ValidationError, match="extra"):
        CommandOptions.model_validate({"command": ["srv", "{port}"], "shell": True})


def test_check_space_names_unknown_and_unused_parameters(tmp_path: Path) -> None:
    space = parse_space({"params": {"batch": {"type": "int", "low": 1, "high": 8, "default": 4},
                                    "unused": {"type": "bool", "default": False}}}, file="s.yaml")
    t = target(tmp_path, ["srv", "{port}", "{batch}", "{nope}"])
    with pytest.raises(ConfigError, match=r"unknown parameter\(s\) \['nope'\]"):
        t.check_space(space)
    t2 = target(tmp_path, ["srv", "{port}", "{batch}"])
    with pytest.raises(ConfigError, match=r"\['unused'\] are not passed"):
        t2.check_space(space)
    target(tmp_path, ["srv", "{port}", "{batch}", "{unused}"]).check_space(space)
    with pytest.raises(ConfigError, match="gpus_per_trial"):
        target(tmp_path, ["srv", "{port}", "{batch}", "{unused}"], gpus_per_trial="tp").check_space(space)


def test_server_dying_mid_measurement_is_crashed_during_run(tmp_path: Path) -> None:
    t = target(tmp_path, ["{python}", str(FAULTY), "--port", "{port}", "--mode", "die",
                          "--die-after-requests", "5"], model="fake")
    ctx = TrialContext(trial_number=0, state_dir=tmp_path / "state")
    with pytest.raises(WorkloadError) as ei:
        with t.deploy({}, ctx) as dep:
            dep.measure(WORKLOAD, goodput_ms={}, seed=0)
    assert ei.value.cause == "crashed_during_run"
    assert "exit status 3" in str(ei.value)


def test_5xx_during_measurement_is_server_errors(tmp_path: Path) -> None:
    t = target(tmp_path, ["{python}", str(FAKE), "--port", "{port}", "--error-status", "500",
                          "--error-every", "2"], model="fake")
    ctx = TrialContext(trial_number=0, state_dir=tmp_path / "state")
    with pytest.raises(WorkloadError) as ei:
        with t.deploy({}, ctx) as dep:
            dep.measure(WORKLOAD, goodput_ms={}, seed=0)
    assert ei.value.cause == "server_errors"
    assert "with 5xx" in str(ei.value)


def test_command_agent_loads_and_shows_its_command(tmp_path: Path) -> None:
    from tuner.agent import show_command

    agent = tmp_path / "agent.yaml"
    agent.write_text(f"""\
name: cmd
target:
  kind: command
  command: ["{{python}}", "{FAKE}", "--port", "{{port}}", "--itl-ms", "{{itl_ms}}"]
  model: fake
  gpus_per_trial: 1
search_space:
  params:
    itl_ms: {{type: float, low: 1, high: 10, default: 5.5}}
workload: {{num_requests: 4}}
objectives: [{{metric: output_throughput, direction: maximize}}]
""")
    a = load_agent(agent)
    out = show_command(a)
    assert out.splitlines()[-1] == f"CUDA_VISIBLE_DEVICES=0 {sys.executable} {FAKE} --port 8000 --itl-ms 5.5"


def test_optional_and_boolean_flags_and_a_baseline_of_the_servers_own_defaults(tmp_path: Path) -> None:
    space = parse_space({"params": {
        "batch": {"type": "int", "low": 1, "high": 64, "default": 16},
        "cache": {"type": "bool", "default": True},
        "eager": {"type": "bool", "default": False},
        "mode": {"type": "categorical", "choices": ["a", "b"], "default": "a"},
        "chunk": {"type": "int", "low": 8, "high": 64, "default": 32, "when": "not eager"},
    }}, file="s.yaml")
    t = target(tmp_path, ["srv", "--port", "{port}"], flags={
        "batch": "--max-num-seqs",
        "cache": {"flag": "--enable-prefix-caching", "style": "pair"},
        "eager": {"flag": "--enforce-eager", "style": "switch"},
        "mode": {"flag": "--mode", "style": "equals", "omit_default": False},
        "chunk": "--chunk"})
    t.check_space(space)  # flags count as passed, and a `when` parameter may map to a flag
    ctx = TrialContext(trial_number=0, state_dir=tmp_path)
    argv, _ = t.build_command(space.full_config(space.defaults()), ctx, 9000)
    assert argv == ["srv", "--port", "9000", "--mode=a"]  # every other knob at its default: left out
    argv, _ = t.build_command({"batch": 8, "cache": False, "eager": True, "mode": "b"}, ctx, 9000)
    assert argv == ["srv", "--port", "9000", "--max-num-seqs", "8", "--no-enable-prefix-caching",
                    "--enforce-eager", "--mode=b"]
    argv, _ = t.build_command({"batch": None, "cache": True, "eager": False, "mode": "a", "chunk": 8}, ctx, 1)
    assert argv == ["srv", "--port", "1", "--mode=a", "--chunk", "8"]
    with pytest.raises(ConfigError, match=r"flags name unknown parameter\(s\) \['nope'\]"):
        target(tmp_path, ["srv", "{port}"], flags={"nope": "--nope"}).check_space(space)
    with pytest.raises(ValidationError, match="both in the command template and in flags"):
        CommandOptions(command=["srv", "{port}", "{batch}"], flags={"batch": "--b"})
    with pytest.raises(ValidationError, match="flag"):
        CommandOptions(command=["srv", "{port}"], flags={"batch": "no-dash"})
    with pytest.raises(InfeasibleConfig, match="true/false"):
        FlagSpec(flag="--x", style="pair").args(3, None, False)


def test_validate_show_command_prints_the_baseline_argv(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tuner.cli.main import app

    (tmp_path / "space.yaml").write_text(
        "params:\n  batch: {type: int, low: 1, high: 64, default: 16}\n  cache: {type: bool, default: true}\n")
    (tmp_path / "agent.yaml").write_text(
        "name: flags\ntarget:\n  kind: command\n  command: [srv, --port, '{port}']\n"
        "  flags: {batch: --max-num-seqs, cache: {flag: --enable-prefix-caching, style: pair}}\n"
        "search_space: space.yaml\nworkload: {num_requests: 4}\n"
        "objectives: [{metric: request_throughput, direction: maximize}]\nbudget: {trials: 1}\n")
    r = CliRunner().invoke(app, ["validate", str(tmp_path / "agent.yaml"), "--show-command"])
    assert r.exit_code == 0, r.output
    assert '["srv", "--port", "' in r.output and "--max-num-seqs" not in r.output
    assert "prefix-caching" not in r.output


def test_a_trial_whose_requests_all_failed_is_recorded_with_the_cause_and_the_servers_message(
        tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tuner.cli.main import app

    (tmp_path / "agent.yaml").write_text(
        "name: refused\ntarget:\n  kind: command\n"
        f"  command: ['{{python}}', '{FAKE}', --port, '{{port}}', --model, m, --error-status, '400']\n"
        "  model: m\n  flags: {ttft: --ttft-ms}\n"
        "search_space:\n  params:\n    ttft: {type: int, low: 1, high: 5, default: 5}\n"
        "workload: {num_requests: 4, arrival: {kind: closed, concurrency: 2}}\n"
        "objectives: [{metric: request_throughput, direction: maximize}]\nbudget: {trials: 1}\n"
        "tracking: {enabled: false}\n")
    sd = tmp_path / "state"
    from tuner.study.summary import EXIT_NO_FEASIBLE

    r = CliRunner().invoke(app, ["run", str(tmp_path / "agent.yaml"), "--state-dir", str(sd)])
    assert r.exit_code == EXIT_NO_FEASIBLE and "all_requests_failed" in r.output, r.output
    r = CliRunner().invoke(app, ["status", str(tmp_path / "agent.yaml"), "--state-dir", str(sd), "--json"])
    base = json.loads(r.output)["baseline"]
    assert base["cause"] == "all_requests_failed" and not base["feasible"], base
    from tuner.study.study import TunerStudy, default_storage

    agent = load_agent(tmp_path / "agent.yaml")
    t = TunerStudy(agent.spec, agent.space, storage_url=default_storage(sd)).baseline()
    assert t is not None and "every request failed; http_4xx x4" in t.user_attrs["error"]
    assert "injected error" in t.user_attrs["error"]
