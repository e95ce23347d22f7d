"""Check and Act: the statistics of a paired comparison (stats), the interleaved A/B verification of a
candidate against the champion (verify), promotion, rollback, apply and the daemon's Check-then-Act
(act), and what the audit log and champion store say (audit).

May import: tuner.loop, tuner.tracking, tuner.champions and below.
"""
