"""Where configurations fail: a classifier of the crash regions of a space, fitted to the study's own trials.

As SCOOT does for its search: every deployed trial is a labelled point (1: it produced no measurement, out of
memory, refused by the engine, crashed; 0: measured), a random forest (scikit-learn) is fitted on the
parameters, and a proposal it gives a failure probability of at least `threshold` is not deployed (the study
tells it as predicted to fail, no budget trial, and asks again). No model before `min_trials` labelled trials
with both labels present; refitted only when a trial was added.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tuner.search.space import SearchSpace


def encode(space: SearchSpace, config: Mapping[str, Any]) -> list[float]:
    """One number per parameter: a choice's index, a bool as 0/1, a log-scaled range's log; -1 when inactive."""
    out = []
    for p in space.params:
        v = config.get(p.name)
        s = p.spec
        if v is None:
            out.append(-1.0)
        elif s.type == "bool":
            out.append(float(bool(v)))
        elif s.type == "categorical":
            choices = list(s.choices or [])
            out.append(float(choices.index(v)) if v in choices else -1.0)
        else:
            x = float(v)
            out.append(math.log(x) if s.log and x > 0 else x)
    return out


class FailureModel:
    """P(a configuration fails to produce a measurement), learned from labelled configurations."""

    def __init__(self, space: SearchSpace, *, threshold: float = 0.8, min_trials: int = 6, seed: int = 0) -> None:
        self.space = space
        self.threshold = threshold
        self.min_trials = min_trials
        self.seed = seed
        self._fitted_on = -1
        self._model: Any = None

    def fit(self, configs: Sequence[Mapping[str, Any]], failed: Sequence[bool]) -> None:
        if len(configs) == self._fitted_on:
            return
        self._fitted_on = len(configs)
        self._model = None
        if len(configs) < self.min_trials or all(failed) or not any(failed):
            return
        from sklearn.ensemble import RandomForestClassifier

        model = RandomForestClassifier(n_estimators=32, min_samples_leaf=1, random_state=self.seed, n_jobs=1)
        model.fit([encode(self.space, c) for c in configs], [int(f) for f in failed])
        self._model = model

    def p_fail(self, config: Mapping[str, Any]) -> float | None:
        """The predicted failure probability of `config`, or None while there is no model."""
        if self._model is None:
            return None
        proba = self._model.predict_proba([encode(self.space, config)])[0]
        classes = list(self._model.classes_)
        return float(proba[classes.index(1)]) if 1 in classes else 0.0

    def rejects(self, config: Mapping[str, Any]) -> float | None:
        """The failure probability when it is at least the threshold (the proposal is not worth a deployment)."""
        p = self.p_fail(config)
        return p if p is not None and p >= self.threshold else None
