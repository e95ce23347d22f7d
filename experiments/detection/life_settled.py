"""A life's stationary windows without each return's settling, replayed as run.py replays a stationary phase.

run.py's stationary set of a stream recorded by record_vllm.py --life is every calm window of the life, those right
after the traffic went back to its base rate among them: there the server may still be settling (vllm7: its ITL
mean fell from 5.2 to 3.3 ms over the 20 windows after the first return), and in the server's own life the monitor
spends them learning a new baseline after the drift it found. This leaves out the learn_windows + 2 windows after
each return and prints run.py's false-alarm rows for the rest: whether the stationary set's false alarms come from
that settling.

    python experiments/detection/life_settled.py --streams vllm7=recorded-vllm-life.jsonl.gz --tuned none \
        --held-out vllm7/stationary_b --sim-model ../sim-calibration/model-cpu.json --hours 1200

(run.py's options; the first held-out set's stream must be a --life recording.)
"""

from __future__ import annotations

import logging
import sys

import run


def main() -> None:
    args = run.parser().parse_args()
    logging.getLogger("tuner.monitor").setLevel(logging.ERROR)
    _, _, sets, cfg, expect, lives = run.setup(args)
    name = args.held_out[0]
    tag = name.rpartition("/")[0]
    if tag not in lives:
        raise SystemExit(f"--held-out {name}: not the stationary phase of a stream recorded with record_vllm.py --life")
    seq = lives[tag]
    returns = [a for a, _, c in run.changes_of(seq) if c in run.RETURNS.values()]
    settling = {i for a in returns for i in range(a, a + cfg.learn_windows + 2)}
    calm = [w for i, (p, w) in enumerate(seq) if p == run.CALM and i not in settling]
    print("command: `python experiments/detection/life_settled.py " + " ".join(sys.argv[1:]) + "`\n")
    print(f"{len(calm)} of the life's {sum(p == run.CALM for p, _ in seq)} stationary windows: each return's first "
          f"{cfg.learn_windows + 2} left out (windows {', '.join(map(str, sorted(settling)))})\n")
    print("| set | stream | hours watched | events | per 24 h | episodes | per 24 h | kinds | "
          "windows whose latencies were not judged |")
    print("|---|---|---:|---:|---:|---:|---:|---|---:|")
    run.false_alarms(f"{name}, each return's settling left out", calm, run.warmup(calm, cfg, expect), cfg, expect,
                     args)


if __name__ == "__main__":
    main()
