"""Input drifts only (rate, prompt and output means) on stationary streams, bootstrapped window by window, N x 4 h
per stream; MODE lin (shipped), log (all inputs on the log scale), sqrtlog (Anscombe sqrt of the rate count, log of
the length means). Counts are alarmed input signals of the drifts (one drift may carry two).
Run from the repository root: N=300 MODE=lin python experiments/detection/input_false_alarms.py"""
import collections
import dataclasses
import math
import os
import random
import sys

sys.path.insert(0, "experiments/detection")
from pathlib import Path

import run

import tuner.monitor.classify as C
from tuner.monitor.classify import Monitor, MonitorConfig
from tuner.monitor.signals import INPUTS

MODE = os.environ.get("MODE", "lin")
if MODE in ("sqrtlog", "log"):
    for k in ("prompt_tokens_mean", "output_tokens_mean"):
        C.RULES[k] = dataclasses.replace(C.RULES[k], log=True)
if MODE == "log":
    C.RULES["rate_per_s"] = dataclasses.replace(C.RULES["rate_per_s"], log=True)
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
allc = collections.Counter()
for tag, f, name in files:
    p, _ = run.load(Path("experiments/detection") / f)
    ws = [w for _, w in p[name]]
    cfg = MonitorConfig(interval_s=15)
    stat = ws[run.warmup(ws, cfg, expect):]
    if MODE == "sqrtlog":
        stat = [{**w, "rate_per_s": math.sqrt(w["rate_per_s"] * cfg.interval_s + 3 / 8)} if "rate_per_s" in w else w
                for w in stat]
    rng = random.Random(int(os.environ.get("SEED", "0")))
    cnt = collections.Counter()
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
    print(MODE, tag, N * 4, sum(cnt.values()), dict(sorted(cnt.items())), flush=True)
per_day = round(sum(allc.values()) / (len(files) * N * 4 / 24), 3)
print(MODE, "total", sum(allc.values()), "per day", per_day, dict(sorted(allc.items())))
