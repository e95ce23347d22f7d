"""Ground truth of an agent's search space: the noise-free optimum, by a large random sample + local search.

    .venv/bin/python experiments/sample-efficiency/truth.py [agent] [--sample 3000] [--starts 8] [--seed 0]

1. `--sample` random draws of the space (each parameter uniform, log-uniform where the space says log,
   conditions applied); draws that break a declared constraint are counted and not evaluated.
2. Greedy local search (first improvement) from the `--starts` best feasible draws: every other choice of
   each categorical/bool, and each numeric parameter x {1/4, 1/2, 4/5, 5/4, 2, 4} (clipped to its range),
   conditions re-applied, until no neighbour improves.
3. The best feasible configuration seen is the optimum; written to truth-<agent>.json with the counts.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from harness import ROOT, Evaluator, load  # noqa: E402

from tuner.search.points import with_defaults  # noqa: E402
from tuner.search.space import Param, SearchSpace  # noqa: E402

HERE = Path(__file__).parent


def draw(space: SearchSpace, rng: np.random.Generator) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in space.params:
        if not space.active(p, out):
            continue
        out[p.name] = _draw_one(p, rng)
    return out


def _draw_one(p: Param, rng: np.random.Generator) -> Any:
    s = p.spec
    if s.type == "bool":
        return bool(rng.integers(2))
    if s.type == "categorical":
        assert s.choices is not None
        return s.choices[int(rng.integers(len(s.choices)))]
    assert s.low is not None and s.high is not None
    u = rng.random()
    v = math.exp(math.log(s.low) + u * (math.log(s.high) - math.log(s.low))) if s.log else s.low + u * (s.high - s.low)
    return _fit(p, v)


def _fit(p: Param, v: float) -> Any:
    s = p.spec
    assert s.low is not None and s.high is not None
    v = min(max(v, s.low), s.high)
    if s.type == "int":
        step = int(s.step or 1)
        return int(s.low + round((v - s.low) / step) * step)
    if s.step:
        return float(s.low + round((v - s.low) / s.step) * s.step)
    return float(v)


def neighbours(space: SearchSpace, params: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in space.params:
        if p.name not in params:
            continue
        s = p.spec
        if s.type in ("bool", "categorical"):
            values = [False, True] if s.type == "bool" else list(s.choices or [])
            cands = [v for v in values if v != params[p.name]]
        else:
            cands = []
            for f in (0.25, 0.5, 0.8, 1.25, 2.0, 4.0):
                v = _fit(p, params[p.name] * f)
                if v != params[p.name] and v not in cands:
                    cands.append(v)
        out.extend(with_defaults(space, {**params, p.name: v}) for v in cands)
    return out


def key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("agent", nargs="?", default="agents/sim-8xa100.yaml")
    ap.add_argument("--sample", type=int, default=3000)
    ap.add_argument("--starts", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    agent = load(a.agent, noise_cv=0.0)
    space = agent.space
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        ev = Evaluator.of(agent, Path(tmp))
        seen: dict[str, tuple[float, bool, str | None]] = {}
        causes: Counter[str] = Counter()
        rng = np.random.default_rng(a.seed)
        for _ in range(a.sample):
            p = draw(space, rng)
            r = ev.value(p)
            seen[key(p)] = r
            causes["feasible" if r[1] else (r[2] or "slo")] += 1
        sample_best = max((v for v in seen.values() if v[1]), key=lambda r: r[0], default=(0.0, False, None))[0]
        ranked = sorted((json.loads(k) for k, v in seen.items() if v[1]), key=lambda p: -seen[key(p)][0])
        local_evals = 0
        for start in ranked[: a.starts]:
            cur, cur_v = start, seen[key(start)][0]
            improved = True
            while improved:
                improved = False
                for nb in neighbours(space, cur):
                    k = key(nb)
                    if k not in seen:
                        seen[k] = ev.value(nb)
                        local_evals += 1
                    v, feas, _ = seen[k]
                    if feas and v > cur_v * (1 + 1e-9):
                        cur, cur_v, improved = nb, v, True
                        break
        best_k = max((k for k, v in seen.items() if v[1]), key=lambda k: seen[k][0])
    result = {
        "agent": a.agent, "sample": a.sample, "seed": a.seed, "starts": a.starts,
        "sample_causes": dict(causes), "sample_best": sample_best, "local_evaluations": local_evals,
        "evaluations": ev.calls, "optimum": seen[best_k][0], "optimum_params": json.loads(best_k),
        "baseline": ev.value(space.defaults())[:2], "wall_s": round(time.monotonic() - t0, 1),
    }
    name = Path(a.agent).stem
    (HERE / f"truth-{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    _ = ROOT


if __name__ == "__main__":
    main()
