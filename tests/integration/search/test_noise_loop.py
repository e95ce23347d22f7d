"""Noise in the loop: the baseline and each new best are measured again; the best comes with an interval."""

from pathlib import Path

from tuner.agent import load_agent
from tuner.loop import open_session, run_cycle

AGENT = """\
name: noise-test
target: {kind: sim, hardware: a100-80gb-sxm, model: llama-3-8b, num_gpus: 8, noise_cv: 0.05}
search_space:
  params:
    tensor_parallel_size: {type: categorical, choices: [1, 2], default: 1}
    max_num_seqs: {type: int, low: 8, high: 256, log: true, default: 64}
workload:
  arrival: {kind: closed, concurrency: 16}
  prompt_tokens: {dist: fixed, value: 64}
  output_tokens: {dist: fixed, value: 16}
  num_requests: 40
objectives:
  - {metric: output_throughput, direction: maximize}
sampler: {name: random, seed: 0}
noise: {repeats: 2}
budget: {trials: 5}
tracking: {enabled: false}
"""


def test_repeats_give_the_best_an_interval(tmp_path: Path) -> None:
    p = tmp_path / "agent.yaml"
    p.write_text(AGENT)
    session = open_session(load_agent(p), tmp_path / "state")
    result = run_cycle(session, trials=5)
    assert len(result.outcomes) == 5  # repeats are not budget trials
    study = session.study
    base = study.baseline()
    assert base is not None and len(base.user_attrs["repeats"]) == 2
    assert len(set(base.user_attrs["repeats"]) | {base.values[0]}) == 3  # new seeds: new machine noise
    repeated = [t for t in study.trials() if t.user_attrs.get("repeats")]
    report = study.noise_report()
    assert report is not None and report["repeated_trials"] == len(repeated) >= 1
    assert 0 < report["cv"] < 0.5
    best = report["best"]
    assert best["low"] < best["mean"] < best["high"] and best["n"] >= 1
    assert best["number"] == study.best()[0].number


def test_without_repeats_only_the_baseline_is_measured_twice(tmp_path: Path) -> None:
    # issue 26 changed this: by default the baseline is measured once more (noise.baseline_repeats: 1), so the
    # run-to-run noise is known; a new best is not repeated
    p = tmp_path / "agent.yaml"
    p.write_text(AGENT.replace("noise: {repeats: 2}\n", ""))
    session = open_session(load_agent(p), tmp_path / "state")
    run_cycle(session, trials=3)
    repeated = [t for t in session.study.trials() if t.user_attrs.get("repeats")]
    assert [t.user_attrs.get("baseline") for t in repeated] == [True]
    assert len(repeated[0].user_attrs["repeats"]) == 1
    report = session.study.noise_report()
    assert report is not None and report["repeated_trials"] == 1 and report["cv"] > 0


def test_with_baseline_repeats_off_nothing_is_measured_twice(tmp_path: Path) -> None:
    p = tmp_path / "agent.yaml"
    p.write_text(AGENT.replace("noise: {repeats: 2}\n", "noise: {baseline_repeats: 0}\n"))
    session = open_session(load_agent(p), tmp_path / "state")
    run_cycle(session, trials=3)
    assert not any(t.user_attrs.get("repeats") for t in session.study.trials())
    assert session.study.noise_report() is None
