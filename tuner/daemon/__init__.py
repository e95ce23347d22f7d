"""The PDCA daemon: APScheduler cycles per agent, signals, heartbeat, health/metrics endpoint, watch.

One cycle job per agent lives in a SQLAlchemy job store in the state dir (sqlite:///<state>/jobs.db), with
a fixed id, replace_existing, max_instances=1 and coalesce. Cycles of agents that share GPUs take the same
lock, so they never overlap. A cycle is Plan (continue the agent's study; a changed target version or
workload opens a new study warm-started with the old one's best configurations: tuner.study.lineage), Do
(run_cycle), Check (verify the best unjudged candidate) and Act (auto: promote; manual: leave it pending).

SIGTERM/SIGINT: nothing new starts, the running deployment is torn down (the stop event that run_cycle and
deployments honour), the running trial is recorded as interrupted, and the process exits 0 within the
grace. After a SIGKILL the next start reaps stale trials and orphan servers (loop.reap) and goes on.

Modules: runtime (the per-process state), metrics (Prometheus), health (heartbeat, /health, `tuner check`),
cycle (one agent's PDCA cycle, the scheduled job), watch (production drift and SLO breaches), scheduler
(APScheduler, signals, reload, the single-instance lock).
"""
