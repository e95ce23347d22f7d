"""Screening: the calibrated reference-engine simulator judges a proposal before it is deployed.

`sampler.screen` (torch_engine agents): every proposal the sampler makes (never the baseline or another enqueued
trial) is first simulated on the agent's workload (tuner.sim.refengine.predict with the model file's fitted step
cost). It is screened out, never deployed and never charged to the budget, when the prediction breaks an SLO by
more than `slo_slack` (relative violation, as the SLO constraint computes it), or when its first objective is
predicted worse than the best measured value so far by more than the factor `worse_than_best`. A screened
proposal is told to Optuna with the predicted values and constraints plus the constraint `screen:predicted` (so
it is infeasible to the sampler and to every query of the best), user attributes `screened` (True),
`predicted` (the predicted metrics) and `cause` `screened`: it is a prediction, never a measurement, never a
champion. The sampler learns from it and is asked again, up to `max_per_trial` times per trial.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.errors import ConfigError, InfeasibleConfig
from tuner.sim.refcost import load_screen_model
from tuner.study.objectives import Evaluation, evaluate, goodput_thresholds_ms

if TYPE_CHECKING:
    from tuner.agent import Agent
    from tuner.sim.refcost import StepModel
    from tuner.spec import AgentSpec, ScreenSpec

log = logging.getLogger(__name__)

SCREEN_CONSTRAINT = "screen:predicted"


@dataclass(frozen=True)
class Verdict:
    """Why a proposal is screened out, with what the simulator predicted."""

    reason: str
    evaluation: Evaluation  # the predicted values and constraints, plus SCREEN_CONSTRAINT
    predicted: dict[str, float]


class Screener:
    """Predicts proposals of one agent at its (sized) workload and decides whether each is worth deploying."""

    def __init__(self, model: StepModel, spec: AgentSpec, *, preset: str = "tiny", base_dir: Path | None = None,
                 ) -> None:
        assert spec.sampler.screen is not None
        self.model = model
        self.spec = spec
        self.opts: ScreenSpec = spec.sampler.screen
        self.preset = preset
        self.base_dir = base_dir
        self.goodput = goodput_thresholds_ms(spec.slos)
        self.predictions = 0
        self._warned = False

    @classmethod
    def for_agent(cls, agent: Agent, target: Any) -> Screener:
        model = load_screen_model(agent.spec.sampler.screen, agent.path.parent, agent.spec.target.kind)
        preset = target.preset() if hasattr(target, "preset") else "tiny"
        return cls(model, agent.spec, preset=preset, base_dir=agent.path.parent)

    def predict(self, config: Mapping[str, Any]) -> tuple[Evaluation, dict[str, float]] | None:
        """The predicted evaluation and metrics of `config`, or None when the simulator cannot judge it (a knob
        it does not model, a configuration the engine would refuse: the deployment will say)."""
        from tuner.sim.refengine import predict

        w = self.spec.workload
        try:
            m = predict(self.model, config, w, seed=w.seed, goodput_ms=self.goodput, preset=self.preset,
                        base_dir=self.base_dir)
        except (ConfigError, InfeasibleConfig) as exc:
            if not self._warned:
                log.warning("the screen cannot judge some proposals (%s): they are deployed unscreened", exc)
                self._warned = True
            return None
        self.predictions += 1
        return evaluate(m, self.spec.objectives, self.spec.slos), m.metrics()

    def judge(self, config: Mapping[str, Any], incumbent: float | None) -> Verdict | None:
        """A Verdict when `config` is to be screened out; None when it is to be deployed."""
        got = self.predict(config)
        if got is None:
            return None
        ev, metrics = got
        reasons = [f"predicted {key.removeprefix('slo:')} breaks its SLO by {v:.0%}"
                   for key, v in ev.constraints.items() if key.startswith("slo:") and v > self.opts.slo_slack]
        factor = self.opts.worse_than_best
        objectives = self.spec.objectives
        if not reasons and factor is not None and incumbent is not None and len(objectives) == 1:
            v = ev.values[0]
            if math.isfinite(v) and math.isfinite(incumbent) and incumbent > 0:
                worse = v / incumbent if objectives[0].direction == "minimize" else incumbent / max(v, 1e-300)
                if worse > factor:
                    reasons.append(f"predicted {objectives[0].metric} {v:.4g} is {worse:.2f}x worse than the best "
                                   f"measured ({incumbent:.4g})")
        if not reasons:
            return None
        marked = Evaluation(values=list(ev.values), constraints={**ev.constraints, SCREEN_CONSTRAINT: 1.0})
        return Verdict("; ".join(reasons), marked, metrics)
