"""How the tuner searches: the sampler registry and what it builds on (no loop, no target, no tracking)."""
