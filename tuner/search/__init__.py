"""How the tuner searches: the declared search space (space) and the sampler registry and what it builds
on (samplers, design, noise): no loop, no target, no tracking.

May import: tuner.spec, tuner.base, tuner.errors.
"""
