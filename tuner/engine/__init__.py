"""Reference PyTorch serving engine: a Llama-architecture model, a KV-cache pool, a scheduler with
static or continuous batching, CUDA graphs, torch.compile, async output and INT8 weights, served over
an OpenAI-compatible HTTP API (`python -m tuner.engine.server`).

A standalone server: it imports torch, numpy, aiohttp and prometheus_client, never optuna, mlflow,
pydantic or the tuner's loop. Importing this package imports nothing heavy.
"""
