"""The seed's story, end to end: a live reference-engine server (the production server) under `tuner bench`
traffic that moves from many short concurrent requests to a single long task and back, the tuner daemon watching
its /metrics with two declared scenarios; against the same traffic on each static configuration.

    python experiments/production-loop/run.py > experiments/production-loop/table.md

The daemon tunes on its own engine processes (torch_engine target, the same preset) on the same two cores as
the production server; its apply command (apply.py) restarts the production server with the configuration put in
service. Traffic runs in segments of `--segment-s` (one `tuner bench --json` each) so that each phase can be
split at the switch. Times are wall-clock seconds from the phase's start.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    DEFAULTS,
    FLASH,
    MAX_MODEL_LEN,
    PHASES,
    PRESET,
    THREADS,
    bench_argv,
    free_port,
    load_average,
    read_json,  # noqa: E402
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SEQUENCE = ["concurrent", "single", "concurrent"]
SEED_RATIOS = {"single": "2.12x slower, 0.47x tokens/s", "concurrent": "(not reported)"}


def agent_yaml(port: int, pidfile: Path, prod_log: Path, dwell_s: float, window_s: float) -> dict[str, Any]:
    """Two scenarios, a space of the two profiles (constraints tie the knobs together: defaults or Flash-style)."""
    apply = [sys.executable, str(HERE / "apply.py"), "--port", str(port), "--pidfile", str(pidfile),
             "--log", str(prod_log)]
    flash = "max_batch_size == 32"
    return {
        "name": "prod",
        "target": {"kind": "torch_engine", "preset": PRESET, "device": "cpu", "cpu_threads": THREADS,
                   "startup_timeout_s": 180},
        "search_space": {"target": "torch_engine", "facts": {"device": "cpu"}, "params": {
            "batching": {"type": "categorical", "choices": ["static"], "default": "static"},
            "max_batch_size": {"type": "categorical", "choices": [8, 32], "default": 8},
            "batch_timeout_ms": {"type": "categorical", "choices": [50.0, 100.0], "default": 50.0},
            "kv_pool_mb": {"type": "categorical", "choices": [256, 4096], "default": 256},
            "pre_allocate": {"type": "categorical", "choices": [False, True], "default": False}},
            "constraints": [f"({flash}) == (batch_timeout_ms == 100.0)", f"({flash}) == (kv_pool_mb == 4096)",
                            f"({flash}) == pre_allocate"]},
        "workload": {"duration_s": 45, "timeout_s": 300, "ignore_eos": True},  # each trial: 45 s of traffic
        "objectives": [{"metric": "output_throughput", "direction": "maximize"}],
        "sampler": {"name": "random", "seed": 0, "resample_violations": 200},
        "budget": {"trials": 2},
        "noise": {"baseline_repeats": 0},
        "schedule": {"every": "24h", "trials_per_cycle": 2},
        "promotion": {"policy": "auto", "verify_runs": 2, "min_improvement": 0.0, "confidence": 0.8,
                      "apply_command": apply},
        "tracking": {"enabled": False},
        "scenarios": [
            {"name": "concurrent", "concurrency": {"min": 8}, "output_tokens": {"max": 64}},
            {"name": "single", "concurrency": {"max": 2}, "output_tokens": {"min": 96}}],
        "switching": {"dwell_s": dwell_s, "enter_margin": 0.1, "exit_margin": 0.3},
        "watch": {"url": f"http://127.0.0.1:{port}/metrics", "interval_s": 2, "window_s": window_s},
    }


def run_phase(base: str, phase: str, *, min_s: float, max_s: float, segment_s: float, tmp: Path, tag: str,
              done: Any = None) -> list[dict[str, Any]]:
    """Segments of traffic until `min_s` passed and `done()` (or `max_s`)."""
    segs: list[dict[str, Any]] = []
    t0 = time.time()
    i = 0
    while True:
        out = tmp / f"{tag}-{i}.json"
        start = time.time()
        subprocess.run(bench_argv(base, phase, duration_s=segment_s, out=out, seed=i), cwd=REPO,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=segment_s + 400)
        m = read_json(out) if out.is_file() else {}
        segs.append({"start": start, "end": time.time(), "m": m})
        i += 1
        el = time.time() - t0
        if el >= max_s or (el >= min_s and (done is None or done())):
            return segs


def summary(segs: list[dict[str, Any]]) -> dict[str, float]:
    """Output tokens/s, requests completed and failed, mean E2EL over the segments (weighted by completions)."""
    wall = sum(s["end"] - s["start"] for s in segs)
    toks = sum(s["m"].get("total_output_tokens", 0) for s in segs)
    done = sum(s["m"].get("completed", 0) for s in segs)
    failed = sum(s["m"].get("failed", 0) for s in segs)
    e2e = [s["m"]["mean_e2el_ms"] for s in segs if s["m"].get("completed")]
    w = [s["m"]["completed"] for s in segs if s["m"].get("completed")]
    mean_e2e = sum(a * b for a, b in zip(e2e, w, strict=True)) / sum(w) if w else float("nan")
    return {"tok_s": toks / wall if wall else 0.0, "completed": done, "failed": failed, "e2el_ms": mean_e2e,
            "wall_s": wall}


def start_prod(config: dict[str, Any], port: int, pidfile: Path, log: Path) -> None:
    subprocess.run([sys.executable, str(HERE / "apply.py"), "--port", str(port), "--pidfile", str(pidfile),
                    "--log", str(log), "--config-json", json.dumps(config)], cwd=REPO, check=True, timeout=300)


def stop_prod(pidfile: Path) -> None:
    if pidfile.is_file():
        try:
            os.kill(int(pidfile.read_text()), signal.SIGTERM)
        except ProcessLookupError:
            pass
        time.sleep(1)


def static_run(name: str, config: dict[str, Any], args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    port = free_port()
    pidfile, log = tmp / f"{name}.pid", tmp / f"{name}.log"
    start_prod(config, port, pidfile, log)
    try:
        out = {}
        for phase in ("concurrent", "single"):
            out[phase] = summary(run_phase(f"http://127.0.0.1:{port}", phase, min_s=args.static_s,
                                           max_s=args.static_s, segment_s=args.segment_s, tmp=tmp,
                                           tag=f"{name}-{phase}"))
            print(f"static {name} {phase}: {out[phase]}", file=sys.stderr)
        return out
    finally:
        stop_prod(pidfile)


def daemon_run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    port = free_port()
    pidfile, prod_log = tmp / "prod.pid", tmp / "prod.log"
    start_prod(DEFAULTS, port, pidfile, prod_log)  # production starts on the plain defaults
    agent = tmp / "prod.yaml"
    agent.write_text(yaml.safe_dump(agent_yaml(port, pidfile, prod_log, args.dwell_s, args.window_s),
                                    sort_keys=False))
    sd = tmp / "state"
    dlog = open(tmp / "daemon.log", "wb")  # noqa: SIM115 - closed below
    daemon = subprocess.Popen([sys.executable, "-m", "tuner.cli", "daemon", str(agent), "--state-dir", str(sd)],
                              cwd=REPO, stdout=dlog, stderr=subprocess.STDOUT)
    journal = sd / "prod" / "scenarios" / "switches.jsonl"

    def entries() -> list[dict[str, Any]]:
        if not journal.is_file():
            return []
        return [json.loads(x) for x in journal.read_text().splitlines() if x.strip()]

    def switched_to(phase: str, after: float) -> bool:
        return any(e["kind"] == "switch" and e["scenario"] == phase and e["time"] >= after for e in entries())

    phases = []
    try:
        for i, phase in enumerate(SEQUENCE):
            t0 = time.time()
            segs = run_phase(f"http://127.0.0.1:{port}", phase, min_s=args.after_s, max_s=args.max_phase_s,
                             segment_s=args.segment_s, tmp=tmp, tag=f"daemon-{i}-{phase}",
                             done=lambda p=phase, t=t0: switched_to(p, t) and time.time() - max(
                                 e["time"] for e in entries() if e["kind"] == "switch") >= args.after_s)
            phases.append({"phase": phase, "t0": t0, "segs": segs})
            print(f"daemon phase {i} {phase}: {summary(segs)}", file=sys.stderr)
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(120)
        except subprocess.TimeoutExpired:
            daemon.kill()
        dlog.close()
        stop_prod(pidfile)
    cycles = [json.loads(x) for x in (sd / "prod" / "cycles.jsonl").read_text().splitlines()] \
        if (sd / "prod" / "cycles.jsonl").is_file() else []
    return {"phases": phases, "journal": entries(), "cycles": cycles,
            "champions": {s: yaml.safe_load(p.read_text())["config"] for s in ("concurrent", "single")
                          if (p := sd / "prod" / "scenarios" / s / "champion.yaml").is_file()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--segment-s", type=float, default=60)
    ap.add_argument("--static-s", type=float, default=60, help="seconds of each phase on a static configuration")
    ap.add_argument("--after-s", type=float, default=40, help="daemon: seconds of each phase after its switch")
    ap.add_argument("--max-phase-s", type=float, default=600)
    ap.add_argument("--dwell-s", type=float, default=20)
    ap.add_argument("--window-s", type=float, default=20)
    ap.add_argument("--keep", type=Path, help="copy the daemon's journals here")
    ap.add_argument("--statics", type=Path, help="the static configurations' results: read when the file "
                    "exists (measured before), else measured and written there")
    args = ap.parse_args()
    loads = [load_average()]
    t_start = time.time()
    with tempfile.TemporaryDirectory(prefix="production-loop-") as d:
        tmp = Path(d)
        if args.statics is not None and args.statics.is_file():  # measured before (a rerun of the daemon part)
            statics = json.loads(args.statics.read_text())
        else:
            statics = {name: static_run(name, cfg, args, tmp) for name, cfg in (("defaults", DEFAULTS),
                                                                                  ("flash", FLASH))}
            if args.statics is not None:
                args.statics.write_text(json.dumps(statics, indent=1))
        loads.append(load_average())
        dm = daemon_run(args, tmp)
        loads.append(load_average())
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            (args.keep / "raw.json").write_text(json.dumps({"statics": statics, "daemon": dm}, default=str))
            for f in ("daemon.log", "state/prod/cycles.jsonl", "state/prod/scenarios/switches.jsonl"):
                if (tmp / f).is_file():
                    shutil.copy(tmp / f, args.keep / Path(f).name)
    report(statics, dm, args, loads, time.time() - t_start)


def report(statics: dict[str, Any], dm: dict[str, Any], args: argparse.Namespace, loads: list[float],
           wall_s: float) -> None:
    print(f"Preset {PRESET}, {THREADS} engine thread, max_model_len {MAX_MODEL_LEN}; phases: "
          + "; ".join(f"{k}: {v['concurrency']} in flight, {v['prompt_tokens']}-token prompts, "
                      f"{v['output_tokens']}-token answers" for k, v in PHASES.items())
          + f". Watch every 2 s over a {args.window_s:g} s window, dwell {args.dwell_s:g} s. Whole run "
          f"{wall_s / 60:.1f} min; 1-minute load average {min(loads):.1f}-{max(loads):.1f} on "
          f"{os.cpu_count()} cores (shared).\n")
    print("### Detection and switching (seconds from the traffic's change)\n")
    print("| phase | traffic from | detected (first decision) | decision | switched | champion in service |")
    print("|---|---|---:|---|---:|---|")
    ends = [p["t0"] for p in dm["phases"][1:]] + [float("inf")]
    for ph, end in zip(dm["phases"], ends, strict=True):  # a phase's own decisions only
        later = [e for e in dm["journal"] if ph["t0"] <= e["time"] < end and e.get("scenario") == ph["phase"]]
        first = min(later, key=lambda e: e["time"]) if later else None
        sw = next((e for e in sorted(later, key=lambda e: e["time"]) if e["kind"] == "switch"), None)
        cfg = sw.get("config") if sw else None
        print(f"| {ph['phase']} | {time.strftime('%H:%M:%S', time.localtime(ph['t0']))} | "
              f"{first['time'] - ph['t0']:.0f} | {first['kind'] if first else '-'} | "
              f"{(sw['time'] - ph['t0']) if sw else float('nan'):.0f} | "
              f"{profile(cfg) if cfg else '-'} |" if first else f"| {ph['phase']} | - | - | - | - | - |")
    print("\n### Goodput and latency in each phase\n")
    print("Output tokens/s over the phase (failed: requests refused while the production server restarted; the "
          "closed loop retries at once, so thousands in a few seconds), "
          "mean end-to-end latency of the completed requests. Daemon: the whole phase (it starts on the "
          "configuration of the phase before, and its tuning runs beside production on the same cores), and "
          "after its switch. Static: the phase's steady state.\n")
    print("| phase | configuration | output tok/s | mean E2EL ms | completed | failed | vs defaults tok/s |"
          " vs defaults E2EL | seed (Flash vs plain) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for i, ph in enumerate(dm["phases"]):
        base = statics["defaults"][ph["phase"]]
        rows = [("defaults (static)", base), ("Flash-style (static)", statics["flash"][ph["phase"]])]
        whole = summary(ph["segs"])
        end = dm["phases"][i + 1]["t0"] if i + 1 < len(dm["phases"]) else float("inf")
        sw = [e["time"] for e in dm["journal"] if e["kind"] == "switch" and e["scenario"] == ph["phase"]
              and ph["t0"] <= e["time"] < end]
        after = [s for s in ph["segs"] if sw and s["start"] >= min(sw)]
        rows.append((f"daemon, phase {i + 1} whole", whole))
        if after:
            rows.append((f"daemon, phase {i + 1} after the switch", summary(after)))
        for name, s in rows:
            print(f"| {ph['phase']} | {name} | {s['tok_s']:.1f} | {s['e2el_ms']:.0f} | {s['completed']} | "
                  f"{s['failed']} | {s['tok_s'] / base['tok_s']:.2f}x | {s['e2el_ms'] / base['e2el_ms']:.2f}x | "
                  f"{SEED_RATIOS[ph['phase']] if name.startswith('Flash') else ''} |")
    print("\n### The daemon's cycles\n")
    print("| start | scenario | study | workload source | observed concurrency | observed output tokens | "
          "trials | check | wall s |")
    print("|---|---|---|---|---:|---:|---|---|---:|")
    for c in dm["cycles"]:
        st = (c.get("observed") or {}).get("stats") or {}
        print(f"| {time.strftime('%H:%M:%S', time.localtime(c['start_time']))} | {c.get('scenario') or '-'} | "
              f"{c.get('study')} | {c.get('workload_source')} | {st.get('concurrency_mean', float('nan')):.2f} | "
              f"{st.get('output_tokens_mean', float('nan')):.0f} | {c.get('trials')} | "
              f"{(c.get('check') or {}).get('action')} | {c['end_time'] - c['start_time']:.0f} |")
    print("\nScenario champions: " + "; ".join(f"{s}: {profile(c)}" for s, c in dm["champions"].items()))


def profile(cfg: dict[str, Any]) -> str:
    if all(cfg.get(k) == v for k, v in FLASH.items() if k in cfg):
        return "Flash-style"
    if all(cfg.get(k) == v for k, v in DEFAULTS.items() if k in cfg):
        return "defaults"
    return json.dumps(cfg)


if __name__ == "__main__":
    main()
