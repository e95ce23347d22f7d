"""The closed loop's sign (MonitorConfig.queued_steady): how steady the requests in the server hold against what an
open loop's arrivals give them, on every recorded stream and on the engine's 1-s windows at capacity.

    python experiments/detection/closed_loop_sign.py record --out experiments/detection/probe-capacity-busy3.jsonl.gz \
        --busy 3
    python experiments/detection/closed_loop_sign.py table --probes experiments/detection/probe-capacity-*.jsonl.gz

`record`: the live capacity test's traffic (tests/integration/daemon/test_daemon_monitor_live.py) by default: the
reference engine running 2 requests at once (--max-batch-size), a closed loop of 2 users (`tuner bench --concurrency
2`, --users) and after --lead-s a second one (twice the users at the server's capacity); or with --rate an open loop
of Poisson arrivals, doubled the same way. /metrics scraped once a second from the first bench's start (the
traffic's start inside the first windows, as when a daemon starts with it), --busy processes spinning on the host's
CPUs meanwhile (a busy CI host). Rows as record.py's (phase `users2`, then `users4`).

`table`: for every 15 windows of every recorded stream (a closed loop where it was recorded with
`closed_concurrency`) the spread of the log requests in the server over 1 / sqrt(finished per window)
(tuner.monitor.classify.arrival_spread_ratio) and the share of them taken for a closed loop, by the rule
(queued_steady) and by its first form (the spread of all 15 at most 0.1); and for each probe, the monitor started at
each of its first 12 windows (learning 15 windows of 1 s, as the live test's daemon): what it makes of the users'
doubling.
"""

from __future__ import annotations

import argparse
import gzip
import math
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

from record import cpu_readings, free_port, scrape_loop, wait_ready  # noqa: E402
from run import Window, windows  # noqa: E402

from tuner.monitor.classify import Monitor, arrival_spread_ratio  # noqa: E402
from tuner.monitor.config import MonitorConfig  # noqa: E402

STRETCH = 15  # windows: the live test's learn_windows
FIRST_FORM = 0.1  # the rule's first form: the spread of the log requests in the server at most this


def record(args: argparse.Namespace) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "tuner.engine.server", "--port", str(port), "--cpu-threads", "1",
                               "--batching", "continuous", "--max-model-len", "128", "--kv-pool-mb", "16",
                               "--max-batch-size", str(args.max_batch_size)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.STDOUT)
    procs: list[subprocess.Popen[bytes]] = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                                             for _ in range(args.busy)]
    phase = {"name": "users2", "starts": False}
    load = ["--rate", str(args.rate)] if args.rate else ["--concurrency", str(args.users)]

    def bench() -> None:
        procs.append(subprocess.Popen([sys.executable, "-m", "tuner.cli", "bench", "--url", url, *load,
                                       "--prompt-tokens", "16", "--output-tokens", "24", "--duration-s",
                                       str(args.lead_s + args.after_s + 60), "--timeout-s", "60"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))

    def row(text: str) -> dict[str, Any]:
        loop = ({"base_rate": args.rate} if args.rate else
                {"closed_concurrency": args.users * (2 if phase["name"] == "users4" else 1)})
        r = {"t": time.time(), "phase": phase["name"], "text": text, "cpu": cpu_readings(server.pid), **loop,
             "step_delay_ms": 0.0, "max_batch_size": args.max_batch_size, "busy_processes": args.busy,
             "server": "engine"}
        if phase["starts"]:
            r["starts_phase"], phase["starts"] = True, False
        return r

    stop = threading.Event()
    try:
        wait_ready(url, 120)
        with gzip.open(args.out, "wt", encoding="utf-8") as f:
            bench()
            scraper = threading.Thread(target=scrape_loop, args=(url, 1.0, stop, row, f.write), daemon=True)
            scraper.start()
            time.sleep(args.lead_s)
            bench()  # the users (or an open loop's arrivals) doubled
            phase.update(name="users4", starts=True)
            time.sleep(args.after_s)
            stop.set()
            scraper.join(10)
    finally:
        for p in [*procs, server]:
            p.terminate()
        for p in [*procs, server]:
            p.wait(30)
    print(f"wrote {args.out}")


def ratios(windows: list[Window], interval_s: float) -> list[tuple[float, bool]]:
    """(arrival_spread_ratio, the first form's verdict) of every STRETCH consecutive windows with requests in
    the server."""
    rows = [(w["in_server_mean"], w.get("finished_per_s", 0.0) * interval_s) for w in windows
            if w.get("in_server_mean", 0.0) > 0]
    out = []
    for i in range(len(rows) - STRETCH + 1):
        inside, done = zip(*rows[i:i + STRETCH], strict=True)
        r = arrival_spread_ratio(inside, done)
        if r is not None:
            out.append((r, statistics.stdev(math.log(v) for v in inside) <= FIRST_FORM))
    return out


def stream_ratios(path: Path) -> tuple[bool, list[tuple[float, bool]]]:
    """Whether the stream was recorded as a closed loop, and ratios() of every phase's windows (one read of it)."""
    phases: dict[str, list[tuple[float, Window]]] = {}
    closed = False
    for phase, t, w, _, row in windows(path):
        phases.setdefault(phase, []).append((t, w))
        closed = closed or "closed_concurrency" in row
    got: list[tuple[float, bool]] = []
    for ws in phases.values():
        times = [t for t, _ in ws]
        if len(times) < 2:
            continue
        got += ratios([w for _, w in ws], statistics.median(b - a for a, b in zip(times, times[1:], strict=False)))
    return closed, got


def stream_row(path: Path) -> str | None:
    closed, got = stream_ratios(path)
    if not got:
        return None
    rs = sorted(r for r, _ in got)
    limit = MonitorConfig.queued_steady
    return (f"| {path.name} | {'closed' if closed else 'open'} | {len(rs)} | {rs[0]:.3f} | {statistics.median(rs):.3f}"
            f" | {rs[-1]:.3f} | {sum(r <= limit for r in rs) / len(rs):.0%} | "
            f"{sum(old for _, old in got) / len(got):.0%} |")


def probe_rows(path: Path) -> list[str]:
    """The monitor started at each of the probe's first 12 windows: its first event from the users' doubling on."""
    ws = list(windows(path))
    rows = [ws[0][3], *(b for *_, b in ws)]  # every scrape the windows span (one read of the stream)
    load = statistics.median(float(r["cpu"]["loadavg"].split()[0]) for r in rows)
    out = []
    for start in range(12):
        m = Monitor(MonitorConfig(interval_s=1.0, learn_windows=STRETCH))
        first, after = "none", 0
        for phase, t, w, _, _ in ws[start:]:
            events = [e for e in m.observe(t, w) if e.kind != "recovery"]
            if phase == "users4":
                after += 1
                if events and first == "none":
                    first = f"{events[0].kind} in {after}"
        out.append(first)
    drift = sum(x.startswith("drift") for x in out)
    return [f"| {path.name} | {rows[0].get('busy_processes', '?')} | {load:.1f} | {drift}/12 | {', '.join(out)} |"]


def table(args: argparse.Namespace) -> None:
    streams = sorted(HERE.glob("recorded*.jsonl.gz"))
    print(f"Every {STRETCH} windows of every recorded stream: the spread of the log requests in the server over "
          f"1 / sqrt(finished per window), the window farthest from their median left out "
          f"(tuner.monitor.classify.arrival_spread_ratio); taken for a closed loop at most queued_steady = "
          f"{MonitorConfig.queued_steady:.3f}; the first form: the spread of all {STRETCH} at most {FIRST_FORM}.\n")
    print("| stream | recorded loop | stretches | ratio min | median | max | closed (rule) | closed (first form) |")
    print("|---|---|---|---|---|---|---|---|")
    for path in streams + [Path(p) for p in args.probes]:
        line = stream_row(path)
        if line:
            print(line, flush=True)
    if args.probes:
        print(f"\nThe monitor started at each of a probe's first 12 windows (learning {STRETCH} windows of 1 s): "
              "its first event from the users' doubling on (windows after it), start by start.\n")
        print("| probe | busy processes | load average (median) | a drift | first event, start 0 to 11 |")
        print("|---|---|---|---|---|")
        for p in args.probes:
            for line in probe_rows(Path(p)):
                print(line, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="record the engine's 1-s windows at capacity, the users doubled")
    rec.add_argument("--out", type=Path, required=True, help="the gzipped JSONL stream to write")
    rec.add_argument("--busy", type=int, default=0, help="processes spinning on the host's CPUs meanwhile")
    rec.add_argument("--users", type=int, default=2, help="the closed loop's users (twice as many after --lead-s)")
    rec.add_argument("--rate", type=float, default=0.0,
                     help="an open loop of Poisson arrivals at this rate (requests/s) instead, twice after --lead-s")
    rec.add_argument("--max-batch-size", type=int, default=2, help="the requests the engine runs at once")
    rec.add_argument("--lead-s", type=float, default=60.0, help="seconds before the load doubles")
    rec.add_argument("--after-s", type=float, default=60.0, help="seconds of the doubled load")
    tab = sub.add_parser("table", help="print the table")
    tab.add_argument("--probes", nargs="*", default=[], help="streams written by `record`")
    args = ap.parse_args()
    (record if args.cmd == "record" else table)(args)


if __name__ == "__main__":
    main()
