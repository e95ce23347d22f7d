"""The production monitor: a time series per signal from successive /metrics scrapes (or Prometheus queries)
and GPU telemetry (NVML on the host, DCGM exporter series in Prometheus), change detection by a CUSUM on
standardised residuals with its threshold set from a chosen false-alarm rate, and the classification of what
changed into events: workload drift, performance anomaly, saturation, recovery.

- `signals`: one window (two scrapes) -> the value of every signal; missing series are named once.
- `telemetry`: GPU sources (NVML through tuner.measure.gpu, DCGM through the Prometheus HTTP API), and
  Prometheus instant queries turned into the same Snapshots a scrape gives.
- `contention`: the server's wait for a CPU (a PSI file, a process's schedstat) and its host's CPU steal (a
  /proc/stat): the environment signals `cpu_wait_frac` and `cpu_steal_frac`, which explain latencies and
  never alarm.
- `expect`: the champion's expected latencies at the observed load (its trial's metrics, the screening
  simulator's elasticities).
- `detect`: the CUSUM detector, its baseline (the champion's own behaviour) and its calibration (Siegmund's
  approximation of the in-control run length, inverted for the threshold; widened for autocorrelation).
- `config`: each signal's rule (`RULES`), the tests that share the false-alarm budget (`TESTS`) and every
  setting of the monitor (`MonitorConfig`).
- `classify`: alarms -> events (`Monitor`, the stateful whole).
- `records`: an event into MLflow (through tuner.tracking.tracker, with a plot of the signal around the
  change), the agent's events file (read by `tuner history` and `tuner report`).
- `respond`: the answer to a performance anomaly: re-verify the champion against the baseline, roll back if
  the champion itself regressed (tuner.promotion).

May import tuner.promotion, tuner.tracking, tuner.champions, tuner.sim, tuner.study, tuner.measure and the
kernels below them; never
tuner.daemon, tuner.report or tuner.cli (they import this package).
"""
