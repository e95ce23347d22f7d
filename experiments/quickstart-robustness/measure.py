"""`make run` from a fresh clone under three CPU conditions; prints one table row per run.

    python experiments/quickstart-robustness/measure.py REPO [--rounds 3] [--out DIR] [--stop-after-s S]
        [--conditions 1core,2core,2core+hog] [--first-run N]

Each run: `git clone REPO`, `make setup` (the set-up `make run` does first on a fresh clone), `make run`, then
`tuner status --json` for the figures. Conditions, interleaved round by round so that a cut-short session still
has every condition:

- `1core`: `taskset -c 0` on setup and run (engine, load generator and tuner on one core);
- `2core`: both cores, nothing of ours beside it;
- `2core+hog`: both cores, with a CPU-bound process of ours (`while True: pass`) running for the whole run.

The machine's load average (`/proc/loadavg`) is recorded before and after each run: it is shared.
Results: <out>/results.jsonl (one object per run) and <out>/table.md (the table printed at the end).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CONDITIONS = ("1core", "2core", "2core+hog")


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def timed(argv: list[str], cwd: Path, log: Path) -> tuple[int, float]:
    t0 = time.monotonic()
    with log.open("ab") as out:
        rc = subprocess.call(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    return rc, time.monotonic() - t0


def one_run(repo: str, condition: str, n: int, out: Path) -> dict[str, Any]:
    clone = Path(f"/tmp/qs-robust-{n}")
    shutil.rmtree(clone, ignore_errors=True)
    subprocess.check_call(["git", "clone", "-q", repo, str(clone)])
    log = out / f"run-{n}-{condition}.log"
    log.unlink(missing_ok=True)
    pin = ["taskset", "-c", "0"] if condition == "1core" else ["taskset", "-c", "0,1"]
    hog = None
    if condition == "2core+hog":
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    row: dict[str, Any] = {"run": n, "condition": condition, "load_before": loadavg(),
                           "started_utc": dt.datetime.now(dt.timezone.utc).strftime("%H:%M:%S")}
    try:
        rc_setup, setup_s = timed([*pin, "make", "setup"], clone, log)
        rc_run, run_s = timed([*pin, "make", "run"], clone, log)
    finally:
        if hog is not None:
            hog.terminate()
            hog.wait(timeout=10)
    row.update(load_after=loadavg(), setup_s=round(setup_s, 1), run_s=round(run_s, 1),
               total_s=round(setup_s + run_s, 1), rc_setup=rc_setup, rc_run=rc_run)
    st = subprocess.run([str(clone / ".venv/bin/tuner"), "status", "agents/quickstart.yaml", "--json"], cwd=clone,
                        capture_output=True, text=True)
    try:
        data = json.loads(st.stdout)
    except ValueError:
        data = {}
    base, best = data.get("baseline") or {}, (data.get("best") or [{}])[0]
    rate = data.get("workload_rate") or {}
    trials = data.get("trials") or {}
    row.update(rate_per_s=rate.get("rate_per_s"), capacity_rate_per_s=rate.get("capacity_rate_per_s"),
               sizing_runs=rate.get("runs"), sizing_s=rate.get("wall_s"),
               feasible=trials.get("FEASIBLE"), infeasible=trials.get("INFEASIBLE"), failed=trials.get("FAIL"),
               baseline_ttft_mean_ms=(base.get("values") or [None])[0], baseline_feasible=base.get("feasible"),
               best_trial=best.get("number"), best_ttft_mean_ms=(best.get("values") or [None])[0])
    b, c = row["baseline_ttft_mean_ms"], row["best_ttft_mean_ms"]
    row["best_vs_baseline_x"] = round(b / c, 2) if b and c else None
    shutil.rmtree(clone, ignore_errors=True)
    return row


COLUMNS = ("run", "condition", "started_utc", "load_before", "load_after", "setup_s", "run_s", "total_s", "rc_run",
           "rate_per_s", "capacity_rate_per_s", "sizing_runs", "sizing_s", "feasible", "infeasible", "failed",
           "baseline_ttft_mean_ms", "baseline_feasible", "best_ttft_mean_ms", "best_vs_baseline_x")


def table(rows: list[dict[str, Any]]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return "" if v is None else str(v)

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("repo")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent)
    ap.add_argument("--stop-after-s", type=float, default=None, help="start no run this long after the first")
    ap.add_argument("--conditions", default=",".join(CONDITIONS),
                    help=f"comma-separated, in the order run within each round (default {','.join(CONDITIONS)})")
    ap.add_argument("--first-run", type=int, default=1, help="number of the first run (to extend a table)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / "results.jsonl"
    rows: list[dict[str, Any]] = []
    conditions = [c for c in args.conditions.split(",") if c]
    unknown = [c for c in conditions if c not in CONDITIONS]
    if unknown:
        ap.error(f"--conditions: unknown {unknown}; choose from {', '.join(CONDITIONS)}")
    n = args.first_run - 1
    t0 = time.monotonic()
    for cond in [c for _ in range(args.rounds) for c in conditions]:
        if args.stop_after_s is not None and time.monotonic() - t0 > args.stop_after_s:
            print(f"{args.stop_after_s:g} s passed: no more runs", flush=True)
            break
        n += 1
        row = one_run(args.repo, cond, n, args.out)
        rows.append(row)
        with results.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    text = table(rows)
    (args.out / "table.md").write_text(text + "\n")
    print(text)
    os.sync()


if __name__ == "__main__":
    main()
