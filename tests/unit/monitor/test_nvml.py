"""The NVML path: GPU signals read through tuner.measure.gpu from an NVML double, one read per window, and a
power throttle seen as a gpu_throttle anomaly."""

from __future__ import annotations

import random

import pytest

from tests.support.nvml_double import ControlledNvml
from tuner.monitor.classify import Monitor
from tuner.monitor.config import MonitorConfig
from tuner.monitor.telemetry import NvmlTelemetry


def test_one_read_gives_the_gpu_signals_summed_and_averaged() -> None:
    nv = ControlledNvml(count=2)
    nv.gpus[1].util_pct, nv.gpus[1].reasons = 80.0, nv.nvmlClocksEventReasonSwThermalSlowdown
    tel = NvmlTelemetry([0, 1], nvml=nv)
    r = tel.read()
    assert r["gpu_util_pct"] == pytest.approx(70.0) and r["gpu_power_w"] == pytest.approx(900.0)
    assert r["gpu_sm_clock_mhz"] == pytest.approx(1980.0) and r["gpu_fb_used_mb"] == pytest.approx(140_000.0)
    assert r["gpu_throttled"] == pytest.approx(0.5)  # one GPU of two thermally slowed
    assert "gpu_dram_active_frac" not in r  # no GPM on this double: left out, not zero
    tel.read()
    assert nv.inits == 1 and tel.sampler.util == []  # initialised once, nothing kept between reads


def test_no_nvml_reads_nothing_and_does_not_ask_again() -> None:
    class Broken(ControlledNvml):
        def nvmlInit(self) -> None:
            self.inits += 1
            raise RuntimeError("NVML Shared Library Not Found")

    nv = Broken()
    tel = NvmlTelemetry([0], nvml=nv)
    assert tel.read() == {} and tel.read() == {} and nv.inits == 1


def test_a_power_throttle_on_the_double_is_a_gpu_throttle_anomaly() -> None:
    nv = ControlledNvml(count=1, noise_frac=0.01, seed=2)
    tel = NvmlTelemetry([0], nvml=nv)
    m = Monitor(MonitorConfig(interval_s=15.0))
    rng = random.Random(0)
    events = []
    for i in range(60):
        if i == 40:
            nv.throttle(cap_w=300.0, clock_frac=0.7)
        w = {"rate_per_s": rng.gauss(4, 0.4), "itl_ms_mean": rng.gauss(8, 0.3), **tel.read()}
        events += [(i, e) for e in m.observe(15.0 * i, w)]
    assert events and events[0][1].kind == "anomaly" and events[0][1].cause == "gpu_throttle"
    assert events[0][0] - 40 <= 1  # two windows: no load sets a clocks-event reason, nothing to wait for
