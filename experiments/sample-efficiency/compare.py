"""Samplers compared on an agent, noise-free, through the tuner's own loop.

    .venv/bin/python experiments/sample-efficiency/compare.py [--agent agents/sim-8xa100.yaml]
        [--seeds 20] [--trials 60] [--variants random,tpe,...] [--force]

Each variant is an agent `sampler:` mapping (seed = the run's seed). One run = open_session + run_cycle with
`trials` budget trials; each trial's objective counts when the trial is feasible (0 otherwise). Runs are kept
in results/<agent>/<variant>.json (rerun with --force); the table (markdown) goes to stdout and
table-<agent>.md. Ratios are best-after-k / the optimum of truth-<agent>.json (truth.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from harness import load, tune  # noqa: E402

HERE = Path(__file__).parent
KS = (5, 10, 20, 30, 60)

# the sampler mapping of each variant (the agent file's other settings unchanged)
VARIANTS: dict[str, dict[str, Any]] = {
    "as-shipped": {},  # the agent file's own sampler (its seed replaced)
    "random": {"name": "random"},
    "tpe": {"name": "tpe", "n_startup_trials": 10},  # the agent as first shipped
    "nsga2": {"name": "nsga2"},
    "qmc": {"name": "qmc"},
    "gp": {"name": "gp", "n_startup_trials": 10},
    # levers, one at a time
    "random+resample": {"name": "random", "resample_violations": 200},
    "tpe+resample": {"name": "tpe", "n_startup_trials": 10, "resample_violations": 200},
    "tpe+mv": {"name": "tpe", "n_startup_trials": 10, "multivariate": True},
    "tpe+sobol": {"name": "tpe", "n_startup_trials": 10, "initial_design": "sobol"},
    "tpe+dsobol+resample": {"name": "tpe", "n_startup_trials": 10, "initial_design": "sobol-around-defaults",
                            "resample_violations": 200},
    "tpe+sweep+resample": {"name": "tpe", "n_startup_trials": 10, "initial_design": "group-sweep",
                           "resample_violations": 200},
    "tpe+sweep+mv+resample": {"name": "tpe", "n_startup_trials": 10, "initial_design": "group-sweep",
                              "multivariate": True, "resample_violations": 200},
}


def sampler_of(agent_path: str, name: str) -> dict[str, Any]:
    """The variant's sampler mapping; for as-shipped, the agent file's own (without its seed)."""
    if VARIANTS[name]:
        return VARIANTS[name]
    return {k: v for k, v in load(agent_path).spec.sampler.model_dump().items() if k != "seed"}


def run_variant(agent_path: str, name: str, seeds: int, trials: int) -> dict[str, Any]:
    runs = []
    sampler = sampler_of(agent_path, name)
    t0 = time.monotonic()
    for seed in range(seeds):
        agent = load(agent_path, noise_cv=0.0, sampler={**sampler, "seed": seed})
        ts = time.monotonic()
        outcomes = tune(agent, trials)
        print(f"{name} seed {seed}: best {max((o.values[0] for o in outcomes if o.feasible), default=0):.0f}",
              file=sys.stderr, flush=True)
        runs.append({"seed": seed, "values": [o.values[0] if o.feasible and o.values else 0.0 for o in outcomes],
                     "causes": [o.cause or ("ok" if o.feasible else "slo") for o in outcomes],
                     "overhead_s": round(sum(o.overhead_s for o in outcomes), 3),
                     "wall_s": round(time.monotonic() - ts, 2)})
    return {"variant": name, "sampler": sampler, "seeds": seeds, "trials": trials, "runs": runs,
            "wall_s": round(time.monotonic() - t0, 1)}


def first_reach(values: list[float], target: float) -> int | None:
    best = 0.0
    for i, v in enumerate(values, 1):
        best = max(best, v)
        if best >= target:
            return i
    return None


def row(res: dict[str, Any], optimum: float) -> dict[str, Any]:
    out: dict[str, Any] = {"variant": res["variant"], "seeds": len(res["runs"])}
    for k in KS:
        ratios = [max(r["values"][:k], default=0.0) / optimum for r in res["runs"]]
        out[f"k{k}"] = (statistics.median(ratios), min(ratios))
    for frac in (0.90, 0.95):
        hits = [first_reach(r["values"], frac * optimum) for r in res["runs"]]
        n = res["trials"]
        keyed = sorted(h if h is not None else n + 1 for h in hits)
        med = statistics.median(keyed)
        out[f"to{int(frac * 100)}"] = (med if med <= n else None, sum(h is not None for h in hits))
    out["overhead_ms"] = 1000 * sum(r["overhead_s"] for r in res["runs"]) / sum(len(r["values"])
                                                                               for r in res["runs"])
    return out


def table(rows: list[dict[str, Any]], trials: int) -> str:
    head = ("| variant | seeds | " + " | ".join(f"k={k} median / worst" for k in KS if k <= trials)
            + " | trials to 90% (median; seeds that got there) | to 95% | tuner ms/trial |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        cells = [r["variant"], str(r["seeds"])]
        cells += [f"{r[f'k{k}'][0]:.3f} / {r[f'k{k}'][1]:.3f}" for k in KS if k <= trials]
        for key in ("to90", "to95"):
            med, n = r[key]
            cells.append(f"{'>' + str(trials) if med is None else f'{med:g}'} ({n}/{r['seeds']})")
        cells.append(f"{r['overhead_ms']:.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def best_known(truth_file: Path, stem: str) -> tuple[float, str]:
    """The optimum: the best of truth.py's search and of every saved run of this agent (each trial of a run is
    a noise-free evaluation of a configuration, as truth.py's), with where it came from."""
    optimum, source = float(json.loads(truth_file.read_text())["optimum"]), truth_file.name
    for path in sorted([*HERE.glob(f"results/{stem}/*.json"), *HERE.glob(f"results-reduced/{stem}/*.json")]):
        res = json.loads(path.read_text())
        for r in res["runs"]:
            best = max(r["values"], default=0.0)
            if best > optimum:
                optimum, source = best, f"{path.relative_to(HERE)} seed {r['seed']}"
    return optimum, source


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agent", default="agents/sim-8xa100.yaml")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--trials", type=int, default=60)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--optimum", type=float, help="instead of truth-<agent>.json's (development runs)")
    ap.add_argument("--table", help="also write the table to this file (in this folder)")
    ap.add_argument("--dev", action="store_true", help="keep runs under results-reduced/ (fewer seeds or trials)")
    a = ap.parse_args()
    stem = Path(a.agent).stem
    truth_file = HERE / f"truth-{stem}.json"
    optimum, source = (a.optimum, "--optimum") if a.optimum is not None else best_known(truth_file, stem)
    out_dir = HERE / ("results-reduced" if a.dev else "results") / stem
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in a.variants.split(","):
        path = out_dir / f"{name}.json"
        res = json.loads(path.read_text()) if path.exists() else None
        full = HERE / "results" / stem / f"{name}.json"
        if res is None and a.dev and full.exists():  # a longer run's first seeds and trials are the same runs
            longer = json.loads(full.read_text())
            if longer["seeds"] >= a.seeds and longer["trials"] >= a.trials:
                runs = [{**r, "values": r["values"][: a.trials], "causes": r["causes"][: a.trials],
                         "overhead_s": r["overhead_s"] * a.trials / longer["trials"]}  # pro rata
                        for r in longer["runs"][: a.seeds]]
                res = {**longer, "seeds": a.seeds, "trials": a.trials, "runs": runs, "truncated_from": str(full.name)}
        if (res is None or a.force or res["seeds"] != a.seeds or res["trials"] != a.trials
                or res["sampler"] != sampler_of(a.agent, name)):
            res = run_variant(a.agent, name, a.seeds, a.trials)
            path.write_text(json.dumps(res) + "\n")
        best_seen = max(max(r["values"], default=0.0) for r in res["runs"])
        if best_seen > optimum * (1 + 1e-9):
            print(f"note: {name} found {best_seen:.1f} > the recorded optimum {optimum:.1f}", file=sys.stderr)
        rows.append(row(res, optimum))
        print(f"{name}: {res['wall_s']} s", file=sys.stderr)
    text = (f"{a.agent}, noise-free; optimum {optimum:.1f} (from {source}); {a.seeds} seeds x {a.trials} "
            "trials; ratio = best feasible after k trials / optimum\n\n" + table(rows, a.trials))
    print(text)
    if a.seeds >= 20 and a.trials >= 60 and not a.dev:
        (HERE / f"table-{stem}.md").write_text(text + "\n")
    if a.table:
        (HERE / a.table).write_text(text + "\n")


if __name__ == "__main__":
    main()
