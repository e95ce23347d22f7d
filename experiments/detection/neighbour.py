"""A noisy neighbour for a recording: worker processes that each spin on a CPU for a random spell, then sleep for
one, until stopped (SIGTERM or SIGINT). Its load comes and goes, as a shared host's other tenants' does.

    python experiments/detection/neighbour.py --workers 2 --seed 3 &
    nice -n 5 python experiments/detection/record.py --out experiments/detection/recorded-busy3.jsonl.gz \
        --only slowdown30,stationary_b --seed 300
    kill %1
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import signal
import time


def spell(text: str) -> tuple[float, float]:
    """'LOW:HIGH' seconds, as two floats with 0 <= LOW <= HIGH."""
    low, _, high = text.partition(":")
    lo, hi = float(low), float(high or low)
    if not 0 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"a spell is LOW:HIGH seconds with 0 <= LOW <= HIGH, got {text!r}")
    return lo, hi


def work(seed: int, busy_s: tuple[float, float], idle_s: tuple[float, float]) -> None:
    rng = random.Random(seed)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    while True:
        end = time.monotonic() + rng.uniform(*busy_s)
        while time.monotonic() < end:
            sum(i * i for i in range(10_000))
        time.sleep(rng.uniform(*idle_s))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2, help="processes, each up to one CPU (default 2)")
    ap.add_argument("--busy-s", type=spell, default=(1.0, 30.0), help="a spell on the CPU, LOW:HIGH s (1:30)")
    ap.add_argument("--idle-s", type=spell, default=(1.0, 30.0), help="a spell asleep, LOW:HIGH s (1:30)")
    ap.add_argument("--seed", type=int, default=0, help="worker i draws its spells from seed + i")
    args = ap.parse_args()
    if args.workers < 1:
        ap.error(f"--workers must be >= 1, got {args.workers}")
    procs = [multiprocessing.Process(target=work, args=(args.seed + i, args.busy_s, args.idle_s), daemon=True)
             for i in range(args.workers)]
    for p in procs:
        p.start()
    stop = {"now": False}

    def halt(*_: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, halt)
    signal.signal(signal.SIGINT, halt)
    while not stop["now"] and all(p.is_alive() for p in procs):
        time.sleep(0.5)
    for p in procs:
        p.terminate()
        p.join(5)


if __name__ == "__main__":
    main()
