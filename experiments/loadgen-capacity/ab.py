"""Interleaved A/B of the event loop under the same client (uvloop vs stock asyncio), open loop, instant server.

Usage: .venv/bin/python experiments/loadgen-capacity/ab.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

import run as R  # noqa: E402

from tests.support.fake_openai_server import spawn_fake_server  # noqa: E402


def main() -> None:
    os.sched_setaffinity(0, {0})
    R.renice(os.getpid())
    print("| offered req/s | loop | achieved | p99 send lag ms | median TTFT ms | p99 TTFT ms | load avg |")
    print("|---|---|---|---|---|---|---|")
    with spawn_fake_server(ttft_ms=0, itl_ms=0, cpu=1, uvloop=True) as fast:
        R.renice(fast.proc.pid)
        for rate in (500, 2000):
            for lib in ("aiohttp-asyncio", "aiohttp", "aiohttp-asyncio", "aiohttp"):
                x = R.open_loop(lib, fast.url, rate, 3.0)
                loop = "asyncio" if lib.endswith("asyncio") else "uvloop"
                print(f"| {rate} | {loop} | {x['achieved']:.0f} | {x['lag_p99_ms']:.2f} | {x['median_ttft_ms']:.3f} "
                      f"| {x['p99_ttft_ms']:.2f} | {os.getloadavg()[0]:.2f} |")


if __name__ == "__main__":
    main()
