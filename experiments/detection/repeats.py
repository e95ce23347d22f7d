"""Which of a stationary set's windows its window-by-window bootstrap's false alarms are made of.

    python experiments/detection/repeats.py --streams vllm13=recorded-vllm-capacity4.jsonl.gz --tuned none \\
        --held-out vllm13/stationary_b --sim-model ../sim-calibration/model-cpu.json --hours 240

run.py's options, its rows' own draws (run.bootstrap_replays' seeds: the same windows and events as the row
"bootstrap, window by window" of run.py's table at these --hours) and its warm-up cut (--cut, else MSER-5). For each
event (drift, anomaly, saturation), the signals it names: an event is made of a repeat where at least two of the
windows it alarmed on (the alarm's window and the LOOK - 1 before it) are among the set's TOP windows farthest
from that signal's median (on the log scale), counting a window drawn twice twice. A set of N windows draws two of
its TOP windows into LOOK consecutive places by chance in about C(LOOK, 2) (TOP / N)^2 of the places: the share
of events to expect if the alarms had nothing to do with those windows. In the recorded order (run.py's rows "as
recorded, from each of ... starts") a window never follows itself.
"""

from __future__ import annotations

import math
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import run  # noqa: E402

TOP = 2  # the set's windows farthest from a signal's median that count
LOOK = 3  # the alarm's window and the ones before it that count


def extremes(stat: list[run.Window], signal: str) -> list[int]:
    """The indices of the TOP windows of `stat` farthest from the signal's median on the log scale."""
    vals = {i: w[signal] for i, w in enumerate(stat) if w.get(signal, 0) > 0}
    if not vals:
        return []
    med = statistics.median(vals.values())
    return sorted(vals, key=lambda i: abs(math.log(vals[i] / med)), reverse=True)[:TOP]


def main() -> None:
    args = run.parser().parse_args()
    phases, _, sets, cfg, expect, _ = run.setup(args)
    given = dict(item.partition("=")[::2] for item in args.cut)
    n = int(args.stream_hours * 3600 / cfg.interval_s)
    print("command: `python experiments/detection/repeats.py " + " ".join(sys.argv[1:]) + "`\n")
    print(f"| set | windows | hours | events | of them a repeat of the set's {TOP} farthest windows | by chance | "
          "per 24 h, all / not a repeat | the repeated windows (index: signal x its median) |")
    print("|---|---:|---:|---:|---:|---:|---|---|")
    for name, label in sets:
        recorded = [w for _, w in phases[name]]
        cut = (int(given[name]) if name in given else 0 if args.no_warmup_cut
               else run.warmup(recorded, cfg, expect))
        stat = recorded[cut:]
        row = run.row_label(name, label)
        index = {id(w): i for i, w in enumerate(stat)}
        far: dict[str, list[int]] = {}
        rng = random.Random(f"{args.seed}/{row}/1")
        events = repeats = 0
        seen: dict[tuple[int, str], int] = {}
        streams = max(1, round(args.hours / args.stream_hours))
        for s in range(streams):
            windows = run.bootstrap(stat, n + cfg.learn_windows, 1, rng,
                                    distinct=0 if args.learning_repeats else cfg.learn_windows)
            m = run.Monitor(cfg, expect)
            gpu = run.Gpu(args.gpu_noise, 100 + s)
            for j, w in enumerate(windows):
                for e in m.observe(cfg.interval_s * j, w if run.recorded_gpu(w) else {**w, **gpu.read()}):
                    if e.kind not in ("drift", "anomaly", "saturation"):
                        continue
                    events += 1
                    last = [index[id(x)] for x in windows[max(0, j - LOOK + 1):j + 1]]
                    for sig in e.signals:
                        top = far.setdefault(sig, extremes(stat, sig))
                        hits = [i for i in last if i in top]
                        if len(hits) >= 2:
                            repeats += 1
                            for i in set(hits):
                                seen[(i, sig)] = seen.get((i, sig), 0) + 1
                            break
        hours = streams * n * cfg.interval_s / 3600
        chance = math.comb(LOOK, 2) * (TOP / len(stat)) ** 2
        cells = []
        for (i, sig), _ in sorted(seen.items(), key=lambda kv: -kv[1]):
            med = statistics.median(w[sig] for w in stat if w.get(sig, 0) > 0)
            cells.append(f"{i}: {sig} x{stat[i][sig] / med:.2f}")
        share = f"{repeats / events:.0%}" if events else "-"
        print(f"| {row} | {len(stat)} | {hours:.0f} | {events} | {repeats} ({share}) | {chance:.1%} | "
              f"{events * 24 / hours:.2f} / {(events - repeats) * 24 / hours:.2f} | {', '.join(cells) or '-'} |")


if __name__ == "__main__":
    main()
