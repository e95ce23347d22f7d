"""Serving targets: deploy a configuration, measure it, tear it down. Targets never decide."""
