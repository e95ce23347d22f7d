"""Observation from traces: the public formats (generated here), fitting the tuner's own synthetic workloads
back, exact replay through the load generator's trace reader, located errors, and the CLI."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tuner.cli.bench import load_workload
from tuner.cli.main import app
from tuner.errors import ObservationError
from tuner.measure.datasets import plans_for
from tuner.measure.tokenize import load_tokenizer
from tuner.measure.workload import build_plans
from tuner.observe import load_observed, observe_trace, read_trace
from tuner.spec import WorkloadSpec


def _plans(arrival: dict, prompt: dict, output: dict, n: int = 1500) -> list:
    return build_plans(WorkloadSpec.model_validate(
        {"arrival": arrival, "prompt_tokens": prompt, "output_tokens": output, "num_requests": n}), seed=7)


def write_azure(path: Path, plans: list, t0: float = 1_700_000_000.0) -> Path:
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for p in plans:  # the trace's own style: 7 fractional digits, no zone
        ts = datetime.fromtimestamp(t0 + p.arrival_s, timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f") + "0"
        rows.append(f"{ts},{p.prompt_tokens},{p.output_tokens}")
    path.write_text("\n".join(rows) + "\n")
    return path


def write_burstgpt(path: Path, plans: list) -> Path:
    rows = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    for p in plans:
        rows.append(f"{p.arrival_s:.3f},ChatGPT,{p.prompt_tokens},{p.output_tokens},"
                    f"{p.prompt_tokens + p.output_tokens},Conversation log")
    rows.append("99999,ChatGPT,50,0,50,Conversation log")  # a failed request: skipped
    path.write_text("\n".join(rows) + "\n")
    return path


def write_mooncake(path: Path, plans: list) -> Path:
    with path.open("w") as f:
        for i, p in enumerate(plans):  # every request shares its first block with the one before
            f.write(json.dumps({"timestamp": int(p.arrival_s * 1000), "input_length": p.prompt_tokens,
                                "output_length": p.output_tokens, "hash_ids": [0, 100 + i]}) + "\n")
    return path


CASES = [
    ("poisson", {"kind": "poisson", "rate_per_s": 5.0}, {"dist": "lognormal", "mean": 400, "sigma": 0.6},
     {"dist": "uniform", "low": 20, "high": 200}),
    ("gamma", {"kind": "gamma", "rate_per_s": 2.0, "burstiness": 0.25}, {"dist": "fixed", "value": 1000},
     {"dist": "normal", "mean": 150, "std": 30}),
    ("constant", {"kind": "constant", "rate_per_s": 10.0}, {"dist": "uniform", "low": 100, "high": 300},
     {"dist": "fixed", "value": 64}),
]


@pytest.mark.parametrize(("kind", "arrival", "prompt", "output"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("writer", [write_azure, write_burstgpt, write_mooncake])
def test_a_synthetic_workload_is_recovered_from_its_trace(tmp_path: Path, writer, kind: str, arrival: dict,
                                                          prompt: dict, output: dict) -> None:
    plans = _plans(arrival, prompt, output)
    path = writer(tmp_path / "trace", plans)
    obs = observe_trace(path)
    a = obs.workload.arrival
    assert a.kind == kind
    assert a.rate_per_s == pytest.approx(arrival["rate_per_s"], rel=0.1)
    if kind == "gamma":
        assert a.burstiness == pytest.approx(0.25, rel=0.3)
    for name, dist in (("prompt_tokens", prompt), ("output_tokens", output)):
        got = getattr(obs.workload, name)
        assert got.dist == dist["dist"], (name, got)
        assert obs.fit_error[f"{name}_mean_rel_err"] < 0.02
        assert obs.fit_error[f"{name}_bucket_ks"] < 0.06
    true_mean = np.mean([p.prompt_tokens for p in plans])
    assert obs.stats["prompt_tokens_mean"] == pytest.approx(true_mean)
    assert obs.stats["requests"] == len(plans)


def test_formats_are_detected_and_times_converted(tmp_path: Path) -> None:
    plans = _plans({"kind": "constant", "rate_per_s": 2.0}, {"dist": "fixed", "value": 10},
                   {"dist": "fixed", "value": 5}, n=5)
    az, fmt, _ = read_trace(write_azure(tmp_path / "a.csv", plans))
    assert fmt == "azure" and az[0].t_s == pytest.approx(1_700_000_000.0) and az[-1].t_s - az[0].t_s == 2.0
    bg, fmt, notes = read_trace(write_burstgpt(tmp_path / "b.csv", plans))
    assert fmt == "burstgpt" and len(bg) == 5 and "skipped 1 rows" in notes[0]
    mc, fmt, _ = read_trace(write_mooncake(tmp_path / "m.jsonl", plans))
    assert fmt == "mooncake" and mc[1].t_s == 0.5 and mc[1].hash_ids == (0, 101)
    assert observe_trace(tmp_path / "m.jsonl").stats["prefix_cache_hit_rate"] == pytest.approx(4 / 10)


@pytest.mark.parametrize(("text", "where"), [
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,10,5\n2023-11-16 18:15:47,ten,5\n",
     r"t.csv:3: ContextTokens: 'ten' is not a token count"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,10,5\n", r"t.csv:2: TIMESTAMP: 'yesterday' is not a date"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,10,-5\n",
     r"t.csv:2: GeneratedTokens: '-5': a token count must be a whole number >= 0"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,10,5,7\n", r"t.csv:2: more fields"),
    ("Time,Prompt\n1,2\n", r"t.csv:1: CSV header .* matches no known trace format"),
    ('{"timestamp": 1, "input_length": 5}\n', r"t.csv:1: output_length: missing"),
    ('{"timestamp": 1, "input_length": 5, "output_length": 3}\n{oops\n', r"t.csv:2: not a JSON object"),
    ('{"timestamp": 1, "input_length": 5, "output_length": 3, "hash_ids": "x"}\n',
     r"t.csv:1: hash_ids: must be a list of integers"),
    ("", r"t.csv: the trace is empty"),
])
def test_a_bad_row_is_located(tmp_path: Path, text: str, where: str) -> None:
    p = tmp_path / "t.csv"
    p.write_text(text)
    with pytest.raises(ObservationError, match=where):
        observe_trace(p)


def test_a_replay_is_the_exact_trace_for_the_load_generator(tmp_path: Path) -> None:
    plans = _plans({"kind": "gamma", "rate_per_s": 3.0, "burstiness": 0.5}, {"dist": "uniform", "low": 5,
                   "high": 900}, {"dist": "lognormal", "mean": 80, "sigma": 1.0}, n=200)
    src = write_burstgpt(tmp_path / "bg.csv", plans)
    obs = observe_trace(src, replay=True)
    out = tmp_path / "obs" / "workload.yaml"
    out.parent.mkdir()
    written = obs.save(out)
    assert written == [out, out.parent / "workload.trace.jsonl"]
    wl = load_workload(out)  # what `tuner bench --workload` reads
    assert wl.arrival.kind == "trace" and wl.num_requests == 200
    replayed, _ = plans_for(wl, seed=0, tok=load_tokenizer(None), base_dir=out.parent)
    assert [(p.prompt_tokens, p.output_tokens) for p in replayed] == [(p.prompt_tokens, p.output_tokens)
                                                                      for p in plans]
    assert [p.arrival_s for p in replayed] == pytest.approx([p.arrival_s - plans[0].arrival_s for p in plans],
                                                            abs=1e-3)
    again = load_observed(out)
    assert again.workload == wl and again.stats["requests"] == 200 and again.source == obs.source


def test_the_cli_writes_a_workload_bench_can_run(tmp_path: Path) -> None:
    plans = _plans({"kind": "poisson", "rate_per_s": 4.0}, {"dist": "fixed", "value": 128},
                   {"dist": "fixed", "value": 32}, n=300)
    src = write_azure(tmp_path / "az.csv", plans)
    out = tmp_path / "w.yaml"
    res = CliRunner().invoke(app, ["observe", "--trace", str(src), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "rate_per_s" in res.output and "prompt_tokens_bucket_ks" in res.output and f"wrote {out}" in res.output
    wl = load_workload(out)
    assert wl.arrival.kind == "poisson" and wl.prompt_tokens.value == 128 and wl.output_tokens.value == 32
    js = CliRunner().invoke(app, ["observe", "--trace", str(src), "--json"])
    assert js.exit_code == 0, js.output
    data = json.loads(js.output)
    assert data["workload"]["arrival"]["kind"] == "poisson" and data["observation"]["stats"]["requests"] == 300
    none = CliRunner().invoke(app, ["observe", "--out", str(out)])
    assert none.exit_code == 2 and "give exactly one source" in none.output
    nowin = CliRunner().invoke(app, ["observe", "--metrics", "http://127.0.0.1:1/metrics"])
    assert nowin.exit_code == 2 and "--metrics needs --window-s" in nowin.output
    down = CliRunner().invoke(app, ["observe", "--metrics", "http://127.0.0.1:1/metrics", "--window-s", "1"])
    assert down.exit_code == 2 and "cannot read http://127.0.0.1:1/metrics" in down.output
