"""The seed's story, end to end: a live reference-engine server (production) behind HAProxy, under `tuner bench`
traffic that moves between many short concurrent requests and a single long task, the tuner daemon watching its
/metrics through the balancer with two declared scenarios; against the same traffic on each static configuration.

    nice -n 5 python experiments/production-loop/run.py --keep OUT > experiments/production-loop/table.md

Order (so that the machine's load hits all alike): the static configurations (defaults, then Flash-style), the
daemon's learning pass (each scenario's traffic until the daemon has tuned it and put its champion in service),
the daemon's measured pass (the phases with fixed lengths, its champions known), the static configurations again
(Flash-style, then defaults). The daemon's apply command (apply.py) moves the balancer's backend to a server with
the new configuration without downtime (tuner.rollout.lb.replace_server). Times are unix seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))
from apply import request_limit  # noqa: E402
from common import DEFAULTS, FLASH, MAX_MODEL_LEN, PHASES, PRESET, SPACE, THREADS, bench_argv, load_average  # noqa: E402

from tests.support.haproxy import Balancer, running_haproxy  # noqa: E402
from tuner.rollout.lb import HAProxy  # noqa: E402

METRICS_BACKEND = "llm_metrics"  # /metrics, never queued behind the requests (tests.support.haproxy)
MEASURED = ["concurrent", "single", "concurrent", "single"]
STATIC = ["concurrent", "single"]
SEED_RATIOS = {"single": "Flash 2.12x slower, 0.47x tokens/s", "concurrent": "(not reported)"}


def agent_yaml(tmp: Path, bal: Balancer, args: argparse.Namespace) -> dict[str, Any]:
    """Two scenarios on the concurrency alone; the engine's scheduling and memory knobs as the space (the two
    static configurations are two of its points), searched by the default sampler after the baseline and the
    Flash-style candidate."""
    apply = [sys.executable, str(HERE / "apply.py"), "--state", str(tmp / "prod.json"), "--log",
             str(tmp / "prod.log"), "--lb-socket", str(bal.socket), "--backend", bal.backend,
             "--events", str(tmp / "moves.jsonl"), "--keep-warm", str(args.keep_warm)]
    if args.queue_in_balancer:
        apply.append("--queue-in-balancer")
    if bal.metrics_backend:
        apply += ["--metrics-backend", bal.metrics_backend]
    return {
        "name": "prod",
        "target": {"kind": "torch_engine", "preset": PRESET, "device": "cpu", "cpu_threads": THREADS,
                   "startup_timeout_s": 180},
        "search_space": {"target": "torch_engine", "facts": {"device": "cpu"}, "params": SPACE},
        "workload": {"duration_s": args.trial_s, "timeout_s": 300, "ignore_eos": True},
        "objectives": [{"metric": "output_throughput", "direction": "maximize"}],
        "sampler": {"seed": args.seed},
        "budget": {"trials": args.trials},
        "noise": {"baseline_repeats": 0},
        "schedule": {"every": "24h", "trials_per_cycle": args.trials},
        "promotion": {"policy": "auto", "verify_runs": 2, "min_improvement": 0.0, "confidence": 0.8,
                      "apply_command": apply},
        "tracking": {"enabled": False},
        # the seed's Flash-style profile, the one an operator would already know, tried first after the baseline
        "candidates": [{"name": "flash-style", "params": {k: v for k, v in FLASH.items() if k in SPACE}}]
        if args.candidates else [],
        "scenarios": [{"name": "concurrent", "concurrency": {"min": 8}},
                      {"name": "single", "concurrency": {"max": 2}}],
        "switching": {"dwell_s": args.dwell_s, "enter_margin": 0.1, "exit_margin": 0.3,
                      "cross_eval_runs": args.cross_eval_runs},
        "watch": {"url": f"{bal.url}/metrics", "interval_s": 1, "window_s": args.window_s},
    }


class Loads:
    """The 1-minute load average every 10 s while the run lasts."""

    def __init__(self, *, sample: bool = True) -> None:
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        if sample:
            threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), load_average()))
            self._stop.wait(10)

    def between(self, a: float, b: float) -> list[float]:
        return [v for t, v in self.samples if a <= t <= b]

    def stop(self) -> None:
        self._stop.set()


def bench(base: str, phase: str, duration_s: float, out: Path, seed: int) -> dict[str, Any]:
    """One `tuner bench` run; its requests with unix send and finish times."""
    start = time.time()
    with open(out.with_suffix(".log"), "wb") as log:
        rc = subprocess.run(["nice", "-n", "5", *bench_argv(base, phase, duration_s=duration_s, out=out, seed=seed)],
                            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, timeout=duration_s + 600).returncode
    end = time.time()
    if rc != 0 or not out.is_file():
        print(f"bench {out.name} exited {rc}: {out.with_suffix('.log').read_text(errors='replace')[-1500:]}",
              file=sys.stderr)
    m = json.loads(out.read_text()) if out.is_file() else {}
    t0 = end - float(m.get("duration") or 0.0)  # the run's clock starts `duration` before its last answer
    reqs = [{"sent": t0 + s, "done": t0 + s + lat if lat is not None else None, "tokens": n}
            for s, lat, n in zip(m.get("start_times", []), m.get("latencies", []), m.get("output_lens", []),
                                 strict=False)]
    return {"phase": phase, "start": start, "t0": t0, "end": end, "completed": m.get("completed", 0),
            "failed": m.get("failed", 0), "requests": reqs}


def figures(run: dict[str, Any], since: float | None = None) -> dict[str, float]:
    """Output tokens/s of completed requests from the run's clock start (or `since`) to its last answer, mean
    E2EL of the requests sent from then, completed and failed counts."""
    a = run["t0"] if since is None else since
    done = [r for r in run["requests"] if r["done"] is not None and r["done"] >= a]
    last = max((r["done"] for r in done), default=a)
    sent = [r for r in run["requests"] if r["sent"] >= a]
    lat = [r["done"] - r["sent"] for r in sent if r["done"] is not None]
    return {"tok_s": sum(r["tokens"] for r in done) / (last - a) if last > a else 0.0,
            "e2el_ms": 1000 * statistics.fmean(lat) if lat else float("nan"),
            "completed": len([r for r in sent if r["done"] is not None]),
            "failed": len([r for r in sent if r["done"] is None]), "wall_s": last - a}


@contextmanager
def production(config: dict[str, Any], tmp: Path, tag: str, *, queue: bool) -> Iterator[Balancer]:
    """A server with `config` (apply.py's first start) behind a real HAProxy; both stopped afterwards. `queue`:
    the server holds at most twice the requests it runs at once (apply.request_limit), the others wait in the
    balancer (as apply.py's --queue-in-balancer does for every server after it), for the static configurations
    and the daemon alike."""
    state = tmp / "prod.json"
    state.unlink(missing_ok=True)
    subprocess.run([sys.executable, str(HERE / "apply.py"), "--state", str(state), "--log", str(tmp / "prod.log"),
                    "--config-json", json.dumps(config)], cwd=REPO, check=True, timeout=300, stdout=subprocess.DEVNULL)
    first = json.loads(state.read_text())
    try:
        with running_haproxy(tmp / f"hx-{tag}", {first["name"]: f"127.0.0.1:{first['port']}"},
                             metrics_backend=METRICS_BACKEND if queue else None) as bal:
            if queue:
                HAProxy(bal.socket, bal.backend).set_maxconn(first["name"], request_limit(config))
            yield bal
    finally:
        now = json.loads(state.read_text())  # the one serving now (the daemon may have moved it), its standbys
        for p in {int(now["pid"]), int(first["pid"]), *(int(s["pid"]) for s in now.get("standby", []))}:
            try:
                os.kill(p, signal.SIGTERM)
            except ProcessLookupError:
                pass
        time.sleep(2)


def static_pass(name: str, config: dict[str, Any], args: argparse.Namespace, tmp: Path, n: int) -> list[dict]:
    """Each phase on a server of its own (started before the phase's clock); a phase whose server answered
    nothing (it died: a shared machine) is run again once on a fresh one, and said so."""
    runs = []
    for i, ph in enumerate(STATIC):
        for attempt in (1, 2):
            with production(config, tmp, f"{name}{n}-{i}-{attempt}", queue=args.queue_in_balancer) as bal:
                r = bench(bal.url, ph, args.phase_s, tmp / f"{name}{n}-{i}-{attempt}.json", seed=i)
            if r["completed"] > 0:
                break
            print(f"static {name} pass {n} {ph}: nothing completed, again on a fresh server", file=sys.stderr)
        runs.append(r)
        print(f"static {name} pass {n} {ph}: {figures(r)}", file=sys.stderr)
    return runs


def daemon_run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    # production starts on the plain defaults
    with production(DEFAULTS, tmp, "daemon", queue=args.queue_in_balancer) as bal:
        agent = tmp / "prod.yaml"
        agent.write_text(yaml.safe_dump(agent_yaml(tmp, bal, args), sort_keys=False))
        sd = tmp / "state"
        dlog = open(tmp / "daemon.log", "wb")  # noqa: SIM115 - closed below
        daemon = subprocess.Popen(["nice", "-n", "5", sys.executable, "-m", "tuner.cli", "daemon", str(agent),
                                   "--state-dir", str(sd)], cwd=REPO, stdout=dlog, stderr=subprocess.STDOUT)
        book = sd / "prod" / "scenarios"

        def learnt(phase: str) -> bool:  # its cycle ended (cross-evaluation included) and its champion serves
            cyc = sd / "prod" / "cycles.jsonl"
            cycles = [json.loads(x) for x in cyc.read_text().splitlines()] if cyc.is_file() else []
            service = json.loads((book / "service.json").read_text()) if (book / "service.json").is_file() else {}
            return service.get("scenario") == phase and any(c.get("scenario") == phase for c in cycles)

        learning: list[dict[str, Any]] = []
        measured: list[dict[str, Any]] = []
        try:
            for phase in ("concurrent", "single"):  # the learning pass: until the daemon has tuned each
                t0 = time.time()
                while time.time() - t0 < args.max_learn_s:
                    if daemon.poll() is not None:
                        raise RuntimeError(f"the daemon exited {daemon.returncode}: "
                                           f"{(tmp / 'daemon.log').read_text(errors='replace')[-1500:]}")
                    learning.append(bench(bal.url, phase, 60, tmp / f"learn-{len(learning)}.json",
                                          seed=len(learning)))
                    if learnt(phase):
                        break
                print(f"learning {phase}: {time.time() - t0:.0f} s", file=sys.stderr)
            for i, phase in enumerate(MEASURED):  # the measured pass: fixed phases, champions known
                measured.append(bench(bal.url, phase, args.phase_s, tmp / f"measured-{i}.json", seed=100 + i))
                print(f"measured {i} {phase}: {figures(measured[-1])}", file=sys.stderr)
        finally:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(120)
            except subprocess.TimeoutExpired:
                daemon.kill()
            dlog.close()

    def jsonl(p: Path) -> list[dict[str, Any]]:
        return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.is_file() else []

    return {"learning": learning, "measured": measured, "journal": jsonl(book / "switches.jsonl"),
            "moves": jsonl(tmp / "moves.jsonl"), "cycles": jsonl(sd / "prod" / "cycles.jsonl"),
            "matrix": json.loads((book / "matrix.json").read_text()) if (book / "matrix.json").is_file() else None,
            "champions": {s: yaml.safe_load(p.read_text())["config"] for s in ("concurrent", "single")
                          if (p := book / s / "champion.yaml").is_file()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--phase-s", type=float, default=180, help="seconds of traffic in each measured phase")
    ap.add_argument("--trial-s", type=float, default=30, help="seconds of traffic in each tuning trial")
    ap.add_argument("--max-learn-s", type=float, default=1500)
    ap.add_argument("--dwell-s", type=float, default=4)
    ap.add_argument("--window-s", type=float, default=6)
    ap.add_argument("--keep-warm", type=int, default=1, help="servers apply.py keeps warm for a move back (0: none)")
    ap.add_argument("--cross-eval-runs", type=int, default=2)
    ap.add_argument("--trials", type=int, default=6, help="tuning trials per scenario cycle (the first: the baseline)")
    ap.add_argument("--seed", type=int, default=0, help="the sampler's seed")
    ap.add_argument("--candidates", action=argparse.BooleanOptionalAction, default=True,
                    help="each scenario's study tries the Flash-style profile right after the baseline")
    # off by default: the daemon observes the workload from the engine's own gauges, and a queue in the balancer
    # hides the requests waiting there (a 20-s smoke run observed a concurrency of 3 under 32 in flight)
    ap.add_argument("--queue-in-balancer", action=argparse.BooleanOptionalAction, default=False,
                    help="each server holds at most twice the requests it runs at once (HAProxy maxconn), the rest "
                         "wait in the balancer, so a switch hands the waiting requests to the new server at once")
    ap.add_argument("--keep", type=Path, help="copy the daemon's log, journals and every request's times here")
    ap.add_argument("--report-from", type=Path, help="print the table again from a kept raw.json")
    args = ap.parse_args()
    if args.report_from is not None:
        raw = json.loads(args.report_from.read_text())
        kept = Loads(sample=False)
        kept.samples = [tuple(x) for x in raw["loads"]]
        ended = raw.get("ended") or kept.samples[-1][0]  # (a raw.json of a run before these keys: the last sample)
        report(raw["statics"], raw["daemon"], raw["spans"], kept, args,
               raw.get("wall_s") or ended - raw["spans"]["statics before"][0], ended=ended)
        return
    loads = Loads()
    t_start = time.time()
    with tempfile.TemporaryDirectory(prefix="production-loop-") as d:
        tmp = Path(d) if args.keep is None else args.keep / "work"  # with --keep, every log stays there
        tmp.mkdir(parents=True, exist_ok=True)
        statics: dict[str, list[list[dict]]] = {"defaults": [], "flash": []}
        spans: dict[str, tuple[float, float]] = {}
        a = time.time()
        statics["defaults"].append(static_pass("defaults", DEFAULTS, args, tmp, 1))
        statics["flash"].append(static_pass("flash", FLASH, args, tmp, 1))
        spans["statics before"] = (a, time.time())
        a = time.time()
        dm = daemon_run(args, tmp)
        spans["daemon learning"] = (a, dm["measured"][0]["start"] if dm["measured"] else time.time())
        spans["daemon measured"] = (spans["daemon learning"][1], time.time())
        a = time.time()
        statics["flash"].append(static_pass("flash", FLASH, args, tmp, 2))
        statics["defaults"].append(static_pass("defaults", DEFAULTS, args, tmp, 2))
        spans["statics after"] = (a, time.time())
        loads.stop()
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            (args.keep / "raw.json").write_text(json.dumps({"statics": statics, "daemon": dm, "spans": spans,
                                                            "loads": loads.samples, "ended": time.time(),
                                                            "wall_s": time.time() - t_start}, default=str))
            for f in ("daemon.log", "state/prod/cycles.jsonl", "state/prod/scenarios/switches.jsonl",
                      "moves.jsonl", "state/prod/scenarios/matrix.json"):
                if (tmp / f).is_file():
                    shutil.copy(tmp / f, args.keep / Path(f).name)
    report(statics, dm, spans, loads, args, time.time() - t_start)


def spread(xs: list[float], fmt: str = "{:.1f}") -> str:
    if not xs:
        return "-"
    mid = fmt.format(statistics.fmean(xs))
    return mid if len(xs) == 1 else f"{mid} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def report(statics: dict[str, list[list[dict]]], dm: dict[str, Any], spans: dict[str, tuple[float, float]],
           loads: Loads, args: argparse.Namespace, wall_s: float, ended: float | None = None) -> None:
    hhmm: Callable[[float], str] = lambda t: time.strftime("%H:%M:%S", time.localtime(t))  # noqa: E731
    print(f"Preset {PRESET}, {THREADS} engine thread, max_model_len {MAX_MODEL_LEN}; phases: "
          + "; ".join(f"{k}: {v['concurrency']} in flight, {v['prompt_tokens']}-token prompts, "
                      f"{v['output_tokens']}-token answers" for k, v in PHASES.items())
          + f". Measured phases {args.phase_s:g} s, tuning trials {args.trial_s:g} s; watch every 1 s over a "
          f"{args.window_s:g} s window, dwell {args.dwell_s:g} s, cross_eval_runs {args.cross_eval_runs}. "
          f"Whole run {wall_s / 60:.1f} min ({hhmm(spans['statics before'][0])}-{hhmm(ended or time.time())}), "
          f"{os.cpu_count()} cores shared.\n")
    print("| part | from | to | 1-min load average, median (min-max) |\n|---|---|---|---|")
    for k, (a, b) in spans.items():
        ls = loads.between(a, b)
        print(f"| {k} | {hhmm(a)} | {hhmm(b)} | {statistics.median(ls) if ls else float('nan'):.1f} "
              f"({min(ls, default=float('nan')):.1f}-{max(ls, default=float('nan')):.1f}) |")

    runs = [("learning", r) for r in _merge_phases(dm["learning"])] + [("measured", r) for r in dm["measured"]]
    print("\n### Detection and switching (seconds from the phase's first request)\n")
    print("Detected: the observation that decided (its window's end); new server ready: the apply command's "
          "server with the champion's configuration answers /health (a warm standby: at once); traffic moved: it "
          "passed the balancer's health "
          "check and the old one got weight 0; drained: the old one's last request ended and it left.\n")
    print("| pass | phase | traffic from | first decision | detected s | new server ready s | traffic moved s | "
          "old drained s | in service |")
    print("|---|---|---|---|---:|---:|---:|---:|---|")
    moves = dm["moves"]
    nan = float("nan")
    for k, (pas, r) in enumerate(runs):
        end = runs[k + 1][1]["start"] if k + 1 < len(runs) else float("inf")
        dec = [e for e in dm["journal"] if r["start"] <= e["time"] < end and e.get("scenario") == r["phase"]]
        first = min(dec, key=lambda e: e["time"]) if dec else None
        mv = next((m for m in moves if r["start"] <= m["time"] < end), None)
        det = ((first.get("observation") or {}).get("end_s") or first["time"]) if first else None
        t0 = r["t0"]
        print(f"| {pas} | {r['phase']} | {hhmm(t0)} | {first['kind'] if first else '-'} | "
              f"{det - t0 if det else nan:.0f} | {mv['time'] - mv['up_s'] - t0 if mv else nan:.0f} | "
              f"{mv['time'] - t0 if mv else nan:.0f} | {mv['time'] + mv['drain_s'] - t0 if mv else nan:.0f} | "
              f"{profile(mv['config']) + (' (warm standby)' if mv.get('warm_standby') else '') if mv else '-'} |")

    print("\n### Goodput and latency in each phase (measured pass against the static configurations)\n")
    print("Goodput: output tokens/s of the completed requests from the phase's first request to its last answer; "
          "latency: mean end-to-end of the requests sent in the phase. Static: two passes each (before and after "
          "the daemon), mean (min-max). Daemon: each measured phase whole (the detection and the move included), "
          "and from the moment its traffic moved.\n")
    print("| phase | configuration | n | goodput tok/s | mean E2EL ms | completed | failed | vs better static "
          "goodput | seed |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for phase in ("concurrent", "single"):
        st = {n: [figures(p[STATIC.index(phase)]) for p in statics[n]] for n in ("defaults", "flash")}
        best = max(statistics.fmean(x["tok_s"] for x in v) for v in st.values())
        mine = [r for r in dm["measured"] if r["phase"] == phase]
        whole = [figures(r) for r in mine]
        after = []
        for r in mine:
            mv = next((m for m in moves if r["start"] <= m["time"] <= r["end"]), None)
            after.append(figures(r, since=mv["time"]) if mv else figures(r))
        rows = [("defaults (static)", st["defaults"]), ("Flash-style (static)", st["flash"]),
                ("daemon, whole phase", whole), ("daemon, after the move", after)]
        for name, fs in rows:
            tok = [f["tok_s"] for f in fs]
            print(f"| {phase} | {name} | {len(fs)} | {spread(tok)} | {spread([f['e2el_ms'] for f in fs], '{:.0f}')} | "
                  f"{sum(f['completed'] for f in fs)} | {sum(f['failed'] for f in fs)} | "
                  f"{statistics.fmean(tok) / best if tok else float('nan'):.2f}x | "
                  f"{SEED_RATIOS[phase] if name.startswith('Flash') else ''} |")
    fl = {ph: statistics.fmean(figures(p[STATIC.index(ph)])["tok_s"] for p in statics["flash"]) /
          statistics.fmean(figures(p[STATIC.index(ph)])["tok_s"] for p in statics["defaults"]) for ph in STATIC}
    print(f"\nFlash-style / defaults goodput (static means): concurrent {fl['concurrent']:.2f}x, single "
          f"{fl['single']:.2f}x.")

    print("\n### The daemon's cycles\n")
    print("| start | scenario | study | warm from | observed concurrency | observed output tokens | trials | check "
          "| cross-evaluated | wall s |")
    print("|---|---|---|---|---:|---:|---|---|---|---:|")
    for c in dm["cycles"]:
        if c.get("skipped"):
            continue
        s = (c.get("observed") or {}).get("stats") or {}
        print(f"| {hhmm(c['start_time'])} | {c.get('scenario') or '-'} | {c.get('study')} | {c.get('warm_from')} | "
              f"{s.get('concurrency_mean', float('nan')):.2f} | {s.get('output_tokens_mean', float('nan')):.0f} | "
              f"{c.get('trials')} | {(c.get('check') or {}).get('action')} | {bool(c.get('cross_evaluated'))} | "
              f"{c['end_time'] - c['start_time']:.0f} |")
    print("\nScenario champions: " + "; ".join(f"{s}: {profile(c)}" for s, c in dm["champions"].items()))
    m = dm.get("matrix")
    if m:
        print(f"\n### Cross-evaluation (tuner.scenarios.matrix, {m['runs']} interleaved runs per cell, "
              f"{m['confidence']:.0%} intervals)\n")
        print("| scenario's traffic | configuration | output tok/s per run | own champion's gain vs it [interval] |")
        print("|---|---|---|---|")
        for scn, cell in m["cells"].items():
            g = m["gains"][scn]
            for name, c in cell["configs"].items():
                vs = g["vs"].get(name)
                gain = "own" if name == g["own"] else (
                    "-" if vs is None or vs.get("improvement") is None else
                    f"{vs['improvement']:+.0%} [{vs['low']:+.0%}, {vs['high']:+.0%}]")
                vals = ", ".join("-" if v is None else f"{v:.1f}" for v in c["values"])
                print(f"| {scn} | {name} ({profile(m['configs'][name])}) | {vals} | {gain} |")


def _merge_phases(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The learning pass's 60-s runs joined into one run per phase."""
    out: list[dict[str, Any]] = []
    for r in runs:
        if out and out[-1]["phase"] == r["phase"]:
            out[-1] = {**out[-1], "end": r["end"], "requests": out[-1]["requests"] + r["requests"]}
        else:
            out.append(dict(r))
    return out


def profile(cfg: dict[str, Any]) -> str:
    """"defaults", "Flash-style", or the knobs a configuration changes from the defaults."""
    full = {**DEFAULTS, **cfg}
    if all(full.get(k) == v for k, v in FLASH.items()):
        return "Flash-style"
    changed = {k: v for k, v in full.items() if k in DEFAULTS and v != DEFAULTS[k]}
    return "defaults" if not changed else "custom: " + ", ".join(
        f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in changed.items())


if __name__ == "__main__":
    main()
