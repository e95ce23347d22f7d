"""Where a trial runs: this host's GPU claims (gpupool) or a node of a Ray cluster (ray_executor).

May import: tuner.targets (types only), tuner.base, tuner.errors. The loop and sizing use it; the fleet's
drivers (tuner.fleet) sit above the loop.
"""
