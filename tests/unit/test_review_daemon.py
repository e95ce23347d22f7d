"""Review: a daemon that cannot start says what to fix and does not keep the state dir's daemon lock."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from tuner.daemon import _single_instance, run_daemon
from tuner.errors import ConfigError

AGENT = """\
name: {name}
target: {{kind: sim, hardware: a100-80gb-sxm, model: llama-3-8b, num_gpus: 8}}
search_space:
  params:
    max_num_seqs: {{type: int, low: 8, high: 512, log: true, default: 16}}
workload:
  arrival: {{kind: closed, concurrency: 8}}
  prompt_tokens: {{dist: fixed, value: 256}}
  output_tokens: {{dist: fixed, value: 64}}
  num_requests: 20
objectives: [{{metric: output_throughput, direction: maximize}}]
schedule: {schedule}
"""


def write_agent(d: Path, file: str, name: str, schedule: str = "{every: 1h}") -> Path:
    p = d / f"{file}.yaml"
    p.write_text(AGENT.format(name=name, schedule=schedule))
    return p


def lock_is_free(sd: Path) -> bool:
    try:
        f = _single_instance(sd)
    except ConfigError:
        return False
    with contextlib.closing(f):
        return True


def test_bad_cron_is_a_config_error_naming_the_field(tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "a", "cron-agent", schedule="{cron: '99 * * * *'}")
    sd = tmp_path / "state"
    with pytest.raises(ConfigError) as ei:
        run_daemon([agent], sd, install_signals=False)
    assert "schedule.cron" in str(ei.value) and "99 * * * *" in str(ei.value)
    assert lock_is_free(sd)


def test_duplicate_names_leave_the_daemon_lock_free(tmp_path: Path) -> None:
    a = write_agent(tmp_path, "a", "same")
    b = write_agent(tmp_path, "b", "same")
    sd = tmp_path / "state"
    with pytest.raises(ConfigError) as ei:
        run_daemon([a, b], sd, install_signals=False)
    assert "same" in str(ei.value)
    assert lock_is_free(sd)


def test_tuned_prompt_mean_of_a_dataset_workload_is_the_datasets(tmp_path: Path) -> None:
    import json

    from tuner.daemon import tuned_prompt_mean
    from tuner.measure.datasets import load_dataset
    from tuner.measure.tokenize import load_tokenizer
    from tuner.spec import WorkloadSpec

    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": "lorem ipsum dolor " * (200 + 40 * i), "output_len": 32}) + "\n"
                            for i in range(5)))
    wl = WorkloadSpec.model_validate({"dataset": "prompts.jsonl", "num_requests": 50})
    samples = load_dataset(data, load_tokenizer(None))
    dataset_mean = sum(s.prompt_tokens for s in samples) / len(samples)
    assert dataset_mean > 2 * 256  # far from the synthetic default the dataset replaces
    tuned = tuned_prompt_mean(wl, base_dir=tmp_path)
    assert abs(tuned - dataset_mean) / dataset_mean < 0.3
