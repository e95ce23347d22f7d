"""Measurement: load generation, workloads, metrics, GPU and server telemetry.

Knows endpoints and records, never targets, studies or MLflow.
"""
