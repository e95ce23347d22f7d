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
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import run  # noqa: E402

from tuner.monitor.classify import Event  # noqa: E402

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
    cuts = run.trim_and_cut(args, phases, sets, cfg, expect)
    print("command: `python experiments/detection/repeats.py " + " ".join(sys.argv[1:]) + "`\n")
    print(f"| set | windows | hours | events | of them a repeat of the set's {TOP} farthest windows | by chance | "
          "per 24 h, all / not a repeat | the repeated windows (index: signal x its median) |")
    print("|---|---:|---:|---:|---:|---:|---|---|")
    for name, label in sets:
        stat = [w for _, w in phases[name]][cuts[name]:]
        row = run.row_label(name, label)
        index = {id(w): i for i, w in enumerate(stat)}
        far: dict[str, list[int]] = {}
        events = repeats = 0
        seen: dict[tuple[int, str], int] = {}
        watched = 0
        for s, windows in run.bootstrap_streams(row, stat, 1, cfg, args):
            full: list[tuple[int, Event]] = []
            run.replay(windows, cfg, run.Gpu(args.gpu_noise, 100 + s), expect, full=full)
            watched += len(windows) - cfg.learn_windows
            for j, e in full:
                if e.kind not in ("drift", "anomaly", "saturation"):
                    continue
                events += 1
                last = [index[id(x)] for x in windows[max(0, j - LOOK + 1):j + 1]]
                for sig in e.signals:
                    if sig not in far:
                        far[sig] = extremes(stat, sig)
                    hits = [i for i in last if i in far[sig]]
                    if len(hits) >= 2:
                        repeats += 1
                        for i in set(hits):
                            seen[(i, sig)] = seen.get((i, sig), 0) + 1
                        break
        hours = watched * cfg.interval_s / 3600
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
