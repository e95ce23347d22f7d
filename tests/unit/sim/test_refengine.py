"""The reference-engine simulator (tuner.sim.refengine): the engine's scheduling step for step, its cost model
and fit (tuner.sim.refcost), and the engine's step log it is fitted to."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tuner.engine.config import EngineConfig
from tuner.errors import ConfigError, InfeasibleConfig
from tuner.measure.records import RequestPlan
from tuner.sim.engine import SimStats, run_events
from tuner.sim.refcost import FEATURES, StepModel, features, fit, read_steps
from tuner.sim.refengine import RefReplica, engine_config, predict, simulate_ref
from tuner.spec import WorkloadSpec

SHAPE_KEYS = ("chunks", "prefill_tokens", "prefill_pairs", "decode_rows", "decode_len", "first_tokens", "grown_slots")
# 1 ms a pass, 0.5 ms a chunk, 10 us a prompt token, 2 ms a decode step, 0.1 ms a decode row, nothing else
COEF = [1e-3, 5e-4, 1e-5, 0.0, 2e-3, 1e-4, 0.0, 0.0, 0.0]


def model(**coef: list[float]) -> StepModel:
    return StepModel(coef=coef or {"float32": COEF})


def plans(lengths: list[tuple[int, int]], arrivals: list[float] | None = None) -> list[RequestPlan]:
    arrivals = arrivals or [0.0] * len(lengths)
    return [RequestPlan(index=i, arrival_s=a, prompt_tokens=p, output_tokens=o)
            for i, ((p, o), a) in enumerate(zip(lengths, arrivals, strict=True))]


class RecordingCost:
    """A step cost that keeps every step's shape (and prices each at 1 ms)."""

    def __init__(self) -> None:
        self.shapes: list[dict[str, int]] = []

    def seconds(self, step: dict[str, int], *, max_model_len: int, slot_mb: float) -> float:
        self.shapes.append({k: int(step.get(k, 0)) for k in SHAPE_KEYS})
        return 1e-3


def sim_shapes(cfg: EngineConfig, reqs: list[tuple[int, int]]) -> list[dict[str, int]]:
    cost = RecordingCost()
    rep = RefReplica(0, cfg, cost, SimStats())  # type: ignore[arg-type]
    run_events([rep], plans(reqs), stats=SimStats(), max_model_len=512, concurrency=len(reqs), timeout_s=60)
    return cost.shapes


def engine_shapes(cfg: EngineConfig, reqs: list[tuple[int, int]], log: Path) -> list[dict[str, int]]:
    """The real engine's step log for `reqs`, all queued before its loop starts."""
    from tuner.engine.engine import Engine, Request

    done = threading.Event()
    left = {"n": len(reqs)}

    def emit(items: list[Any]) -> None:
        for _, _, reason in items:
            if reason is not None:
                left["n"] -= 1
                if left["n"] == 0:
                    done.set()

    import dataclasses

    engine = Engine(dataclasses.replace(cfg, step_log=str(log)), emit=emit)
    for p, o in reqs:
        engine.submit(Request(prompt=[7] * p, max_tokens=o, ignore_eos=True))
    engine.start()
    try:
        assert done.wait(60), "the engine did not finish the requests"
    finally:
        engine.stop()
    return [{k: int(s.get(k, 0)) for k in SHAPE_KEYS} for s in read_steps(log.read_text().splitlines())]


REQS = [(40, 5), (17, 9), (90, 3), (5, 12), (33, 4), (64, 6), (2, 7), (48, 2)]


@pytest.mark.parametrize("knobs", [
    {"batching": "continuous", "max_batch_size": 4, "prefill_chunk_tokens": 16},
    {"batching": "continuous", "max_batch_size": 8, "prefill_chunk_tokens": 32, "kv_pool_mb": 8,
     "scheduling_policy": "shortest-prompt-first"},
    {"batching": "static", "max_batch_size": 3, "prefill_chunk_tokens": 64, "batch_timeout_ms": 0.0},
    {"batching": "continuous", "max_batch_size": 5, "prefill_chunk_tokens": 512, "pre_allocate": True},
], ids=["continuous", "pool-bound-spf", "static", "one-chunk-prefill"])
def test_the_simulator_schedules_step_for_step_as_the_engine(tmp_path: Path, knobs: dict[str, Any]) -> None:
    cfg = EngineConfig(cpu_threads=1, **knobs)
    real = engine_shapes(cfg, REQS, tmp_path / "steps.jsonl")
    assert real and real == sim_shapes(cfg, REQS)


def test_the_step_log_holds_the_pass_time_and_shape(tmp_path: Path) -> None:
    engine_shapes(EngineConfig(cpu_threads=1, prefill_chunk_tokens=16, batching="continuous"), REQS[:3],
                  tmp_path / "s.jsonl")
    lines = [json.loads(x) for x in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert all(x["dt_s"] > 0 for x in lines)
    assert sum(x.get("prefill_tokens", 0) for x in lines) == 40 + 17 + 90
    assert sum(x.get("first_tokens", 0) + x.get("decode_rows", 0) for x in lines) == 5 + 9 + 3  # every token


def test_one_request_costs_its_chunks_then_its_decode_steps() -> None:
    cfg = engine_config({"batching": "continuous", "prefill_chunk_tokens": 16})
    res = simulate_ref(cfg, model(), plans([(40, 5)]), concurrency=None, timeout_s=60)
    rec = res.records[0]
    pre = [1e-3 + 5e-4 + 1e-5 * n for n in (16, 16, 8)]  # three chunks, the first token at the third's end
    dec = 1e-3 + 2e-3 + 1e-4  # one row
    assert rec.first_token_s == pytest.approx(sum(pre))
    assert rec.token_times_s == pytest.approx([sum(pre) + k * dec for k in range(5)])
    assert res.stats.steps == 3 + 4


def test_static_batching_waits_for_its_timeout_continuous_does_not() -> None:
    two = plans([(32, 4), (32, 4)], [0.0, 0.01])
    static = simulate_ref(engine_config({"batching": "static", "batch_timeout_ms": 100.0}), model(), two,
                          concurrency=None, timeout_s=60)
    cont = simulate_ref(engine_config({"batching": "continuous"}), model(), two, concurrency=None, timeout_s=60)
    assert min(r.first_token_s or 0 for r in static.records) >= 0.1
    assert max(r.first_token_s or 0 for r in cont.records) < 0.05


def test_the_pool_bounds_the_running_batch_and_growth_is_priced() -> None:
    cfg = engine_config({"batching": "continuous", "max_batch_size": 32, "kv_pool_mb": 16})  # 7 float32 slots
    shapes = sim_shapes(cfg, [(20, 30)] * 12)
    assert max(s["decode_rows"] for s in shapes) == 7
    assert sum(s["grown_slots"] for s in shapes) == 7  # 1, 1, 2, then 3 (capped at the capacity)
    grown = StepModel(coef={"float32": [0.0] * 8 + [1e-3]})  # 1 ms a MiB grown
    res = simulate_ref(cfg, grown, plans([(20, 2)]), concurrency=None, timeout_s=60)
    assert res.records[0].first_token_s == pytest.approx(1e-3 * 2101248 / 2**20)  # one 2 MiB slot


def test_knobs_the_model_does_not_cover_are_refused_not_guessed() -> None:
    with pytest.raises(ConfigError, match="quantization"):
        engine_config({"quantization": "int8"})
    with pytest.raises(InfeasibleConfig, match="kv_pool_mb"):
        engine_config({"kv_pool_mb": 1})  # the engine refuses a pool that holds no sequence
    with pytest.raises(ConfigError, match="bfloat16"):
        simulate_ref(engine_config({"dtype": "bfloat16"}), model(), plans([(8, 2)]), concurrency=None, timeout_s=60)


def test_predict_runs_the_load_generators_plans() -> None:
    w = WorkloadSpec.model_validate({"arrival": {"kind": "poisson", "rate_per_s": 5}, "duration_s": 4,
                                     "prompt_tokens": {"dist": "uniform", "low": 32, "high": 320},
                                     "output_tokens": {"dist": "uniform", "low": 16, "high": 64},
                                     "warmup_requests": 2, "seed": 3})
    m = predict(model(), {"batching": "continuous"}, w, seed=3)
    assert 10 <= m.summary["completed"] <= 35 and m.summary["failed"] == 0
    assert m.summary["mean_ttft_ms"] > 0 and m.summary["p99_itl_ms"] >= m.summary["median_itl_ms"]
    assert predict(model(), {"batching": "continuous"}, w, seed=3).summary == m.summary  # deterministic


def test_fit_recovers_the_coefficients_of_noise_free_steps() -> None:
    rng = np.random.default_rng(0)
    truth = np.array([1e-3, 4e-4, 2e-5, 1e-8, 1.5e-3, 2e-4, 3e-7, 1e-4, 2e-3])
    steps = [{"chunks": int(c), "prefill_tokens": int(t), "prefill_pairs": int(t * (t + 50)),
              "decode_rows": int(r), "decode_len": int(rng.integers(40, 400)), "first_tokens": int(min(c, 1)),
              "grown_slots": int(g)}
             for c, t, r, g in zip(rng.integers(0, 3, 400), rng.integers(0, 300, 400), rng.integers(0, 20, 400),
                                   rng.random(400) < 0.05, strict=True)]
    xs = [features(s, max_model_len=512, slot_mb=2.0) for s in steps]
    ys = (np.asarray(xs) @ truth).tolist()
    coef, stats = fit(xs, ys)
    assert np.allclose(coef, truth, rtol=1e-3, atol=1e-9)
    assert stats["median_rel_error"] < 1e-6


def test_a_model_file_round_trips_and_a_bad_one_names_its_field(tmp_path: Path) -> None:
    p = tmp_path / "m.json"
    StepModel(coef={"float32": COEF}, ingress_s=0.002, info={"configs": 3}).save(p)
    assert StepModel.load(p).coef == {"float32": COEF}
    d = json.loads(p.read_text())
    d["coef"]["float32"] = [-1.0] * len(FEATURES)
    p.write_text(json.dumps(d))
    with pytest.raises(ConfigError, match="coef.float32") as exc:
        StepModel.load(p)
    assert exc.value.file == str(p)
    p.write_text("{}")
    with pytest.raises(ConfigError, match="format"):
        StepModel.load(p)
