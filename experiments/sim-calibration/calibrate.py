"""Calibrate the reference-engine simulator on measured trials of the real engine, and measure its error.

    .venv/bin/python experiments/sim-calibration/calibrate.py collect --rate R [--configs 50] [--seed 0]
        [--budget-s 1800] [--out data.jsonl.gz]
    .venv/bin/python experiments/sim-calibration/calibrate.py probe --rates 4,6,8
    .venv/bin/python experiments/sim-calibration/calibrate.py fit [--data data.jsonl.gz] [--test-frac 0.3]
    .venv/bin/python experiments/sim-calibration/calibrate.py screen [--data data.jsonl.gz]
    .venv/bin/python experiments/sim-calibration/calibrate.py noise [--runs runs.jsonl]

collect: the agent's (agents/quickstart.yaml) target with `step_log: true`; the default configuration, then
`--configs` configurations of its search space from a scrambled Sobol design (seeded), each deployed once and
measured once with the agent's workload at the fixed rate `--rate` and the plans of `--seed` (the same requests
for every configuration, so the trials are comparable). Everything measured is appended to the data file, one
JSON line per configuration (summary, per-request records, the engine's step log); a rerun continues after the
configurations already there. probe: the default configuration at a few rates (to pick one).
fit: the step-cost model fitted on a training split of the configurations (per dtype, from the step logs; the
ingress delay from the training trials' TTFT), written to model-cpu.json; prints the prediction error on the
held-out configurations (and in 5-fold cross-validation) and writes table.md.
screen: the screening replay (README): out-of-fold predictions, random proposal orders; writes table-screen.md.
noise: the measurement's own run-to-run noise against the model's error, from what was measured already (no new
measurement): every trial of the tuning runs (runs.jsonl, tune_runs.py) and the collection; a configuration
measured more than once with the same requests (the baseline in every run, and configurations TPE proposed again)
gives the noise floor; each trial is predicted with its own requests; writes table-noise.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tuner.agent import Agent, load_agent
from tuner.engine.config import EngineConfig, slot_bytes
from tuner.errors import TrialError
from tuner.measure.measurement import Measurement
from tuner.search.design import point_to_config
from tuner.sim.refcost import FEATURES, StepModel, features, fit, read_steps
from tuner.sim.refengine import predict
from tuner.spec import WorkloadSpec
from tuner.study.objectives import evaluate, goodput_thresholds_ms
from tuner.targets.base import TrialContext
from tuner.targets.registry import make_target
from tuner.targets.torch_engine import step_log_path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
AGENT = "agents/quickstart.yaml"
INGRESS_GRID_S = (0.0, 0.002, 0.005, 0.01, 0.02, 0.04)
SKIP_STEPS = 3  # a fresh server's first steps pay torch's lazy start-up: left out of the fit
# (label, summary key): what the error table reports
METRICS = (("output throughput (tok/s)", "output_throughput"), ("mean TTFT (objective)", "mean_ttft_ms"),
           ("p50 TTFT", "median_ttft_ms"), ("p99 TTFT", "p99_ttft_ms"), ("p50 ITL", "median_itl_ms"),
           ("p99 ITL", "p99_itl_ms"))


# ---------------------------------------------------------------- collection
def agent_and_workload(rate: float, duration_s: float | None = None) -> tuple[Agent, WorkloadSpec]:
    agent = load_agent(ROOT / AGENT)
    w = agent.spec.workload.with_rate(rate)
    if duration_s is not None:
        w = w.model_copy(update={"duration_s": duration_s})
    return agent, w


def configurations(agent: Agent, n: int, seed: int) -> list[dict[str, Any]]:
    """The default, then n points of a scrambled Sobol design of the space (conditions applied)."""
    from scipy.stats import qmc

    space = agent.space.bind_facts({"device": "cpu"})
    out = [space.defaults()]
    pts = qmc.Sobol(d=len(space.params), scramble=True, seed=seed).random(n)
    for p in pts:
        out.append(point_to_config(space, p))
    return [space.full_config(c) for c in out]


def compact(m: Measurement) -> list[list[Any]]:
    """Per-request records: [index, warmup, error, sent_s, first_token_s, done_s, prompt, output, token times]."""
    return [[r.index, r.warmup, r.error, round(r.sent_s, 6), None if r.first_token_s is None else
             round(r.first_token_s, 6), round(r.done_s, 6), r.prompt_tokens, r.output_tokens,
             [round(t, 6) for t in r.token_times_s]] for r in m.records]


def read_data(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def measure_one(target: Any, config: dict[str, Any], workload: WorkloadSpec, goodput: dict[str, float],
                state: Path, i: int, seed: int) -> dict[str, Any]:
    ctx = TrialContext(trial_number=i, state_dir=state, seed=seed, label=f"cal-{i}")
    t0 = time.monotonic()
    rec: dict[str, Any] = {"i": i, "config": config, "seed": seed,
                           "rate_per_s": workload.arrival.rate_per_s, "duration_s": workload.duration_s}
    try:
        with target.deploy(config, ctx) as dep:
            m = dep.measure(workload, goodput_ms=goodput, seed=seed)
        rec.update(summary=m.summary, cold_start_s=m.cold_start_s, records=compact(m))
    except TrialError as exc:
        rec.update(error=f"{exc.cause}: {exc}")
    rec["wall_s"] = round(time.monotonic() - t0, 2)
    p = step_log_path(ctx)
    rec["steps"] = read_steps(p.read_text(encoding="utf-8").splitlines()) if p.exists() else []
    return rec


def collect(args: argparse.Namespace) -> None:
    agent, workload = agent_and_workload(args.rate, args.duration_s)
    out = Path(args.out)
    done = {r["i"] for r in read_data(out)}
    opts = agent.target_options.model_copy(update={"step_log": True})
    target = make_target("torch_engine", opts, agent.path.parent)
    goodput = goodput_thresholds_ms(agent.spec.slos)
    configs = configurations(agent, args.configs, args.seed)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="simcal-") as tmp:
        for i, config in enumerate(configs):
            if i in done:
                continue
            if time.monotonic() - t0 > args.budget_s:
                print(f"budget of {args.budget_s:.0f} s spent: stopping before configuration {i}", file=sys.stderr)
                break
            rec = measure_one(target, config, workload, goodput, Path(tmp), i, args.seed)
            with gzip.open(out, "at", encoding="utf-8") as f:
                f.write(json.dumps(rec, separators=(",", ":")) + "\n")
            s = rec.get("summary") or {}
            print(f"config {i}: {rec['wall_s']:.1f} s, {len(rec['steps'])} steps, "
                  f"mean TTFT {s.get('mean_ttft_ms', math.nan):.1f} ms, p99 ITL {s.get('p99_itl_ms', math.nan):.1f}"
                  f" ms {rec.get('error', '')}", file=sys.stderr, flush=True)


def probe(args: argparse.Namespace) -> None:
    agent, _ = agent_and_workload(1.0)
    target = make_target("torch_engine", agent.target_options, agent.path.parent)
    config = configurations(agent, 0, 0)[0]
    goodput = goodput_thresholds_ms(agent.spec.slos)
    with tempfile.TemporaryDirectory(prefix="simcal-") as tmp:
        for rate in (float(x) for x in args.rates.split(",")):
            w = agent.spec.workload.with_rate(rate)
            rec = measure_one(target, config, w, goodput, Path(tmp), 0, args.seed)
            s = rec.get("summary") or {}
            print(f"rate {rate:g}/s: mean TTFT {s.get('mean_ttft_ms', math.nan):.0f} ms, p99 TTFT "
                  f"{s.get('p99_ttft_ms', math.nan):.0f} ms, p99 ITL {s.get('p99_itl_ms', math.nan):.0f} ms, "
                  f"throughput {s.get('output_throughput', math.nan):.0f} tok/s {rec.get('error', '')}", flush=True)


# ---------------------------------------------------------------- fit and error
def step_rows(recs: Sequence[dict[str, Any]]) -> dict[str, tuple[list[list[float]], list[float]]]:
    """Per dtype: the feature rows and seconds of every step of `recs` (the first SKIP_STEPS of each left out)."""
    out: dict[str, tuple[list[list[float]], list[float]]] = {}
    for r in recs:
        dtype = r["config"].get("dtype", "float32")
        cfg = EngineConfig(preset="tiny", dtype=dtype)
        mc = cfg.model_config()
        slot_mb = slot_bytes(mc, dtype) / 2**20
        xs, ys = out.setdefault(dtype, ([], []))
        for s in r["steps"][SKIP_STEPS:]:
            xs.append(features(s, max_model_len=mc.max_model_len, slot_mb=slot_mb))
            ys.append(float(s["dt_s"]))
    return out


def usable(data: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in data if r.get("summary") and r["summary"].get("completed", 0) > 0]


def workload_of(rec: dict[str, Any]) -> WorkloadSpec:
    return agent_and_workload(float(rec["rate_per_s"]), rec.get("duration_s"))[1]


def fit_model(train: Sequence[dict[str, Any]], *, ingress: bool = True) -> StepModel:
    coef: dict[str, list[float]] = {}
    stats: dict[str, Any] = {}
    for dtype, (xs, ys) in step_rows(train).items():
        coef[dtype], stats[dtype] = fit(xs, ys)
    model = StepModel(coef=coef, info={"fit": stats, "configs": len(train)})
    if not ingress:
        return model
    # the request ingress delay (HTTP handling before the engine sees a request, and the token's way back): the
    # value of INGRESS_GRID_S whose simulated mean TTFT is closest to the measured one (median relative error)
    best = (math.inf, 0.0)
    for ingress_s in INGRESS_GRID_S:
        m = StepModel(coef=coef, ingress_s=ingress_s)
        errs = []
        for r in train:
            got = predict(m, r["config"], workload_of(r), seed=r["seed"]).summary.get("mean_ttft_ms", math.nan)
            errs.append(abs(got - r["summary"]["mean_ttft_ms"]) / r["summary"]["mean_ttft_ms"])
        best = min(best, (float(np.nanmedian(errs)), ingress_s))
    return StepModel(coef=coef, ingress_s=best[1], info=model.info)


def errors(model: StepModel, recs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per configuration: measured and predicted value of each METRICS key."""
    out = []
    for r in recs:
        if r["config"].get("dtype", "float32") not in model.coef:
            print(f"configuration {r['i']}: no {r['config']['dtype']} steps to fit on: not predicted", file=sys.stderr)
            continue
        m = predict(model, r["config"], workload_of(r), seed=r["seed"])
        row = {"i": r["i"], "config": r["config"]}
        for _, key in METRICS:
            row[key] = (float(r["summary"].get(key, math.nan)), float(m.summary.get(key, math.nan)))
        out.append(row)
    return out


def pct(measured: float, predicted: float) -> float:
    return abs(predicted - measured) / abs(measured) * 100 if measured else math.inf


def error_row(rows: Sequence[dict[str, Any]], key: str) -> tuple[float, float]:
    e = [pct(*r[key]) for r in rows if math.isfinite(r[key][0])]
    e = [x if math.isfinite(x) else 1e9 for x in e]
    return (statistics.median(e), max(e)) if e else (math.nan, math.nan)


def split(recs: Sequence[dict[str, Any]], test_frac: float, seed: int) -> tuple[list[Any], list[Any]]:
    """Held-out configurations drawn at random (seeded); the default (i = 0) always trains."""
    rest = [r for r in recs if r["i"] != 0]
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(rest))
    n_test = round(test_frac * len(recs))
    test_idx = set(order[:n_test].tolist())
    test = [r for j, r in enumerate(rest) if j in test_idx]
    train = [r for r in recs if r["i"] == 0] + [r for j, r in enumerate(rest) if j not in test_idx]
    return train, test


def folds(recs: Sequence[dict[str, Any]], k: int, seed: int) -> list[list[dict[str, Any]]]:
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(recs))
    return [[recs[j] for j in order[f::k]] for f in range(k)]


def out_of_fold(recs: Sequence[dict[str, Any]], k: int, seed: int) -> list[dict[str, Any]]:
    rows = []
    for fold in folds(recs, k, seed):
        ids = {r["i"] for r in fold}
        model = fit_model([r for r in recs if r["i"] not in ids])
        rows += errors(model, fold)
    return sorted(rows, key=lambda x: x["i"])


def short(config: dict[str, Any]) -> str:
    c = config
    s = f"{c['batching'][:4]}"
    if c["batching"] == "static":
        s += f" {c['batch_timeout_ms']:.0f}ms"
    policy = "spf" if "shortest" in c["scheduling_policy"] else "fcfs"
    pre = " pre" if c["pre_allocate"] else ""
    return (s + f" b{c['max_batch_size']} chunk{c['prefill_chunk_tokens']} {policy} {c['kv_pool_mb']}MB{pre} "
            f"{c['dtype'][:4]}")


def fit_cmd(args: argparse.Namespace) -> None:
    data = read_data(Path(args.data))
    recs = usable(data)
    train, test = split(recs, args.test_frac, args.seed)
    model = fit_model(train)
    model = StepModel(coef=model.coef, ingress_s=model.ingress_s, info={
        **model.info, "features": list(FEATURES), "data": Path(args.data).name, "train": sorted(r["i"] for r in train),
        "held_out": sorted(r["i"] for r in test), "rate_per_s": sorted({r["rate_per_s"] for r in recs}),
        "host": "the 2-core development host, engine, load generator and tuner pinned to one core (taskset -c 0)",
        "preset": "tiny", "cpu_threads": 1})
    model.save(HERE / args.model)
    test_rows = errors(model, test)
    train_rows = errors(model, train)
    cv_rows = out_of_fold(recs, 5, args.seed)
    rate = ", ".join(f"{x:g}" for x in sorted({r["rate_per_s"] for r in recs}))
    lines = [f"{len(data)} configurations measured ({len(recs)} usable: {len(train)} to fit, {len(test)} held out), "
             f"quickstart workload at {rate} req/s (Poisson, plans of seed {recs[0]['seed']}); "
             f"absolute prediction error, % of the measured value", "",
             "| metric | held-out median | held-out worst | 5-fold CV median | 5-fold CV worst | training median |",
             "|---|---|---|---|---|---|"]
    for label, key in METRICS:
        hm, hw = error_row(test_rows, key)
        cm, cw = error_row(cv_rows, key)
        tm, _ = error_row(train_rows, key)
        lines.append(f"| {label} | {hm:.1f} | {hw:.1f} | {cm:.1f} | {cw:.1f} | {tm:.1f} |")
    lines += ["", "Held-out configurations (measured / predicted):", "",
              "| # | configuration | throughput tok/s | mean TTFT ms | p99 TTFT ms | p50 ITL ms | p99 ITL ms |",
              "|---|---|---|---|---|---|---|"]
    for r in test_rows:
        cells = [f"{r[k][0]:.0f} / {r[k][1]:.0f}" for k in ("output_throughput", "mean_ttft_ms", "p99_ttft_ms",
                                                            "median_itl_ms", "p99_itl_ms")]
        lines.append(f"| {r['i']} | {short(r['config'])} | " + " | ".join(cells) + " |")
    fits = model.info["fit"]
    lines += ["", "Step-cost fit (training steps): " + "; ".join(
        f"{d}: {int(s['steps'])} steps, median step error {100 * s['median_rel_error']:.1f}%, total time error "
        f"{100 * s['total_rel_error']:.1f}%" for d, s in fits.items()) + f"; ingress {1000 * model.ingress_s:.2f} ms"]
    text = "\n".join(lines) + "\n"
    (HERE / args.table).write_text(text, encoding="utf-8")
    with open(HERE / "predictions.json", "w", encoding="utf-8") as f:
        json.dump({"held_out": test_rows, "out_of_fold": cv_rows}, f, indent=None)
    print(text)


# ---------------------------------------------------------------- screening replay
def screen_cmd(args: argparse.Namespace) -> None:
    from tuner.measure.measurement import Measurement as M

    agent, _ = agent_and_workload(1.0)
    spec = agent.spec
    recs = usable(read_data(Path(args.data)))
    oof = {r["i"]: r for r in out_of_fold(recs, 5, args.seed)}
    recs = [r for r in recs if r["i"] in oof]  # a configuration no fold could predict is left out

    def ev_of(summary: dict[str, float]) -> tuple[float, float]:
        """(objective, worst relative SLO violation) of a summary."""
        e = evaluate(M(summary=summary), spec.objectives, spec.slos)
        worst = max((v for k, v in e.constraints.items() if k.startswith("slo:")), default=0.0)
        return e.values[0], worst

    measured = {r["i"]: ev_of(r["summary"]) for r in recs}
    pred = {i: ev_of({k: v[1] for k, v in row.items() if isinstance(v, tuple | list) and len(v) == 2})
            for i, row in oof.items()}
    feasible = [i for i, (v, w) in measured.items() if w <= 0]
    best_i = min(feasible, key=lambda i: measured[i][0])
    best_v = measured[best_i][0]
    others = [i for i in measured if i != 0]
    lines = [f"{len(recs)} measured configurations (the default first, then {len(others)} in a random order per "
             f"replay, {args.orders} orders); {len(feasible)} feasible; best {best_v:.1f} ms mean TTFT (#{best_i}); "
             "predictions out-of-fold (5-fold: each configuration predicted by a model fitted without it)", "",
             "| slo_slack | worse_than_best | deployments (median of a full pass) | saved | best found = table best "
             "| best found / table best (worst) | deployments to the table best (median) | feasible configurations "
             "screened out |", "|---|---|---|---|---|---|---|---|"]
    rng = np.random.default_rng(args.seed)
    orders = [rng.permutation(others).tolist() for _ in range(args.orders)]
    settings: list[tuple[float | None, float | None]] = [(None, None), (0.25, None), (0.5, None), (1.0, None),
                                                         (0.5, 2.0), (0.5, 3.0), (0.5, 1.5), (1.0, 3.0)]
    for slack, factor in settings:
        deployed, found, ratio, to_best, lost = [], [], [], [], set()
        for order in orders:
            inc = measured[0][0] if measured[0][1] <= 0 else None
            n, reach = 1, None
            for i in order:
                pv, pw = pred[i]
                screened = slack is not None and (pw > slack or (
                    factor is not None and inc is not None and pv > factor * inc))
                if screened:
                    if measured[i][1] <= 0:
                        lost.add(i)
                    continue
                n += 1
                v, w = measured[i]
                if w <= 0 and (inc is None or v < inc):
                    inc = v
                if reach is None and inc is not None and inc <= best_v:
                    reach = n
            deployed.append(n)
            found.append(inc is not None and inc <= best_v)
            ratio.append((inc / best_v) if inc is not None else math.inf)
            to_best.append(reach if reach is not None else math.inf)
        name_s = "off" if slack is None else f"{slack:g}"
        name_f = "-" if factor is None else f"{factor:g}"
        full = 1 + len(others)
        med_dep = statistics.median(deployed)
        lines.append(f"| {name_s} | {name_f} | {med_dep:.0f} of {full} | {100 * (1 - med_dep / full):.0f}% | "
                     f"{sum(found)}/{len(found)} | {max(ratio):.3f} | {statistics.median(to_best):.0f} | "
                     f"{len(lost)} of {len(feasible)} |")
    text = "\n".join(lines) + "\n"
    (HERE / "table-screen.md").write_text(text, encoding="utf-8")
    print(text)


# ---------------------------------------------------------------- noise floor
def loo_deviations(vals: Sequence[float]) -> list[float]:
    """For each measurement, its distance from the mean of the others, % of that mean."""
    out = []
    for j, v in enumerate(vals):
        rest = statistics.fmean([*vals[:j], *vals[j + 1:]])
        out.append(pct(rest, v))
    return out


def noise_cmd(args: argparse.Namespace) -> None:
    """The noise floor of mean TTFT (the only metric runs.jsonl keeps) and the model's error at it."""
    model = StepModel.load(HERE / args.model)
    train = set(model.info.get("train") or [])
    data = {r["i"]: r for r in usable(read_data(Path(args.data)))}
    runs = [json.loads(line) for line in Path(args.runs).read_text(encoding="utf-8").splitlines() if line.strip()]
    agent, _ = agent_and_workload(1.0)
    space = agent.space.bind_facts({"device": "cpu"})
    # (configuration, requests seed) -> measured mean TTFTs; a trial's requests are seeded by its number
    same: dict[tuple[str, int], list[float]] = {}
    config_of: dict[str, dict[str, Any]] = {}
    rates = {float(r["rate_per_s"]) for r in runs}
    if len(rates) != 1:
        raise SystemExit(f"runs at several rates {sorted(rates)}: give a runs file of one rate")
    rate = rates.pop()
    for r in runs:
        for o in r["outcomes"]:
            if o.get("value") is None:
                continue
            key = json.dumps(o["params"], sort_keys=True)
            config_of[key] = space.full_config(o["params"])
            same.setdefault((key, int(o["number"])), []).append(float(o["value"]))
    base_key = json.dumps(space.defaults(), sort_keys=True)
    if base_key in config_of and data.get(0, {}).get("rate_per_s") == rate:
        same.setdefault((base_key, int(data[0]["seed"])), []).append(float(data[0]["summary"]["mean_ttft_ms"]))
    _, workload = agent_and_workload(rate, data[0].get("duration_s") if 0 in data else None)
    pred = {k: float(predict(model, config_of[k[0]], workload, seed=k[1]).summary.get("mean_ttft_ms", math.nan))
            for k in same}
    trained = {json.dumps({n: v for n, v in data[i]["config"].items() if n in space.by_name}, sort_keys=True)
               for i in train if i in data}
    repeated = {k: v for k, v in same.items() if len(v) >= 2}
    held = {k: v for k, v in same.items() if k[0] not in trained}
    base = [v for k, v in repeated.items() if k[0] == base_key]
    rows = [("the baseline, the same requests every time", loo_deviations(base[0]) if base else [], len(base)),
            ("every configuration measured 2+ times with the same requests",
             [d for v in repeated.values() for d in loo_deviations(v)], len(repeated))]
    n_trials = sum(len(v) for v in same.values())
    lines = [f"Mean TTFT at {rate:g} req/s, {n_trials} measured trials ({len(runs)} tuning runs of tune_runs.py, "
             "plus the collection's baseline), one core; absolute difference, % of the reference value", "",
             "| what | measurements | configurations | median | worst |", "|---|---|---|---|---|"]
    for label, devs, n_cfg in rows:
        if devs:
            lines.append(f"| noise floor, {label}: one measurement vs the mean of the others | {len(devs)} | {n_cfg} | "
                         f"{statistics.median(devs):.1f} | {max(devs):.1f} |")
    single = [pct(x, pred[k]) for k, v in held.items() for x in v]
    lines.append(f"| model vs one measurement, every trial of a configuration it was not fitted on | {len(single)} | "
                 f"{len(held)} | {statistics.median(single):.1f} | {max(single):.1f} |")
    rep_held = {k: v for k, v in repeated.items() if k in held}
    for label, group in (("configurations measured 2+ times, not fitted on", rep_held),
                         ("every configuration measured 2+ times (the baseline was fitted on)", repeated)):
        if not group:
            continue
        vs_one = [pct(x, pred[k]) for k, v in group.items() for x in v]
        vs_mean = [pct(statistics.fmean(v), pred[k]) for k, v in group.items()]
        lines.append(f"| model vs one measurement, {label} | {len(vs_one)} | {len(group)} | "
                     f"{statistics.median(vs_one):.1f} | {max(vs_one):.1f} |")
        lines.append(f"| model vs the mean of the measurements, {label} | {sum(len(v) for v in group.values())} | "
                     f"{len(group)} | {statistics.median(vs_mean):.1f} | {max(vs_mean):.1f} |")
    text = "\n".join(lines) + "\n"
    (HERE / args.table).write_text(text, encoding="utf-8")
    print(text)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--rate", type=float, required=True, help="fixed request rate (req/s) of every trial")
    c.add_argument("--configs", type=int, default=50)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--budget-s", type=float, default=1800.0)
    c.add_argument("--duration-s", type=float, default=None, help="arrivals per trial (default: the agent's)")
    c.add_argument("--out", default=str(HERE / "data.jsonl.gz"))
    p = sub.add_parser("probe")
    p.add_argument("--rates", default="4,8,12")
    p.add_argument("--seed", type=int, default=0)
    f = sub.add_parser("fit")
    f.add_argument("--data", default=str(HERE / "data.jsonl.gz"))
    f.add_argument("--test-frac", type=float, default=0.3)
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--model", default="model-cpu.json")
    f.add_argument("--table", default="table.md")
    s = sub.add_parser("screen")
    s.add_argument("--data", default=str(HERE / "data.jsonl.gz"))
    s.add_argument("--orders", type=int, default=200)
    s.add_argument("--seed", type=int, default=0)
    n = sub.add_parser("noise")
    n.add_argument("--data", default=str(HERE / "data.jsonl.gz"))
    n.add_argument("--runs", default=str(HERE / "runs.jsonl"))
    n.add_argument("--model", default="model-cpu.json")
    n.add_argument("--table", default="table-noise.md")
    args = ap.parse_args(argv)
    {"collect": collect, "probe": probe, "fit": fit_cmd, "screen": screen_cmd, "noise": noise_cmd}[args.cmd](args)


if __name__ == "__main__":
    main()
