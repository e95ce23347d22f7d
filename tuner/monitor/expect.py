"""What the champion is expected to show at the load production offers: its own measurement (the trial that
made it champion) carried to the observed inputs by the calibrated simulator.

The monitor's latency signals move with the load (a window of more or longer requests is slower) and with
the environment (tuner.monitor.contention). `ChampionExpectation` turns the window's inputs into the factor
by which each latency is expected to differ from the champion's measured value at its trial's workload:

    expected(signal) = measured(signal) x prod_i (input_i / reference_i) ^ elasticity(signal, i)

with the elasticities d log(latency) / d log(input) for the request rate, the mean prompt and the mean output
length taken from the simulator (tuner.sim.refengine, the step-cost model the agent's screening uses) run
with the champion's configuration at the trial's workload and at each input raised by `step`. The monitor
learns its baselines on latency / factor, so a window whose load is off the mean by the Poisson noise of its
arrivals is judged at that load; the measured level is what an event reports as expected.

Elasticities are clipped to [-1, 4] (a simulator far outside its calibration says little) and the factor to
[1/10, 10].
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tuner.monitor.signals import INPUTS, LATENCIES
from tuner.spec import LengthDist, WorkloadSpec

# the monitor's latency signals -> the load generator's summary keys (vllm bench's names)
SUMMARY_KEYS = {"ttft_ms_p50": "median_ttft_ms", "ttft_ms_p90": "p90_ttft_ms", "itl_ms_mean": "mean_itl_ms",
                "itl_ms_p90": "p90_itl_ms", "e2el_ms_p50": "median_e2el_ms", "e2el_ms_p90": "p90_e2el_ms"}
assert set(SUMMARY_KEYS) == set(LATENCIES)
ELASTICITY_RANGE = (-1.0, 4.0)
MAX_FACTOR = 10.0


class Expectation(Protocol):
    def factor(self, name: str, signals: Mapping[str, float]) -> float:
        """How many times the champion's `name` at the window's inputs (`signals`) is its reference value."""


@dataclass(frozen=True)
class ChampionExpectation:
    reference: dict[str, float]  # the inputs of the champion's trial workload (INPUTS' names)
    elasticity: dict[str, dict[str, float]]  # signal -> input -> d log signal / d log input
    measured_ms: dict[str, float] = field(default_factory=dict)  # the champion's values at `reference`

    def factor(self, name: str, signals: Mapping[str, float]) -> float:
        s = 0.0
        for inp, e in self.elasticity.get(name, {}).items():
            u, ref = signals.get(inp), self.reference.get(inp)
            if u is not None and ref and u > 0 and ref > 0:
                s += e * math.log(u / ref)
        return math.exp(max(-math.log(MAX_FACTOR), min(math.log(MAX_FACTOR), s)))

    def expected_ms(self, name: str, signals: Mapping[str, float]) -> float | None:
        """The champion's measured value carried to the window's inputs (None: not measured)."""
        m = self.measured_ms.get(name)
        return None if m is None else m * self.factor(name, signals)

    def to_json(self) -> dict[str, Any]:
        return {"reference": self.reference, "elasticity": self.elasticity, "measured_ms": self.measured_ms}


def _scaled(d: LengthDist, f: float) -> LengthDist:
    """The length distribution with every length times f (its bounds too)."""
    upd: dict[str, Any] = {"max": max(1, round(d.max * f)), "min": max(1, round(d.min * f))}
    for key in ("value", "low", "high"):
        v = getattr(d, key)
        if v is not None:
            upd[key] = max(1, round(v * f))
    for key in ("mean", "std"):
        v = getattr(d, key)
        if v is not None:
            upd[key] = v * f
    return d.model_copy(update=upd)


def varied(workload: WorkloadSpec, name: str, f: float) -> WorkloadSpec:
    """The workload with one input (an INPUTS name) times f."""
    if name == "rate_per_s":
        rate = workload.arrival.rate_per_s
        if not isinstance(rate, int | float):
            raise ValueError("the rate is not a number: a closed loop or an unsized auto rate")
        return workload.model_copy(update={"arrival": workload.arrival.model_copy(update={"rate_per_s": rate * f})})
    key = {"prompt_tokens_mean": "prompt_tokens", "output_tokens_mean": "output_tokens"}[name]
    return workload.model_copy(update={key: _scaled(getattr(workload, key), f)})


def _observed(summary: Mapping[str, float], records: Any, duration_s: float | None) -> dict[str, float]:
    """The inputs a window of the simulated run would show (INPUTS' names)."""
    ok = [r for r in records if r.error is None]
    out: dict[str, float] = {}
    if ok:
        out["prompt_tokens_mean"] = sum(r.prompt_tokens for r in ok) / len(ok)
        out["output_tokens_mean"] = sum(r.output_tokens for r in ok) / len(ok)
    rate = summary.get("request_throughput")
    if isinstance(rate, int | float) and rate > 0:
        out["rate_per_s"] = float(rate)
    return out


def from_simulator(model: Any, params: Mapping[str, Any], workload: WorkloadSpec, *,
                   measured: Mapping[str, float] | None = None, step: float = 1.25, seed: int = 0,
                   preset: str = "tiny", base_dir: Path | None = None) -> ChampionExpectation:
    """The champion's expectation: elasticities by the simulator (`model`, a tuner.sim.refcost.StepModel) with
    the champion's `params` at `workload` and at each input times `step`; `measured`, the summary of the
    champion's trial (vllm bench keys), gives the levels. An input the workload cannot vary (the rate of a
    closed loop) gets no elasticity."""
    from tuner.sim.refengine import predict

    base = predict(model, params, workload, seed=seed, preset=preset, base_dir=base_dir)
    ref = _observed(base.summary, base.records, workload.duration_s)
    elasticity: dict[str, dict[str, float]] = {name: {} for name in LATENCIES}
    for inp in INPUTS:
        try:
            wl = varied(workload, inp, step)
        except ValueError:
            continue
        res = predict(model, params, wl, seed=seed, preset=preset, base_dir=base_dir)
        moved = _observed(res.summary, res.records, wl.duration_s)
        if not ref.get(inp) or not moved.get(inp) or moved[inp] <= ref[inp]:
            continue
        du = math.log(moved[inp] / ref[inp])
        for name, key in SUMMARY_KEYS.items():
            a, b = base.summary.get(key), res.summary.get(key)
            if isinstance(a, int | float) and isinstance(b, int | float) and a > 0 and b > 0:
                e = math.log(b / a) / du
                elasticity[name][inp] = max(ELASTICITY_RANGE[0], min(ELASTICITY_RANGE[1], e))
    levels = {name: float(measured[key]) for name, key in SUMMARY_KEYS.items()
              if measured is not None and isinstance(measured.get(key), int | float)
              and math.isfinite(measured[key])}
    return ChampionExpectation(reference=ref, elasticity=elasticity, measured_ms=levels)


def champion_expectation(session: Any) -> ChampionExpectation | None:
    """The expectation of the champion in force of a session (tuner.loop.Session): the metrics its trial
    measured (the study's trial user attribute `metrics`) and, where the agent screens with the reference
    engine's simulator (`sampler.screen.model`, target torch_engine), the elasticities at the study's (sized)
    workload. None without a champion."""
    from tuner.champions.db import champion_store
    from tuner.sim.refcost import load_screen_model
    from tuner.study.sizing import apply, recorded

    champ = champion_store(session).champion()
    if champ is None:
        return None
    measured: dict[str, float] = {}
    if champ.trial is not None and champ.study in (None, session.study.name):
        trial = next((t for t in session.study.study.get_trials(deepcopy=False) if t.number == champ.trial), None)
        got = trial.user_attrs.get("metrics") if trial is not None else None
        measured = {k: float(v) for k, v in (got or {}).items() if isinstance(v, int | float)}
    spec = apply(session.agent, recorded(session.study)).spec
    levels = {name: measured[key] for name, key in SUMMARY_KEYS.items()
              if key in measured and math.isfinite(measured[key])}
    if spec.sampler.screen is None or spec.target.kind != "torch_engine" or spec.workload.auto_rate:
        return ChampionExpectation(reference={}, elasticity={}, measured_ms=levels)
    model = load_screen_model(spec.sampler.screen, session.agent.path.parent, spec.target.kind)
    preset = session.target.preset() if hasattr(session.target, "preset") else "tiny"
    return from_simulator(model, champ.config, spec.workload, measured=measured, seed=spec.workload.seed,
                          preset=preset, base_dir=session.agent.path.parent)
