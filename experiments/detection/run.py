"""Detection experiment: false alarms on stationary traffic and delay, misses and classification on injected
changes, from /metrics streams recorded from the reference engine (record.py) and replayed through
tuner.monitor's Monitor at full speed.

    python experiments/detection/run.py --streams experiments/detection/streams.jsonl.gz [--hours 240]

- stationary, real order: the recorded stationary phase as it came (the real run against the engine).
- stationary, replayed: streams of --hours in all, made by a moving-block bootstrap of the recorded stationary
  windows (blocks of --block windows keep the noise's autocorrelation), each stream `--stream-hours` long.
- injected: a stationary stretch (learning + --pre windows) followed by windows of a recorded changed phase:
  rate x2, prompt length x2, output length x4 (each a `tuner bench` load of its own), the engine's per-step
  delay raised (a real server slowdown at the same load), the stationary windows' latencies x1.3 (the same
  slowdown as a model), and a GPU power throttle on the NVML double (tests/support/nvml_double.py). --trials
  trials each at random offsets; delay counts windows from the change (1: found at the end of the first
  changed window); a miss finds nothing within --post windows.
GPU signals come from the NVML double in every stream (noise --gpu-noise of each reading: no GPU here).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.nvml_double import ControlledNvml  # noqa: E402
from tuner.measure.scrape import parse  # noqa: E402
from tuner.monitor.classify import TESTS, Monitor, MonitorConfig  # noqa: E402
from tuner.monitor.signals import LATENCIES, window_signals  # noqa: E402
from tuner.monitor.telemetry import NvmlTelemetry  # noqa: E402

Window = dict[str, float]
EXPECT = {"rate_x2": "drift", "prompt_x2": "drift", "output_x4": "drift", "slowdown": "anomaly",
          "slowdown30": "anomaly", "slowdown_model": "anomaly", "gpu_throttle": "anomaly"}
BEFORE = {"slowdown30": "base2"}  # a change recorded with a baseline phase of its own (same engine settings)


def load(path: Path) -> tuple[dict[str, list[tuple[float, Window]]], dict[str, float]]:
    """Phase -> its windows (end time, signals), from consecutive scrapes of one phase; and each phase's step
    delay."""
    rows = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except ValueError:
                break  # a stream cut off while it was written
    rows = [r for r in rows if r["phase"] and r["text"]]
    out: dict[str, list[tuple[float, Window]]] = {}
    delay: dict[str, float] = {}
    for a, b in zip(rows, rows[1:], strict=False):
        if a["phase"] != b["phase"]:
            continue
        sig = window_signals(parse(a["text"]), parse(b["text"]), b["t"] - a["t"])
        if sig is not None:
            out.setdefault(b["phase"], []).append((b["t"], sig))
            delay[b["phase"]] = b["step_delay_ms"]
    return out, delay


class Gpu:
    """GPU signals per window from the NVML double (through the monitor's own NVML path)."""

    def __init__(self, noise: float, seed: int) -> None:
        self.nv = ControlledNvml(1, noise_frac=noise, seed=seed)
        self.tel = NvmlTelemetry([0], nvml=self.nv)

    def read(self) -> Window:
        return self.tel.read()


def bootstrap(windows: list[Window], n: int, block: int, rng: random.Random) -> list[Window]:
    out: list[Window] = []
    while len(out) < n:
        i = rng.randrange(0, len(windows) - block + 1)
        out.extend(windows[i:i + block])
    return out[:n]


def replay(windows: list[Window], cfg: MonitorConfig, gpu: Gpu,
           at: int | None = None, on_change: Callable[[], None] | None = None) -> list[tuple[int, str, str]]:
    """(window index, kind, cause) of every event; `on_change` runs before window `at`."""
    m = Monitor(cfg)
    out = []
    for i, w in enumerate(windows):
        if at is not None and i == at and on_change is not None:
            on_change()
        for e in m.observe(cfg.interval_s * i, {**w, **gpu.read()}):
            out.append((i, e.kind, e.cause))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=Path, nargs="+", required=True)
    ap.add_argument("--hours", type=float, default=240.0)
    ap.add_argument("--stream-hours", type=float, default=24.0)
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--pre", type=int, default=20)
    ap.add_argument("--post", type=int, default=20)
    ap.add_argument("--gpu-noise", type=float, default=0.01)
    ap.add_argument("--false-alarms-per-day", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stationary", default="stationary", help="the phase of stationary traffic")
    ap.add_argument("--learn-windows", type=int, default=20)
    ap.add_argument("--z-clip", type=float, default=None)
    ap.add_argument("--settle-windows", type=int, default=1)
    args = ap.parse_args()
    phases: dict[str, list[tuple[float, Window]]] = {}
    delays: dict[str, float] = {}
    for path in args.streams:
        p, d = load(path)
        phases.update(p)
        delays.update(d)
    stat = [w for _, w in phases[args.stationary]]
    times = [t for t, _ in phases[args.stationary]]
    interval = statistics.median(b - a for a, b in zip(times, times[1:], strict=False))
    cfg = MonitorConfig(interval_s=round(interval), false_alarms_per_day=args.false_alarms_per_day,
                        learn_windows=args.learn_windows, z_clip=args.z_clip,
                        settle_windows=args.settle_windows)
    rng = random.Random(args.seed)
    print(f"# detection experiment ({time.strftime('%Y-%m-%d %H:%M')})\n")
    print(f"windows of {cfg.interval_s:g} s; {TESTS} one-sided tests; CUSUM k = {cfg.k}, h = {cfg.h:.3f} "
          f"(for {cfg.false_alarms_per_day:g} false alarm a day); baseline from {cfg.learn_windows} windows; "
          f"z clipped at {cfg.clip:.2f}; settle {cfg.settle_windows} window(s)\n")
    print("command: `python experiments/detection/run.py " + " ".join(sys.argv[1:]) + "`\n")
    print("| phase | windows | step delay ms | rate /s | prompt | output | ITL ms mean | TTFT ms p50 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, ws in phases.items():
        def med(k: str, ws: list[tuple[float, Window]] = ws) -> float:
            vals = [w[k] for _, w in ws if k in w]
            return statistics.median(vals) if vals else float("nan")
        print(f"| {name} | {len(ws)} | {delays[name]:g} | {med('rate_per_s'):.2f} | {med('prompt_tokens_mean'):.0f} "
              f"| {med('output_tokens_mean'):.1f} | {med('itl_ms_mean'):.1f} | {med('ttft_ms_p50'):.0f} |")

    # ---- false alarms
    print("\n## False alarms on stationary traffic\n")
    print("| stream | hours watched | events | per 24 h | kinds |")
    print("|---|---:|---:|---:|---|")
    ev = replay(stat, cfg, Gpu(args.gpu_noise, args.seed))
    hours = max(1, len(stat) - cfg.learn_windows) * cfg.interval_s / 3600
    real = [e for e in ev if e[1] != "recovery"]
    print(f"| real run, recorded order | {hours:.2f} | {len(real)} | {len(real) / hours * 24:.1f} | "
          f"{', '.join(f'{k}/{c}@{i}' for i, k, c in ev) or '-'} |")
    n = int(args.stream_hours * 3600 / cfg.interval_s)
    t0 = time.monotonic()
    for block in (1, args.block):
        total_h, kinds = 0.0, {}
        for s in range(max(1, round(args.hours / args.stream_hours))):
            ev = replay(bootstrap(stat, n + cfg.learn_windows, block, rng), cfg, Gpu(args.gpu_noise, 100 + s))
            total_h += n * cfg.interval_s / 3600
            for _, k, c in ev:
                kinds[f"{k}/{c}"] = kinds.get(f"{k}/{c}", 0) + 1
        alarms = sum(v for k, v in kinds.items() if not k.startswith("recovery"))
        how = "windows drawn one by one" if block == 1 else f"blocks of {block} windows"
        print(f"| replayed (bootstrap, {how}) | {total_h:.0f} | {alarms} | {alarms / total_h * 24:.2f} | "
              f"{', '.join(f'{k} {v}' for k, v in sorted(kinds.items())) or '-'} |")
    print(f"\n(events: drift, anomaly and saturation; recoveries listed, not counted. Replay: "
          f"{time.monotonic() - t0:.0f} s for all the replayed hours)")

    # ---- injected changes
    print("\n## Injected changes\n")
    print(f"{args.trials} trials each; a stationary stretch ({cfg.learn_windows} learning + {args.pre} windows) "
          f"then the change; up to {args.post} windows to find it.\n")
    print("| change | source | trials | found | missed | median delay (windows) | p90 delay | classified as "
          "expected | first drift/anomaly events | with a saturation event | with a false alarm before |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    lead = cfg.learn_windows + args.pre
    for change in [c for c in EXPECT if c in phases or c in ("slowdown_model", "gpu_throttle")]:
        delays_w: list[int] = []
        missed, right, sat, had_early, firsts = 0, 0, 0, 0, {}
        for tr in range(args.trials):
            i = rng.randrange(0, len(stat) - lead - args.post)
            before = stat[i:i + lead]
            if change in BEFORE:  # its own baseline phase just before the change, stationary windows before that
                own = [w for _, w in phases[BEFORE[change]]][-lead:]
                before = before[:lead - len(own)] + own
            gpu = Gpu(args.gpu_noise, 1000 + tr)
            hook = None
            if change in ("rate_x2", "prompt_x2", "output_x4", "slowdown", "slowdown30"):
                src = [w for _, w in phases[change]]
                j = rng.randrange(0, max(1, len(src) - args.post))
                after = src[j:j + args.post]
                source = f"recorded phase `{change}`"
            elif change == "slowdown_model":
                after = [{k: v * 1.3 if k in LATENCIES else v for k, v in w.items()}
                         for w in stat[i + lead:i + lead + args.post]]
                source = "stationary windows, latencies x1.3"
            else:
                after = stat[i + lead:i + lead + args.post]
                hook = lambda nv=gpu.nv: nv.throttle(cap_w=350.0, clock_frac=0.7)  # noqa: E731
                source = "NVML double: 350 W cap, SM clock x0.7"
            ev = [e for e in replay(before + after, cfg, gpu, at=lead, on_change=hook)]
            after_ev = [e for e in ev if e[0] >= lead and e[1] != "recovery"]
            early = [e for e in ev if e[0] < lead]
            sat += any(e[1] == "saturation" for e in after_ev)
            found = [e for e in after_ev if e[1] != "saturation"]  # saturation is reported beside drift/anomaly
            if not found:
                missed += 1
                continue
            k = found[0]
            delays_w.append(k[0] - lead + 1)
            right += k[1] == EXPECT[change]
            had_early += bool(early)
            firsts[f"{k[1]}/{k[2]}"] = firsts.get(f"{k[1]}/{k[2]}", 0) + 1
        med = statistics.median(delays_w) if delays_w else float("nan")
        p90 = sorted(delays_w)[int(0.9 * (len(delays_w) - 1))] if delays_w else float("nan")
        print(f"| {change} | {source} | {args.trials} | {len(delays_w)} | {missed} | {med:g} | {p90:g} | "
              f"{right}/{args.trials} | {', '.join(f'{k} {v}' for k, v in sorted(firsts.items()))} | {sat} | "
              f"{had_early} |")


if __name__ == "__main__":
    main()
