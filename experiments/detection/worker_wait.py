"""A recorded vLLM stream whose CPU wait is its model worker's, not its engine core's.

vLLM's CPU build runs the model in a worker process (VLLM::Worker, its multiprocess executor) while the engine core
waits for each step's result on a shared-memory queue, spinning (`SpinCondition.wait`: sched_yield in a loop; py-spy,
the thirty-second step of the README): the engine core's thread is always ready to run, so its wait is the share of
the time the host's CPUs were contended, not the time the model's work waited for one. record_vllm.py read the
engine core until the thirty-second step; from then on each row also holds the worker's schedstat
(`cpu.worker_schedstat`). This script writes a copy of a stream whose `cpu.schedstat` is the worker's, so run.py,
bound.py and the rest read the worker's wait unchanged:

    python experiments/detection/worker_wait.py recorded.jsonl.gz recorded-worker-wait.jsonl.gz

A stream recorded before it has no worker's rows; `--side FILE --pid N` takes them from a file of timed reads
(one JSON object a line, gzipped or not: "t", and per process id its threads' schedstat lines) made beside the
recording, each row given the read nearest its time (within `--within-s`, else the row is left without a wait:
its `cpu` dropped).
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import sys
from pathlib import Path
from typing import Any


def side_reads(path: Path, pid: str) -> tuple[list[float], list[dict[str, str]]]:
    """The side file's read times and the process's threads at each, in time order."""
    rows = []
    with (gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8")) as f:
        for line in f:
            r = json.loads(line)
            if pid in r:
                rows.append((float(r["t"]), r[pid]))
    rows.sort(key=lambda x: x[0])
    return [t for t, _ in rows], [th for _, th in rows]


def nearest(times: list[float], t: float) -> int | None:
    if not times:
        return None
    i = bisect.bisect_left(times, t)
    return min((j for j in (i - 1, i) if 0 <= j < len(times)), key=lambda j: abs(times[j] - t))


def convert(rows: list[dict[str, Any]], side: tuple[list[float], list[dict[str, str]]] | None,
            within_s: float) -> tuple[list[dict[str, Any]], int]:
    """The rows with `cpu.schedstat` the worker's (where a row has none and no side read is near, its `cpu` is
    dropped: no wait for that window), and how many rows were left without one."""
    out, missing = [], 0
    for r in rows:
        r = dict(r)
        cpu = dict(r["cpu"]) if "cpu" in r else None
        threads = cpu.get("worker_schedstat") if cpu else None
        if threads is None and side is not None and cpu is not None:
            i = nearest(side[0], float(r["t"]))
            if i is not None and abs(side[0][i] - float(r["t"])) <= within_s:
                threads = side[1][i]
        if cpu is not None:
            if threads is None:
                missing += 1
                del r["cpu"]
            else:
                cpu["schedstat"] = threads
                r["cpu"] = cpu
        out.append(r)
    return out, missing


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stream", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--side", type=Path, help="timed reads of the worker's schedstat made beside the recording")
    ap.add_argument("--pid", help="--side: the worker's process id in it")
    ap.add_argument("--within-s", type=float, default=0.5, help="--side: the farthest read from a row's time")
    args = ap.parse_args()
    if (args.side is None) != (args.pid is None):
        ap.error("--side FILE and --pid N go together")
    if args.out.exists():
        ap.error(f"{args.out} exists: give a new file")
    with gzip.open(args.stream, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    side = side_reads(args.side, args.pid) if args.side else None
    out, missing = convert(rows, side, args.within_s)
    with gzip.open(args.out, "wt", encoding="utf-8") as f:
        for r in out:
            f.write(json.dumps(r) + "\n")
    print(f"{args.out}: {len(out)} rows, {missing} without the worker's schedstat (no wait there)", file=sys.stderr)


if __name__ == "__main__":
    main()
