"""The reference engine's step cost, fitted to its own measured steps (the engine's `step_log`).

One engine loop pass that runs an iteration costs, per dtype, a linear function of what it computed:

    step_s = c . features(step)
    features = (1, prefill chunks, prefill tokens, prefill attention pairs (chunk x (start + chunk)),
                1 if any decode, decode rows, decode cells (rows x attention length), first tokens,
                KV pool MiB grown at admission)

The attention length of an eager decode step is the longest row rounded up to 64 (tuner.engine.runner).
`fit` solves non-negative robust least squares on relative error (each step weighted by 1 / its time, so a 2 ms
step counts as much as a 100 ms one); a model file (JSON) holds the coefficients per dtype, the request ingress
delay (the server's HTTP handling before the engine sees a request) and how they were obtained.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tuner.base.files import read_text_bounded
from tuner.errors import ConfigError

FORMAT = "tuner.refengine-step-cost/1"
FEATURES = ("pass", "chunks", "prefill_tokens", "prefill_pairs", "decode", "decode_rows", "decode_cells",
            "first_tokens", "grown_mb")


def attention_len(max_len: int, max_model_len: int) -> int:
    """The eager decode step's attention length: the longest row rounded up to 64, at most the slot."""
    return min(max_model_len + 1, -(-max_len // 64) * 64)


def features(step: Mapping[str, Any], *, max_model_len: int, slot_mb: float) -> list[float]:
    """The feature vector of one step (a step-log line, or the simulator's own step)."""
    rows = float(step.get("decode_rows", 0))
    cells = rows * attention_len(int(step.get("decode_len", 0)), max_model_len) if rows else 0.0
    return [1.0, float(step.get("chunks", 0)), float(step.get("prefill_tokens", 0)),
            float(step.get("prefill_pairs", 0)), 1.0 if rows else 0.0, rows, cells,
            float(step.get("first_tokens", 0)), float(step.get("grown_slots", 0)) * slot_mb]


def fit(rows: Sequence[Sequence[float]], seconds: Sequence[float]) -> tuple[list[float], dict[str, float]]:
    """Non-negative robust least squares of `seconds` on `rows`; (coefficients, fit statistics).

    Residuals are relative (each step weighted by 1 / its time) under a soft-L1 loss, so the odd step that the
    OS or another thread stretched (a pass waits for the core) does not pull the coefficients; the result is then
    scaled so that the predicted total of the steps' times equals the measured total (the stretched time was spent
    all the same). A feature that never occurs in the data gets 0."""
    from scipy.optimize import least_squares, lsq_linear

    x = np.asarray(rows, dtype=float)
    y = np.asarray(seconds, dtype=float)
    if len(y) < x.shape[1]:
        raise ValueError(f"{len(y)} steps cannot fit {x.shape[1]} coefficients")
    w = 1.0 / np.maximum(y, 1e-4)
    used = np.abs(x).max(axis=0) > 0
    scale = np.where(used, np.abs(x).max(axis=0), 1.0)  # columns of very different magnitude
    a = (x[:, used] / scale[used]) * w[:, None]
    start = lsq_linear(a, y * w, bounds=(0.0, np.inf)).x
    res = least_squares(lambda c: a @ c - y * w, start, bounds=(0.0, np.inf), loss="soft_l1", f_scale=0.1)
    coef = np.zeros(x.shape[1])
    coef[used] = res.x / scale[used]
    # the robust fit discounts the stretched steps, but their time was spent: scaled so the steps' total is right
    coef *= y.sum() / max(float((x @ coef).sum()), 1e-12)
    pred = x @ coef
    rel = np.abs(pred - y) / np.maximum(y, 1e-9)
    return coef.tolist(), {"steps": float(len(y)), "median_rel_error": float(np.median(rel)),
                           "total_rel_error": float(abs(pred.sum() - y.sum()) / y.sum())}


MAX_MODEL_BYTES = 16 * 2**20  # a step-cost model file


@dataclass(frozen=True)
class StepModel:
    """A fitted model: coefficients per dtype (in FEATURES order), ingress delay, provenance."""

    coef: dict[str, list[float]]
    ingress_s: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "features": list(FEATURES), "coef": self.coef, "ingress_s": self.ingress_s,
                "info": self.info}

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> StepModel:
        text = read_text_bounded(path, MAX_MODEL_BYTES)  # a regular file only, at most the limit
        try:
            d = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"cannot read the step-cost model: {exc}", file=str(path)) from None
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ConfigError(f"format: expected {FORMAT!r} (a model written by the sim-calibration fit)",
                              file=str(path), field="format")
        if d.get("features") != list(FEATURES):
            raise ConfigError(f"features: expected {list(FEATURES)}", file=str(path), field="features")
        coef = d.get("coef")
        if not isinstance(coef, dict) or not coef:
            raise ConfigError("coef: a mapping of dtype to coefficients is required", file=str(path), field="coef")
        for dtype, c in coef.items():
            if (not isinstance(c, list) or len(c) != len(FEATURES)
                    or not all(isinstance(v, int | float) and math.isfinite(v) and v >= 0 for v in c)):
                raise ConfigError(f"coef.{dtype}: {len(FEATURES)} finite non-negative numbers are required",
                                  file=str(path), field=f"coef.{dtype}")
        ingress = d.get("ingress_s", 0.0)
        if not isinstance(ingress, int | float) or not math.isfinite(ingress) or ingress < 0:
            raise ConfigError("ingress_s: a finite number >= 0 is required", file=str(path), field="ingress_s")
        return cls(coef={k: [float(v) for v in c] for k, c in coef.items()}, ingress_s=float(ingress),
                   info=d.get("info") or {})

    def cost(self, dtype: str) -> StepCostFn:
        if dtype not in self.coef:
            raise ConfigError(f"the step-cost model has no coefficients for dtype {dtype!r} "
                              f"(fitted: {', '.join(sorted(self.coef))})", field="dtype")
        return StepCostFn(np.asarray(self.coef[dtype], dtype=float))


@dataclass(frozen=True)
class StepCostFn:
    """The price of one step of one dtype."""

    coef: np.ndarray

    def seconds(self, step: Mapping[str, Any], *, max_model_len: int, slot_mb: float) -> float:
        return float(np.dot(self.coef, features(step, max_model_len=max_model_len, slot_mb=slot_mb)))


def read_steps(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The steps of a step log (blank or torn lines, e.g. a last line cut by a kill, skipped)."""
    out = []
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict) and isinstance(d.get("dt_s"), int | float):
            out.append(d)
    return out


def load_screen_model(screen: Any, base_dir: Path, kind: str) -> StepModel:
    """The model file of an agent's `sampler.screen` (a ScreenSpec; a relative `model` is read from `base_dir`,
    the agent file's folder), loaded; ConfigError when the target is not the reference engine or the file is
    bad. `validate` and the loop's screener both load it through here."""
    if kind != "torch_engine":
        raise ConfigError(f"sampler.screen simulates the reference engine: it needs target kind torch_engine, "
                          f"not {kind!r}", field="sampler.screen")
    p = Path(screen.model)
    try:
        return StepModel.load(p if p.is_absolute() else base_dir / p)
    except ConfigError as exc:
        raise ConfigError(f"sampler.screen.model: {exc}", field="sampler.screen.model") from None
