"""The fleet's drivers: `tuner worker`'s loop over a shared study (worker). Low-level coordination lives in
tuner.coord, trial placement in tuner.placement.

May import: tuner.loop and below.
"""
