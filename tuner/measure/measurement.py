"""The result of measuring one deployment under one workload."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from tuner.measure.metrics import metric_key
from tuner.measure.records import RequestRecord


@dataclass(frozen=True)
class Measurement:
    """Summary (vllm bench serve keys), the per-request records, cold start and telemetry.

    `telemetry` holds unit-suffixed extras: `gpu_*` (NVML), `server_*` (scraped /metrics); `prompt_lengths`
    says how the prompts were made to the asked lengths and how far the server's counts were from them.
    """

    summary: dict[str, float]
    records: tuple[RequestRecord, ...] = ()
    cold_start_s: float = 0.0
    telemetry: dict[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    prompt_lengths: dict[str, Any] = field(default_factory=dict)
    clock_origin_s: float = 0.0  # time.perf_counter() (CLOCK_MONOTONIC) the records' times count from
    # the run was stopped early, its partial measurement breaking an SLO by far (tuner.measure.early_stop
    # EarlyStop.to_attr()); None: it ran to its end
    early_stop: dict[str, Any] | None = None
    # a capacity search made this measurement (tuner.study.rate_objective): the found rate, its cost and every
    # probe run's figures; None: one run of the workload
    capacity_search: dict[str, Any] | None = None

    def metrics(self) -> dict[str, float]:
        """Every number of this measurement, finite ones only (for tracking and constraints)."""
        out = {k: v for k, v in self.summary.items() if isinstance(v, int | float) and math.isfinite(v)}
        out.update({k: v for k, v in self.telemetry.items() if math.isfinite(v)})
        out["cold_start_s"] = self.cold_start_s
        return out

    def value(self, metric: str) -> float:
        """A metric by its spec name (`ttft_ms.p99`, `request_throughput`, `cold_start_s`, ...).

        Missing or undefined metrics are NaN.
        """
        key = metric_key(metric)
        if key == "cold_start_s":
            return self.cold_start_s
        if key in self.summary:
            return float(self.summary[key])
        return float(self.telemetry.get(key, math.nan))
