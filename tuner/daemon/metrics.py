"""The daemon's Prometheus metrics, on a private registry.

Trials are counted twice, by Optuna state and by feasibility, as two metrics (one metric mixing both would sum
every trial twice). No `_created` series: they double every counter and histogram for nothing a dashboard uses.
"""

from __future__ import annotations

import platform
from collections.abc import Iterable, Mapping
from importlib.metadata import PackageNotFoundError, version

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
    generate_latest,
)

from tuner import __version__
from tuner.monitor.classify import OPEN_CAUSES

disable_created_metrics()

# a cycle lasts from seconds (the simulator) to a day (a real GPU study)
CYCLE_BUCKETS_S = (1, 5, 15, 60, 300, 900, 1800, 3600, 7200, 14400, 43200, 86400)
FEASIBILITY = ("feasible", "infeasible", "rejected")  # rejected: a proposal resampled, never deployed


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "none"


class DaemonMetrics:
    """prometheus_client metrics on a private registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.cycles = Counter("tuner_cycles", "Cycles run", ["agent", "outcome"], registry=self.registry)
        self.trials = Gauge("tuner_trials", "Trials of the agent's current study by Optuna state",
                            ["agent", "state"], registry=self.registry)
        self.trials_feasibility = Gauge(
            "tuner_trials_by_feasibility", "Completed trials of the agent's current study: feasible (within the "
            "SLOs) or not", ["agent", "feasibility"], registry=self.registry)
        self.failures = Counter("tuner_trial_failures", "Trials that failed, by classified cause",
                                ["agent", "cause"], registry=self.registry)
        self.cycle_duration = Histogram("tuner_cycle_duration_seconds", "Wall time of a whole cycle (trials, "
                                        "verification, promotion)", ["agent"], buckets=CYCLE_BUCKETS_S,
                                        registry=self.registry)
        self.build = Info("tuner_build", "The tuner and the libraries it runs on", registry=self.registry)
        self.build.info({"version": __version__, "python": platform.python_version(),
                         "optuna": _version("optuna"), "mlflow": _version("mlflow"),
                         "prometheus_client": _version("prometheus_client")})
        self.best = Gauge("tuner_best_objective", "Best feasible value of the primary objective", ["agent"],
                          registry=self.registry)
        self.champion_age = Gauge("tuner_champion_age_seconds", "Seconds since the champion was promoted",
                                  ["agent"], registry=self.registry)
        self.running = Gauge("tuner_cycle_running", "1 while a cycle of the agent runs", ["agent"],
                             registry=self.registry)
        self.last_error = Gauge("tuner_last_error_timestamp_seconds", "Time of the agent's last failed cycle",
                                ["agent"], registry=self.registry)
        self.anomalies = Counter("tuner_watch_anomalies", "Production anomalies seen by the watcher",
                                 ["agent", "kind"], registry=self.registry)
        self.promotions = Counter("tuner_promotions", "Automatic promotions", ["agent"], registry=self.registry)
        self.monitor_events = Counter("tuner_monitor_events", "Events of the production monitor (tuner.monitor) "
                                      "by kind (drift, anomaly, saturation, recovery) and cause",
                                      ["agent", "kind", "cause"], registry=self.registry)
        self.monitor_episodes = Counter("tuner_monitor_episodes", "Episodes of the production monitor: its "
                                        "drifts, anomalies and saturations less those that reopened one "
                                        "recovered shortly before (tuner.monitor.config.reopen_gap_s)",
                                        ["agent", "kind", "cause"], registry=self.registry)
        self.monitor_open = Gauge("tuner_monitor_open", "1 while the monitor sees an anomaly or a saturation of "
                                  "this cause that has not recovered", ["agent", "kind", "cause"],
                                  registry=self.registry)
        self.monitor_unjudged = Gauge("tuner_monitor_unjudged_windows", "Windows whose latencies the monitor did "
                                      "not judge: the server waited for a CPU more than max_wait_judged of one "
                                      "of them and its baseline knew no such windows (starved_baseline, "
                                      "tuner.monitor.classify)", ["agent"], registry=self.registry)
        self.monitor_slowdown_windows = Gauge(
            "tuner_monitor_slowdown_windows", "Windows the monitor's ITL-mean test is expected to take to find a "
            "slowdown of watch.monitor.slowdown_to_find_frac at its current baseline (Siegmund's approximation; "
            "+Inf: the latency noise hides a slowdown of that size; NaN: no baseline yet)", ["agent"],
            registry=self.registry)
        self.monitor_detectable_slowdown = Gauge(
            "tuner_monitor_detectable_slowdown_frac", "The smallest slowdown (a fraction of the ITL mean: 0.3 is "
            "+30 %) the monitor's ITL-mean test is expected to find within 12 windows at its current baseline "
            "(Siegmund's approximation; a window whose CPU wait widens its scale sees less; NaN: no baseline "
            "yet): what its latency noise lets it see", ["agent"], registry=self.registry)
        self.switches = Counter("tuner_scenario_switches", "Scenario champions put in service as traffic moved",
                                ["agent", "scenario"], registry=self.registry)

    def set_trial_counts(self, agent: str, counts: Mapping[str, int]) -> None:
        """From TunerStudy.counts(): Optuna's states to tuner_trials, FEASIBLE/INFEASIBLE to their own metric."""
        for key, n in counts.items():
            if key.lower() in FEASIBILITY:
                self.trials_feasibility.labels(agent, key.lower()).set(n)
            else:
                self.trials.labels(agent, key).set(n)

    def count_failures(self, agent: str, causes: Iterable[str | None]) -> None:
        for cause in causes:
            if cause:
                self.failures.labels(agent, cause).inc()

    def monitor_event(self, agent: str, kind: str, cause: str, opened: Iterable[tuple[str, str]], *,
                      reopened: bool = False) -> None:
        """Count one monitor event, and the episode it opens (not a recovery nor a reopening); `opened`: the
        (kind, cause) pairs still open after it (the gauge)."""
        self.monitor_events.labels(agent, kind, cause).inc()
        if kind != "recovery" and not reopened:
            self.monitor_episodes.labels(agent, kind, cause).inc()
        now = set(opened)
        for k in ("anomaly", "saturation"):
            for c in OPEN_CAUSES[k]:
                self.monitor_open.labels(agent, k, c).set(1.0 if (k, c) in now else 0.0)

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))
