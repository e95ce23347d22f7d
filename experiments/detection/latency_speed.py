"""How each latency the monitor judges moves with the host's speed on a stream's calm windows: the elasticity a
latency would be judged at the host's speed with (MonitorConfig.host_speed_signals, host_speed_elasticity).

The monitor judges the ITL mean alone at the host's speed (an exact sum over a count); the quantiles, interpolated
inside histogram buckets, are judged as they are. On vllm31 a host episode the probe read (+0.25-0.30 log) left the
ITL mean judged at its speed calm and raised the TTFT median (15 -> 19 ms, judged without it) to an anomaly
(README, thirty-eighth step). Per stream and latency, over the stationary windows (every phase named
stationary_b, less the first --cut windows of the stream) with a probe reading and the latency: the correlation of
the latency's log with the probe's log reading, the least-squares slope (its elasticity), the latency's log spread
raw and left at that slope and at 1.

    python experiments/detection/latency_speed.py recorded-vllm-open6-rate-uni1.jsonl.gz ... [--host-probe own+index]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run  # noqa: E402

from tuner.monitor.signals import LATENCIES  # noqa: E402


def fit(probe_log: np.ndarray, latency_log: np.ndarray) -> tuple[float, float, float, float, float]:
    """(correlation, slope, sd raw, sd left at the slope, sd left at an elasticity of 1) of a latency's logs on the
    probe's; the correlation nan where either holds still."""
    slope = float(np.polyfit(probe_log, latency_log, 1)[0])
    raw = float(np.std(latency_log))
    still = raw == 0.0 or float(np.std(probe_log)) == 0.0
    corr = math.nan if still else float(np.corrcoef(probe_log, latency_log)[0, 1])
    return corr, slope, raw, float(np.std(latency_log - slope * probe_log)), float(np.std(latency_log - probe_log))


def rows_of(path: Path, host_probe: str, cut: int) -> list[tuple[str, int, tuple[float, float, float, float, float]]]:
    """Each latency's fit over the stream's calm windows: (latency, windows, fit())."""
    phases, _, _ = run.load_stream(path, host_probe=host_probe)
    calm = [w for name, ws in phases.items() if name.endswith("stationary_b") for _, w in ws][cut:]
    out = []
    for lat in LATENCIES:
        pairs = [(math.log(w["host_probe_us"]), math.log(w[lat])) for w in calm
                 if w.get("host_probe_us", 0) > 0 and w.get(lat, 0) > 0]
        if len(pairs) >= 3:
            p, y = (np.array(v) for v in zip(*pairs, strict=True))
            out.append((lat, len(pairs), fit(p, y)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("streams", nargs="+", type=Path, help="recorded streams (record_vllm.py --speed-probe)")
    ap.add_argument("--host-probe", default="own+index", help="the probe's reading (hostspeed.reading; default "
                    "own+index, a followed probe's)")
    ap.add_argument("--cut", type=int, default=0, help="calm windows dropped at the start (the engine's warm-up)")
    args = ap.parse_args()
    base = Path(__file__).resolve().parent
    print(f"# Each latency against the host's speed on the calm windows (reading {args.host_probe})\n")
    print("command: `python experiments/detection/latency_speed.py "
          + " ".join(str(s) for s in args.streams) + f" --host-probe {args.host_probe} --cut {args.cut}`\n")
    print("| stream | latency | windows | corr | slope (elasticity) | sd raw | sd at the slope | sd at 1 |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for s in args.streams:
        path = s if s.exists() else base / s
        if not path.exists():
            sys.exit(f"latency_speed.py: {s}: no such file")
        for lat, n, (corr, slope, raw, at_slope, at_one) in rows_of(path, args.host_probe, args.cut):
            print(f"| {s.name} | {lat} | {n} | {corr:+.2f} | {slope:+.2f} | {raw:.3f} | {at_slope:.3f} "
                  f"| {at_one:.3f} |")


if __name__ == "__main__":
    main()
