"""Canary rollout: put a verified candidate in service through a real load balancer, in stages, judged on live
traffic and rolled back automatically.

- `lb`: the LoadBalancer seam (weights, servers, their health) and its HAProxy adapter (the runtime API over a
  stats socket: weights change without a reload);
- `judge`: per-replica figures of one window from each replica's /metrics (vLLM-named histograms) and a
  stage's judgement with the verification's paired one-sided test (tuner.promotion.stats);
- `journal`: the rollout journal written before every step, and the recovery that reverts a rollout whose
  owner died (traffic never stays split with no owner);
- `rollout`: the state machine (start the canary replica through the agent's target, stages, judgement,
  rollback or promotion through tuner.promotion.act) and its records (MLflow, audit log).

May import: tuner.promotion, tuner.context and below (tuner.targets to start replicas, tuner.measure.scrape for
the per-replica series). Imported by tuner.daemon and tuner.cli.
"""
