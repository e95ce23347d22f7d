"""Whether a vLLM server's slower stretches are its host's: its engine's CPU time per step beside a probe of the host.

For each recorded vLLM stream (record_vllm.py) and each window (run.py's windows: the same numbering as its
tables): the engine loop's CPU time per engine step (the engine core's busiest thread's schedstat run time over
the window's steps, vllm:iteration_tokens_total's count), its run-queue wait, the ITL mean, and where the stream
was recorded with `--speed-probe` the probe's medians (tuner.monitor.hostspeed: the CPU time of a 4-MB matrix-vector
product, a 64x64 matrix product, a Python loop). Each is read against its median over the stream's calm windows
(its stationary phase, after `--skip` warm-up windows). A window "slow" where the engine's CPU per step is at
least `--slow` times its median.

    python experiments/detection/host_speed.py recorded-vllm-capacity4-probe.jsonl.gz [--windows]

Prints, per stream, one row: calm windows, slow ones, of those the ones whose 4-MB probe is at least `--probe`
times its median, the correlations over the calm windows (log engine CPU per step against the log probe, and
against the log ITL mean), and the probe's ratio in the injected slowdown's windows (its host not slower);
`--windows` lists every window. And the spread of the calm windows' log ITL mean, raw and corrected by the loop's
ready wait (the monitor's correction, MonitorConfig.wait_law "ready"): a wait that stretches the server's work
narrows it (worker_wait.py: a stream whose loop is vLLM's model worker instead of its engine core). Then, per
stream and reading of the probe (the 4-MB product; the index of the three tasks, tuner.monitor.hostspeed.probe_index,
unpinned, on the engine's own CPU and on each CPU where recorded), how much of the log ITL mean it explains.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import windows  # noqa: E402

from tuner.monitor.contention import busiest, schedstat_ns  # noqa: E402
from tuner.monitor.hostspeed import reading  # noqa: E402

CALM = "stationary_b"
SLOWED = "slowdown30"


def counter(text: str, name: str) -> float:
    """The sum of a metric family's samples named exactly `name` in a scrape's text (0 where absent)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in (" ", "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def loop_thread(a: dict[str, Any], b: dict[str, Any]) -> tuple[float, float]:
    """(run, wait) ns over the window of the engine core's thread that wanted a CPU longest (the engine loop: the
    monitor's own choice, tuner.monitor.contention.busiest)."""
    return busiest(schedstat_ns(a["cpu"]["schedstat"]), schedstat_ns(b["cpu"]["schedstat"])) or (0.0, 0.0)


def rows_of(path: Path) -> list[dict[str, Any]]:
    out = []
    index: dict[str, int] = {}
    for phase, t, sig, a, b in windows(path):
        if "cpu" not in a or "cpu" not in b:
            continue
        steps = counter(b["text"], "vllm:iteration_tokens_total_count") - counter(
            a["text"], "vllm:iteration_tokens_total_count")
        run, wait = loop_thread(a, b)
        k = index[phase] = index.get(phase, -1) + 1
        speed = b.get("speed") or {}
        out.append({"phase": phase, "window": k, "t": t,
                    "cpu_us_per_step": run / steps / 1e3 if steps > 0 else math.nan,
                    "ready_wait": wait / (run + wait) if run + wait > 0 else math.nan,
                    "itl_ms": sig.get("itl_ms_mean", math.nan),
                    **{name: speed[name] for name in ("mv4_us", "mm64_us", "py_us") if speed.get("runs")},
                    **{f"{where}_index": v for where, v in readings(speed).items()}})
    return out


def readings(speed: dict[str, Any]) -> dict[str, float]:
    """The probe's index (tuner.monitor.hostspeed.reading) of each set of runs a row holds: `unpinned`, `own`
    (on the engine's CPU) and `cpu<n>` (pinned on CPU n), where recorded (record_vllm.py from the thirty-fourth
    step on); and `own+unpinned`, the geometric mean of those two (a followed probe runs both every period)."""
    ways = {"unpinned": "index", **{k: k for k, v in speed.items() if isinstance(v, dict) and k != "own_cpus"}}
    if "own" in ways:
        ways["own+unpinned"] = "own+index"
    return {where: got for where, how in ways.items() if (got := reading(speed, how)) is not None}


def index_rows(path: Path, calm: list[dict[str, Any]]) -> list[str]:
    """One table row per reading of the probe a stream holds: how much of the calm windows' log ITL mean it
    explains (the slope, the spread left at it and at an elasticity of 1, the lag-1 autocorrelation raw and at 1)."""
    out = []
    for key in ("mv4_us", *sorted({k for r in calm for k in r if k.endswith("_index")})):
        if not all(r.get(key, 0) > 0 for r in calm):
            continue
        x, y, slope, at = fit(calm, key)
        one = [b - a for a, b in zip(x, y, strict=True)]
        c = corr([r[key] for r in calm], [r["itl_ms"] for r in calm])
        sd = " | ".join(f"{statistics.stdev(v):.3f}" for v in (y, at, one))
        out.append(f"| {path.name} | {key} | {len(calm)} | {c:.2f} | {slope:.2f} | {sd} | "
                   f"{lag1(y):.2f} -> {lag1(one):.2f} |")
    return out


def corr(xs: list[float], ys: list[float]) -> float:
    pairs = [(math.log(x), math.log(y)) for x, y in zip(xs, ys, strict=True) if x > 0 and y > 0]
    if len(pairs) < 3:
        return math.nan
    return statistics.correlation([p[0] for p in pairs], [p[1] for p in pairs])


def lag1(xs: list[float]) -> float:
    return statistics.correlation(xs[:-1], xs[1:])


def elasticity(calm: list[dict[str, Any]]) -> str:
    """The slope of the calm windows' log ITL mean on their log 4-MB probe (the server's elasticity to its host's
    speed: tuner.monitor.config.MonitorConfig.host_speed_elasticity), the spread of the log ITL mean corrected by
    it, and the lag-1 autocorrelation of the log ITL mean before and after."""
    _, y, slope, res = fit(calm, "mv4_us")
    return f"{slope:.2f}, {statistics.stdev(res):.3f}, {lag1(y):.2f} -> {lag1(res):.2f}"


def fit(calm: list[dict[str, Any]], key: str) -> tuple[list[float], list[float], float, list[float]]:
    """The calm windows' log `key` and log ITL mean, the slope of the latter on the former, and the log ITL mean
    less that slope times the log `key`."""
    y = [math.log(r["itl_ms"]) for r in calm]
    x = [math.log(r[key]) for r in calm]
    slope = statistics.linear_regression(x, y).slope
    return x, y, slope, [b - slope * a for a, b in zip(x, y, strict=True)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("streams", nargs="+", type=Path)
    ap.add_argument("--skip", type=int, default=2, help="calm windows skipped at its start (warm-up; default 2)")
    ap.add_argument("--slow", type=float, default=1.15, help="a slow window's engine CPU per step over its median")
    ap.add_argument("--probe", type=float, default=1.10, help="a slower host's 4-MB probe over its median")
    ap.add_argument("--windows", action="store_true", help="list every window")
    args = ap.parse_args()
    print(f"| stream | calm windows | slow (CPU per step >= x{args.slow:g}) | of those, the probe >= x{args.probe:g} | "
          f"corr(CPU per step, probe) | corr(CPU per step, ITL mean) | calm: probe >= x{args.probe:g} | slowdown: "
          "probe ratio (median, max) | slowdown: CPU per step ratio (median) | sd of log ITL mean: raw, x (1 - the "
          "loop's ready wait) | log ITL mean on the log probe: slope (host_speed_elasticity), sd corrected by it, "
          "lag-1 autocorrelation raw -> corrected |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---|---|---|")
    listed = []
    for path in args.streams:
        rows = rows_of(path)
        calm = [r for r in rows if r["phase"] == CALM and r["window"] >= args.skip
                and not math.isnan(r["cpu_us_per_step"])]
        if not calm:
            print(f"| {path.name} | 0 | - | - | - | - | - | - | - | - | - |")
            continue
        med = {k: statistics.median(r[k] for r in calm) for k in ("cpu_us_per_step", "itl_ms")}
        probed = all("mv4_us" in r for r in calm)
        if probed:
            for k in ("mv4_us", "mm64_us", "py_us"):
                med[k] = statistics.median(r[k] for r in calm)
        slow = [r for r in calm if r["cpu_us_per_step"] >= args.slow * med["cpu_us_per_step"]]
        slowed = [r for r in rows if r["phase"] == SLOWED and not math.isnan(r["cpu_us_per_step"])]
        c_itl = corr([r["cpu_us_per_step"] for r in calm], [r["itl_ms"] for r in calm])
        if probed:
            both = sum(r["mv4_us"] >= args.probe * med["mv4_us"] for r in slow)
            c_probe = corr([r["cpu_us_per_step"] for r in calm], [r["mv4_us"] for r in calm])
            host = sum(r["mv4_us"] >= args.probe * med["mv4_us"] for r in calm)
            ratios = sorted(r["mv4_us"] / med["mv4_us"] for r in slowed if "mv4_us" in r)
            s_probe = f"{statistics.median(ratios):.2f}, {ratios[-1]:.2f}" if ratios else "-"
            cells = [f"{both}/{len(slow)}", f"{c_probe:.2f}", f"{host}/{len(calm)}", s_probe]
        else:
            cells = ["no probe", "-", "-", "-"]
        s_cpu = sorted(r["cpu_us_per_step"] / med["cpu_us_per_step"] for r in slowed)
        s_cell = f"{statistics.median(s_cpu):.2f}" if s_cpu else "-"
        raw = statistics.stdev(math.log(r["itl_ms"]) for r in calm)
        fixed = statistics.stdev(math.log(r["itl_ms"] * (1.0 - r["ready_wait"])) for r in calm)
        print(f"| {path.name} | {len(calm)} | {len(slow)} | {cells[0]} | {cells[1]} | {c_itl:.2f} | {cells[2]} | "
              f"{cells[3]} | {s_cell} | {raw:.3f}, {fixed:.3f} | {elasticity(calm) if probed else '-'} |")
        listed.append((path, rows, med, calm))
    print("\nEach reading of the probe against the calm windows' log ITL mean: its correlation, the slope (the "
          "server's elasticity to it), the log ITL mean's spread raw, left at that slope and at an elasticity of 1 "
          "(probe_index's readings), and its lag-1 autocorrelation raw -> at 1\n")
    print("| stream | reading | calm windows | corr | slope | sd raw | sd at the slope | sd at 1 | lag-1 raw -> at 1 |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for path, _, _, calm in listed:
        for line in index_rows(path, calm):
            print(line)
    if args.windows:
        for path, rows, med, _ in listed:
            print(f"\n{path.name}: each window's value over its calm median (CPU per step {med['cpu_us_per_step']:.0f}"
                  f" us, ITL mean {med['itl_ms']:.2f} ms" + (f", 4-MB probe {med['mv4_us']:.0f} us" if "mv4_us" in med
                                                            else "") + ")\n")
            print("| phase | window | CPU per step | ready wait | ITL mean | 4-MB probe | 64x64 probe | Python probe |")
            print("|---|---:|---:|---:|---:|---:|---:|---:|")
            for r in rows:
                probe = [f"{r[k] / med[k]:.2f}" if k in r and k in med else "-" for k in ("mv4_us", "mm64_us", "py_us")]
                print(f"| {r['phase']} | {r['window']} | {r['cpu_us_per_step'] / med['cpu_us_per_step']:.2f} | "
                      f"{r['ready_wait']:.2f} | {r['itl_ms'] / med['itl_ms']:.2f} | {' | '.join(probe)} |")


if __name__ == "__main__":
    main()
