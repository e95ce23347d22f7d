"""A deterministic discrete-event simulator of a continuous-batching LLM server (pure Python + numpy).

profiles: hardware and model profiles; calibration: every fitted constant; config: knobs, defaults,
validation, memory plan, cold start; cost: the price of one engine step; engine: the event loop.
"""

from tuner.sim.config import KNOBS, EngineConfig, resolve_config
from tuner.sim.engine import SimResult, simulate
from tuner.sim.profiles import HARDWARE, MODELS, HardwareProfile, ModelProfile

__all__ = ["HARDWARE", "KNOBS", "MODELS", "EngineConfig", "HardwareProfile", "ModelProfile", "SimResult",
           "resolve_config", "simulate"]
