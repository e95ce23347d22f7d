"""The daemon's Prometheus metrics, on a private registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest


class DaemonMetrics:
    """prometheus_client metrics on a private registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.cycles = Counter("tuner_cycles", "Cycles run", ["agent", "outcome"], registry=self.registry)
        self.trials = Gauge("tuner_trials", "Trials of the agent's study by state", ["agent", "state"],
                            registry=self.registry)
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

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))
