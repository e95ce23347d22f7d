"""Input drifts only (rate, prompt and output means) on stationary streams, bootstrapped window by window, N x 4 h
per stream. SCALES: shipped (the monitor's RULES: the rate on its own scale, log of the lengths), sqrtlog (sqrt of
the rate, log of the lengths), lin (all three on their own scale, as before 2026-12-03), log (all three on the log
scale); DRIFT: the inputs' drift to find (the monitor's MonitorConfig.drift_to_find_frac; "none": the CUSUM's k
alone). Counts are alarmed input signals of the drifts (one drift may carry two).
Run from the repository root: N=300 SCALES=shipped DRIFT=0.5 python experiments/detection/input_false_alarms.py"""
import collections
import dataclasses
import os
import random
import sys

sys.path.insert(0, "experiments/detection")
from pathlib import Path

import run

import tuner.monitor.config as C
from tuner.monitor.classify import Monitor
from tuner.monitor.config import MonitorConfig
from tuner.monitor.detect import Transform
from tuner.monitor.signals import INPUTS

SCALES = os.environ.get("SCALES", "shipped")
VARIANTS: dict[str, dict[str, Transform]] = {
    "lin": dict.fromkeys(INPUTS, "identity"), "log": dict.fromkeys(INPUTS, "log"),
    "sqrtlog": {**dict.fromkeys(INPUTS, "log"), "rate_per_s": "sqrt"}}
for k, transform in VARIANTS.get(SCALES, {}).items():  # this process's own table of rules, rewritten
    C.RULES[k] = dataclasses.replace(C.RULES[k], transform=transform)
DRIFT = os.environ.get("DRIFT", str(MonitorConfig.drift_to_find_frac))
files = [
    ("a", "recorded2.jsonl.gz", "stationary_a"),
    ("b", "recorded2.jsonl.gz", "stationary_b"),
    ("quiet", "recorded-quiet.jsonl.gz", "stationary_b"),
    ("quiet4", "recorded-quiet4.jsonl.gz", "stationary_b"),
    ("quiet5", "recorded-quiet5.jsonl.gz", "stationary_b"),
    ("quiet6", "recorded-quiet6.jsonl.gz", "stationary_b"),
    ("quiet7", "recorded-quiet7.jsonl.gz", "stationary_b"),
]
expect = run.expectation(Path("experiments/sim-calibration/model-cpu.json"))
N = int(os.environ.get("N", "60"))
tag_run = f"scales={SCALES} drift={DRIFT}"
allc: collections.Counter[str] = collections.Counter()
for tag, f, name in files:
    p, _ = run.load(Path("experiments/detection") / f)
    ws = [w for _, w in p[name]]
    cfg = MonitorConfig(interval_s=15, drift_to_find_frac=None if DRIFT == "none" else float(DRIFT))
    stat = ws[run.warmup(ws, cfg, expect):]
    rng = random.Random(int(os.environ.get("SEED", "0")))
    cnt: collections.Counter[str] = collections.Counter()
    n = int(4 * 3600 / cfg.interval_s)
    for _ in range(N):
        m = Monitor(cfg, expect)
        for i, w in enumerate(run.bootstrap(stat, n + cfg.learn_windows, int(os.environ.get("BLOCK", "1")), rng)):
            for e in m.observe(cfg.interval_s * i, {k: w[k] for k in (*INPUTS, "finished_per_s") if k in w}):
                if e.kind == "drift":
                    for k, v in e.signals.items():
                        if k in INPUTS:
                            cnt[k.split("_")[0] + ":" + v.get("direction")] += 1
    allc.update(cnt)
    print(tag_run, tag, N * 4, sum(cnt.values()), dict(sorted(cnt.items())), flush=True)
per_day = round(sum(allc.values()) / (len(files) * N * 4 / 24), 3)
print(tag_run, "total", sum(allc.values()), "per day", per_day, dict(sorted(allc.items())))
