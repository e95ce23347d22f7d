"""A controllable NVML double (the `pynvml` calls tuner.measure.gpu makes) for hosts without a GPU: each GPU's
utilisation, power, SM clock, memory and clocks-event reasons are plain attributes a test or an experiment
sets, with optional Gaussian noise drawn from a seeded generator. `throttle()` is a power cap: power pinned at
the cap, the SM clock down, the SwPowerCap reason set. No GPM (as on pre-Hopper GPUs)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from types import SimpleNamespace


@dataclass
class GpuState:
    util_pct: float = 60.0
    power_w: float = 450.0
    sm_clock_mhz: float = 1980.0
    mem_used_mb: float = 70_000.0
    reasons: int = 0


class ControlledNvml:
    NVML_CLOCK_SM = 1
    NVML_SUCCESS = 0
    nvmlClocksEventReasonSwPowerCap = 0x4
    nvmlClocksEventReasonHwSlowdown = 0x8
    nvmlClocksEventReasonSwThermalSlowdown = 0x20
    nvmlClocksEventReasonHwThermalSlowdown = 0x40
    nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x80

    def __init__(self, count: int = 1, *, noise_frac: float = 0.0, seed: int = 0) -> None:
        self.gpus = [GpuState() for _ in range(count)]
        self.noise_frac = noise_frac
        self.rng = random.Random(seed)
        self.inits = 0

    def throttle(self, cap_w: float, clock_frac: float = 0.7) -> None:
        for g in self.gpus:
            g.power_w, g.sm_clock_mhz = cap_w, g.sm_clock_mhz * clock_frac
            g.reasons |= self.nvmlClocksEventReasonSwPowerCap

    def _n(self, x: float) -> float:
        return x * (1 + self.rng.gauss(0, self.noise_frac)) if self.noise_frac else x

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None: ...

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=min(100.0, self._n(self.gpus[h].util_pct)), memory=20)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(used=int(self.gpus[h].mem_used_mb * 2**20))

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return int(self._n(self.gpus[h].power_w) * 1000)

    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
        return int(self._n(self.gpus[h].sm_clock_mhz))

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return self.gpus[h].reasons

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        raise RuntimeError("not supported")

    def nvmlGpmQueryDeviceSupport(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(isSupportedDevice=0)
