"""GPU telemetry for the monitor, and Prometheus instant queries turned into scrapes.

- `NvmlTelemetry`: NVML on this host (tuner.measure.gpu's sampler, one read per window: the utilisation and SM
  clock as the means of NVML's sample buffers over the window where the driver keeps them, the power from the
  energy counters' rise over it; `nvml` is the bindings module, a double in tests).
- `DcgmTelemetry`: the NVIDIA DCGM exporter's series, read from Prometheus' HTTP API (/api/v1/query; the gauges
  as their means over the monitor's window):
  DCGM_FI_DEV_GPU_UTIL (%), DCGM_FI_DEV_POWER_USAGE (W), DCGM_FI_DEV_SM_CLOCK (MHz), DCGM_FI_PROF_DRAM_ACTIVE
  (0-1), DCGM_FI_DEV_FB_USED (MiB), and the clock throttle reasons (DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, renamed
  DCGM_FI_DEV_CLOCKS_EVENT_REASONS by newer exporters: the bit mask of NVML's clocks-event reasons).
- `prometheus_snapshot`: the server's vLLM series as Prometheus holds them at one instant, as the Snapshot a
  scrape of the server itself would give (so a monitor can run from Prometheus alone).
- `node_steal_reading`: node_exporter's node_cpu_seconds_total of a host, as the (steal, runnable) pair
  tuner.monitor.contention.CpuSteal differences (the host's CPU steal, read from Prometheus).

Each returns the monitor's GPU signal names (tuner.monitor.signals.GPU); a series that is not there is named
once (MissingSeries) and left out. Averages over GPUs: utilisation, SM clock, DRAM active; totals: power,
framebuffer; gpu_throttled is the share of GPUs with a power, thermal or hardware throttle reason.
"""

from __future__ import annotations

import json
import logging
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from tuner.base.redact import redact_text, redact_url
from tuner.measure.gpu import GpuSampler
from tuner.measure.scrape import Snapshot, parse
from tuner.monitor.signals import MissingSeries

log = logging.getLogger(__name__)

# NVML clocks-event reasons (nvml.h), the bits DCGM's throttle-reason field carries too
SW_POWER_CAP, HW_SLOWDOWN, SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE = 0x4, 0x8, 0x20, 0x40, 0x80
THROTTLE_MASK = SW_POWER_CAP | HW_SLOWDOWN | SW_THERMAL | HW_THERMAL | HW_POWER_BRAKE

DCGM_SERIES: dict[str, tuple[str, ...]] = {  # signal -> the DCGM field names that carry it, first found wins
    "gpu_util_pct": ("DCGM_FI_DEV_GPU_UTIL",),
    "gpu_power_w": ("DCGM_FI_DEV_POWER_USAGE",),
    "gpu_sm_clock_mhz": ("DCGM_FI_DEV_SM_CLOCK",),
    "gpu_dram_active_frac": ("DCGM_FI_PROF_DRAM_ACTIVE",),
    "gpu_fb_used_mb": ("DCGM_FI_DEV_FB_USED",),
    "gpu_throttled": ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"),
}
_TOTALS = ("gpu_power_w", "gpu_fb_used_mb")
# gauges read as their mean over the monitor's window (avg_over_time) where Prometheus holds samples in it: the
# exporter's value is one reading of DCGM's, as NVML's instantaneous one is; the throttle reasons (a bit mask) and
# the framebuffer (a level) are read as they are now
_WINDOW_MEANS = ("gpu_util_pct", "gpu_power_w", "gpu_sm_clock_mhz", "gpu_dram_active_frac")


class NvmlTelemetry:
    """The host's GPUs through NVML, one reading per call (per window: see GpuSampler.read)."""

    def __init__(self, indices: Sequence[int], *, nvml: Any = None, window_mean: bool = True) -> None:
        self.sampler = GpuSampler(indices, nvml=nvml, window_mean=window_mean)

    def read(self) -> dict[str, float]:
        return self.sampler.read()


def prometheus_query(url: str, query: str, timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """An instant query against Prometheus' HTTP API: the result vector ([] on an error, logged)."""
    full = url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": query})
    try:
        with urllib.request.urlopen(full, timeout=timeout_s) as r:
            body = json.loads(r.read().decode("utf-8", "replace"))
    except (OSError, ValueError) as exc:
        log.warning("monitor: Prometheus query at %s failed: %s", redact_url(url), redact_text(str(exc)))
        return []
    if body.get("status") != "success" or body.get("data", {}).get("resultType") != "vector":
        log.warning("monitor: Prometheus at %s answered %s", redact_url(url), redact_text(str(body)[:200]))
        return []
    return list(body["data"]["result"])


class DcgmTelemetry:
    """GPU signals from the DCGM exporter's series in Prometheus. `selector`: label matchers that pick this
    server's GPUs, e.g. `Hostname="node-1"` (empty: every GPU Prometheus knows). `window_s`: the monitor's
    window; the utilisation, power, SM clock and DRAM activity are then each GPU's mean over the last `window_s`
    (avg_over_time), or its latest value where Prometheus holds no sample in that window (a window shorter than
    its scrape interval)."""

    def __init__(self, prometheus_url: str, selector: str = "", window_s: float | None = None) -> None:
        self.url = prometheus_url
        self.selector = selector
        self.window_s = window_s
        self.missing = MissingSeries("DCGM exporter (in Prometheus)")

    def _values(self, signal: str, name: str) -> list[float]:
        """One value per GPU of a DCGM field: over the window where asked and held, else the latest."""
        series = f"{name}{{{self.selector}}}"
        if self.window_s and signal in _WINDOW_MEANS:
            ms = max(1, round(self.window_s * 1000))
            rows = prometheus_query(self.url, f"avg_over_time({series}[{ms}ms])")
            if rows:
                return [float(r["value"][1]) for r in rows]
        return [float(r["value"][1]) for r in prometheus_query(self.url, series)]

    def read(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for signal, names in DCGM_SERIES.items():
            values: list[float] = []
            for name in names:
                values = self._values(signal, name)
                if values:
                    break
            if not values:
                self.missing.note(" or ".join(names))
                continue
            if signal == "gpu_throttled":
                out[signal] = sum(1 for v in values if int(v) & THROTTLE_MASK) / len(values)
            elif signal in _TOTALS:
                out[signal] = sum(values)
            else:
                out[signal] = sum(values) / len(values)
        return out


def prometheus_snapshot(prometheus_url: str, selector: str = "") -> Snapshot | None:
    """The vLLM series Prometheus holds now (matching `selector`) as one Snapshot; None when there are none.

    Prometheus returns every sample on its own (a counter as `name_total`, a histogram as its `_bucket`,
    `_sum` and `_count` series); they are written back as exposition text with their types and parsed by the
    scraper's own parser, so both paths read the same names the same way."""
    sel = f'__name__=~"vllm:.+"{"," + selector if selector else ""}'
    rows = prometheus_query(prometheus_url, "{" + sel + "}")
    if not rows:
        return None
    families: dict[str, tuple[str, list[str]]] = {}
    for r in rows:
        labels = dict(r["metric"])
        name = labels.pop("__name__")
        labels.pop("job", None)
        labels.pop("instance", None)
        base, kind = name, "gauge"
        for suffix, k in (("_bucket", "histogram"), ("_sum", "histogram"), ("_count", "histogram"),
                          ("_total", "counter")):
            if name.endswith(suffix):
                base, kind = name[: -len(suffix)], k
                break
        lab = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
        families.setdefault(base, (kind, []))[1].append(f"{name}{{{lab}}} {r['value'][1]}")
    lines = []
    for base, (kind, samples) in families.items():
        if kind == "histogram" and not any("_bucket{" in s for s in samples):
            kind = "gauge"  # a gauge whose name ends in _count or _sum
        lines.append(f"# TYPE {base} {kind}")
        lines.extend(sorted(samples))
    return parse("\n".join(lines) + "\n")


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


RUNNABLE_MODES = ("user", "nice", "system", "irq", "softirq", "steal")  # /proc/stat's columns but idle, iowait


def node_steal_reading(prometheus_url: str, selector: str = "") -> tuple[float, float] | None:
    """(steal, runnable) cumulative CPU seconds of the hosts `selector` picks (e.g. `instance="node-1:9100"`),
    summed over their CPUs, from node_exporter's node_cpu_seconds_total in Prometheus; None without them."""
    sel = f',{selector}' if selector else ""
    got: list[float] = []
    for modes in ("steal", "|".join(RUNNABLE_MODES)):
        rows = prometheus_query(prometheus_url, f'sum(node_cpu_seconds_total{{mode=~"{modes}"{sel}}})')
        if not rows:
            return None
        got.append(float(rows[0]["value"][1]))
    return got[0], got[1]
