"""Workload observation: the WorkloadSpec a trial runs, built from what production shows, with the fit error.

Three sources, one result (`ObservedWorkload`: the workload, the window, the redacted source, the observed
statistics and how far the fitted distributions lie from what was observed):
- `window`: a live server's /metrics, scraped over a window (`MetricsWindow`, `observe_metrics`);
- `prom`: a Prometheus server's HTTP API over a window, replicas summed (`observe_prometheus`);
- `trace`: request logs in common public formats (Azure LLM inference, BurstGPT, Mooncake JSONL, the tuner's
  own trace JSONL), fitted or replayed exactly (`read_trace`, `observe_trace`).
`fit` turns the counts of a window (`WindowCounts`) or a trace's requests into distributions the load generator
draws from (`tuner.measure.workload`), and measures the fit on the same draws; `model` holds the result types.

May import tuner.measure (the scrape parser, the workload sampler), tuner.spec, tuner.base and tuner.errors;
nothing above (targets, studies, the daemon, the CLI use it).
"""

from tuner.observe.model import LengthHist, ObservedWorkload, WindowCounts, load_observed
from tuner.observe.prom import observe_prometheus
from tuner.observe.trace import TraceRequest, observe_trace, read_trace
from tuner.observe.window import MetricsWindow, observe_metrics

__all__ = [
    "LengthHist", "MetricsWindow", "ObservedWorkload", "TraceRequest", "WindowCounts", "load_observed",
    "observe_metrics", "observe_prometheus", "observe_trace", "read_trace",
]
