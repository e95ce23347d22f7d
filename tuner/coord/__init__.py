"""Low-level coordination of processes and hosts that share a store: SQLite set-up (sqlite), a lock held in
the study's database (dblock) and trial leases (lease).

May import: tuner.base, tuner.errors.
"""
