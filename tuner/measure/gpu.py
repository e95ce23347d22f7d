"""GPU telemetry through NVML (nvidia-ml-py, `import pynvml`): a background sampler thread.

Imports nothing else of the tuner (the GPU-host experiment loads this file by path, without pydantic).
No GPU or no driver: the sampler records nothing and logs that once; it never fails a run.

Result (`GpuSampler.result()`), unit-suffixed floats; utilisations are averaged over the sampled GPUs,
power, energy and memory are totals over them:
gpu_count, gpu_samples, gpu_util_pct_mean/max, gpu_mem_busy_pct_mean (NVML's memory duty cycle, not
bandwidth), gpu_memory_used_mb_mean/max, gpu_power_w_mean/max, gpu_energy_j (from
nvmlDeviceGetTotalEnergyConsumption), gpu_sm_clock_mhz_mean/min, gpu_throttle_power_frac,
gpu_throttle_thermal_frac, gpu_throttle_hw_frac (share of samples with such clocks-event reasons),
gpu_clocks_event_reasons_mask (OR of every reason seen), and where GPM is supported (Hopper and newer):
gpu_dram_bw_util_pct_mean/max, gpu_sm_util_pct_mean, gpu_sm_occupancy_pct_mean, gpu_tensor_util_pct_mean.

`read()` is the monitor's one reading per scrape window, without the thread: the utilisation and SM clock as the
means of NVML's own sample buffers over the window (nvmlDeviceGetSamples; on an H200 the utilisation's holds 14 s
of samples 0.2 s apart, the power's only the last 2.4 s) and the power from the energy counter's rise over the
window, so a window is judged on the window and not on the one short sample period (1/6-1 s) an instantaneous
read covers.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)
_warned = False

# GPM metric ids (nvml.h): DRAM_BW_UTIL=10, SM_UTIL=2, SM_OCCUPANCY=3, ANY_TENSOR_UTIL=5
_GPM = {10: "dram_bw_util_pct", 2: "sm_util_pct", 3: "sm_occupancy_pct", 5: "tensor_util_pct"}
_GPM_MIN_GAP_S = 0.1
# NVML's sample buffers (nvmlDeviceGetSamples): the driver's own readings, one every 1/6-1 s, kept for a while.
# read() averages those taken since its previous read: a window's value is the window's mean, not one instant.
# sampler's series -> (the NVML sampling type's name, its value's scale to the series' unit)
_BUFFERS = {"util": ("NVML_GPU_UTILIZATION_SAMPLES", 1.0), "power_w": ("NVML_TOTAL_POWER_SAMPLES", 1e-3),
            "sm_mhz": ("NVML_PROCESSOR_CLK_SAMPLES", 1.0)}
# nvmlValueType_t -> the c_nvmlValue_t member that holds it
_VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
_NVML_ERROR_NOT_FOUND = 6  # nvmlDeviceGetSamples: no sample newer than the time stamp asked for


def _warn_once(msg: str, *args: Any) -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning(msg, *args)


def _mean(x: list[float]) -> float:
    return sum(x) / len(x)


class GpuSampler:
    """Sample the given GPU indices every `interval_s` seconds on a daemon thread.

    Use as a context manager or call start()/stop(); then result().
    """

    def __init__(self, indices: Sequence[int], interval_s: float = 0.2, *, nvml: Any = None,
                 window_mean: bool = True) -> None:
        """`nvml`: the NVML bindings module (default: `import pynvml`); tests pass a double. `window_mean`: read()
        averages NVML's sample buffers since its previous read (False: one instantaneous read)."""
        self._nvml_module = nvml
        self.window_mean = window_mean
        self._last_ts: dict[tuple[int, str], int] = {}  # (GPU position, series) -> the newest buffered sample read
        self._no_buffer: set[str] = set()  # series whose buffer this driver does not keep
        self._short_buffer: set[str] = set()  # series whose buffer was found shorter than a window (logged once)
        self.window_samples: dict[str, int] = {}  # read(): buffered samples averaged per series (summed over GPUs)
        self._last_energy: tuple[float, list[float | None]] | None = None  # read(): (monotonic s, mJ per GPU)
        self.indices = list(indices)
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nv: Any = None
        self._handles: list[Any] = []
        self._gpm: dict[int, Any] = {}  # position -> previous GPM sample
        self._energy0: list[float | None] = []
        self._energy1: list[float | None] = []
        self._t0 = 0.0
        self._t1 = 0.0
        # per tick aggregates
        self.util: list[float] = []
        self.mem_busy: list[float] = []
        self.mem_mb: list[float] = []
        self.power_w: list[float] = []
        self.sm_mhz: list[float] = []
        self.reasons: list[int] = []
        self.gpm: dict[str, list[float]] = {v: [] for v in _GPM.values()}
        self.reasons_per_gpu: list[int] = []  # the last tick's reasons, one per GPU
        self._unavailable = False  # read(): NVML failed once, do not ask again

    # ------------------------------------------------------------- lifecycle
    def start(self) -> GpuSampler:
        if not self.indices or not self._init():
            return self
        self._t0 = time.monotonic()
        self._energy0 = [self._energy(h) for h in self._handles]
        for pos, h in enumerate(self._handles):
            self._gpm_init(pos, h)
        self._thread = threading.Thread(target=self._loop, name="gpu-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(5.0)
        self._thread = None
        self._t1 = time.monotonic()
        self._energy1 = [self._energy(h) for h in self._handles]
        nv = self._nv
        for s in self._gpm.values():
            try:
                nv.nvmlGpmSampleFree(s)
            except Exception:  # noqa: BLE001 - best effort
                pass
        self._gpm.clear()
        try:
            nv.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass

    def __enter__(self) -> GpuSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------- NVML
    def _init(self) -> bool:
        nv = self._nvml_module
        if nv is None:
            try:
                import pynvml

                nv = pynvml
            except ImportError:
                _warn_once("nvidia-ml-py is not installed: no GPU telemetry")
                return False
        try:
            nv.nvmlInit()
            count = nv.nvmlDeviceGetCount()
            bad = [i for i in self.indices if i < 0 or i >= count]
            if bad:
                _warn_once("GPU indices %s not present (%d GPUs): no GPU telemetry", bad, count)
                nv.nvmlShutdown()
                return False
            self._handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in self.indices]
        except Exception as exc:  # noqa: BLE001 - NVMLError and driver library errors alike
            _warn_once("NVML unavailable (%s): no GPU telemetry", exc)
            return False
        self._nv = nv
        return True

    def _energy(self, h: Any) -> float | None:
        try:
            return float(self._nv.nvmlDeviceGetTotalEnergyConsumption(h))  # mJ
        except Exception:  # noqa: BLE001 - not supported on this device
            return None

    def _gpm_init(self, pos: int, h: Any) -> None:
        nv = self._nv
        try:
            if not nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice:
                return
            s = nv.nvmlGpmSampleAlloc()
            nv.nvmlGpmSampleGet(h, s)
            self._gpm[pos] = s
        except Exception as exc:  # noqa: BLE001
            log.info("GPM not available on GPU %d: %s", self.indices[pos], exc)

    def _gpm_read(self, pos: int, h: Any) -> dict[str, float]:
        nv = self._nv
        prev = self._gpm.get(pos)
        if prev is None:
            return {}
        cur = nv.nvmlGpmSampleAlloc()
        try:
            nv.nvmlGpmSampleGet(h, cur)
            req = nv.c_nvmlGpmMetricsGet_t()
            req.version = nv.NVML_GPM_METRICS_GET_VERSION
            req.sample1, req.sample2 = prev, cur
            ids = list(_GPM)
            req.numMetrics = len(ids)
            for i, m in enumerate(ids):
                req.metrics[i].metricId = m
            nv.nvmlGpmMetricsGet(req)
            out = {_GPM[req.metrics[i].metricId]: float(req.metrics[i].value)
                   for i in range(req.numMetrics) if req.metrics[i].nvmlReturn == nv.NVML_SUCCESS}
        except Exception as exc:  # noqa: BLE001
            log.info("GPM read failed on GPU %d: %s", self.indices[pos], exc)
            nv.nvmlGpmSampleFree(cur)
            return {}
        nv.nvmlGpmSampleFree(prev)
        self._gpm[pos] = cur
        return out

    def _tick(self, gpm_due: bool) -> None:
        nv = self._nv
        util, busy, mem, power, sm, gpm_vals = [], [], [], [], [], []
        reasons = 0
        self.reasons_per_gpu = []
        for pos, h in enumerate(self._handles):
            try:
                u = nv.nvmlDeviceGetUtilizationRates(h)
                util.append(float(u.gpu))
                busy.append(float(u.memory))
                mem.append(nv.nvmlDeviceGetMemoryInfo(h).used / 2**20)
                power.append(nv.nvmlDeviceGetPowerUsage(h) / 1000.0)
                sm.append(float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)))
                r = int(nv.nvmlDeviceGetCurrentClocksEventReasons(h))
                reasons |= r
                self.reasons_per_gpu.append(r)
            except Exception as exc:  # noqa: BLE001
                _warn_once("NVML read failed on GPU %d: %s", self.indices[pos], exc)
            if gpm_due:
                gpm_vals.append(self._gpm_read(pos, h))
        if util:
            self.util.append(_mean(util))
            self.mem_busy.append(_mean(busy))
            self.mem_mb.append(sum(mem))
            self.power_w.append(sum(power))
            self.sm_mhz.append(_mean(sm))
            self.reasons.append(reasons)
        for key in _GPM.values():
            vals = [g[key] for g in gpm_vals if key in g]
            if vals:
                self.gpm[key].append(_mean(vals))

    def _loop(self) -> None:
        last_gpm = time.monotonic()
        while not self._stop.wait(self.interval_s):
            now = time.monotonic()
            due = bool(self._gpm) and now - last_gpm >= _GPM_MIN_GAP_S
            if due:
                last_gpm = now
            self._tick(due)

    # ------------------------------------------------------------- one sample (no thread)
    def read(self) -> dict[str, float]:
        """One sample now, on the caller's thread (the production monitor reads one per scrape):
        gpu_util_pct and gpu_sm_clock_mhz (means over the GPUs), gpu_power_w and gpu_fb_used_mb (totals); with
        `window_mean`, the first three are the means of NVML's buffered samples since the previous read where the
        driver keeps them (the first read, and a driver without them, give the instantaneous value), the power the
        energy counters' rise over the time since the previous read where they count;
        gpu_throttled (the share of GPUs with a power, thermal or hardware clocks-event reason) and, with GPM,
        gpu_dram_active_frac (DRAM bandwidth utilisation, 0-1, since the previous read). {} without NVML."""
        if not self._handles:
            if self._unavailable or not self.indices or not self._init():
                self._unavailable = True
                return {}
            for pos, h in enumerate(self._handles):
                self._gpm_init(pos, h)
        n = len(self.util)
        self._tick(bool(self._gpm))
        out: dict[str, float] = {}
        if len(self.util) > n:
            out = {"gpu_util_pct": self.util[-1], "gpu_power_w": self.power_w[-1],
                   "gpu_sm_clock_mhz": self.sm_mhz[-1], "gpu_fb_used_mb": self.mem_mb[-1]}
            if self.window_mean:
                names = {"util": "gpu_util_pct", "power_w": "gpu_power_w", "sm_mhz": "gpu_sm_clock_mhz"}
                self.window_samples = {}
                watts = self._energy_power()
                out.update({names[k]: v for k, v in self._window_means(skip=() if watts is None
                                                                       else ("power_w",)).items()})
                if watts is not None:
                    out["gpu_power_w"] = watts
            m = self._throttle_mask()
            out["gpu_throttled"] = sum(1 for r in self.reasons_per_gpu if r & m) / max(1, len(self.reasons_per_gpu))
        if self.gpm["dram_bw_util_pct"]:
            out["gpu_dram_active_frac"] = self.gpm["dram_bw_util_pct"][-1] / 100.0
        for series in (self.util, self.mem_busy, self.mem_mb, self.power_w, self.sm_mhz, *self.gpm.values()):
            series.clear()  # a monitor reads for days: keep nothing
        self.reasons.clear()
        return out

    def _say_short_buffer(self, series: str, pos: int, since: int, stamps: list[int]) -> None:
        """Log once per series where its buffered samples since the previous read (`stamps`, in us, ascending)
        start later than that read by more than three of their usual gaps: the driver's buffer overflowed."""
        if len(stamps) < 2:
            return
        usual_gap = statistics.median_high(b - a for a, b in zip(stamps, stamps[1:], strict=False))
        if stamps[0] - since > 3 * usual_gap:
            self._short_buffer.add(series)
            log.info("NVML's %s buffer on GPU %d kept only the last %.1f s of the %.1f s since the previous read: "
                     "a window's mean covers that much", series, self.indices[pos], (stamps[-1] - stamps[0]) / 1e6,
                     (stamps[-1] - since) / 1e6)

    def _energy_power(self) -> float | None:
        """The GPUs' total power over the whole window, from their energy counters' rise since the previous read
        (the power buffer holds only the last ~2.4 s on an H200); None on the first read or without counters."""
        now = time.monotonic()
        energy = [self._energy(h) for h in self._handles]
        prev, self._last_energy = self._last_energy, (now, energy)
        if prev is None or now <= prev[0] or any(e is None for e in energy + prev[1]):
            return None
        rise_mj = [(b or 0.0) - (a or 0.0) for a, b in zip(prev[1], energy, strict=True)]
        if any(r < 0 for r in rise_mj):  # a driver reload restarted a counter
            return None
        self.window_samples["energy"] = len(energy)
        return sum(rise_mj) / 1000.0 / (now - prev[0])

    def _window_means(self, skip: tuple[str, ...] = ()) -> dict[str, float]:
        """Per series (but `skip`), the mean of NVML's buffered samples since the previous read (averaged over the
        GPUs; power summed), where every GPU's buffer had some; the first read only marks where the next begins."""
        nv = self._nv
        out: dict[str, float] = {}
        for series, (const, scale) in _BUFFERS.items():
            if series in skip or series in self._no_buffer or not hasattr(nv, const):
                continue
            means: list[float] = []
            count = 0
            for pos, h in enumerate(self._handles):
                got = self._buffered(pos, h, series, int(getattr(nv, const)))
                if got is not None:
                    means.append(_mean(got) * scale)
                    count += len(got)
            if series in self._no_buffer or len(means) < len(self._handles):
                continue
            out[series] = sum(means) if series == "power_w" else _mean(means)
            self.window_samples[series] = count
        return out

    def _buffered(self, pos: int, h: Any, series: str, kind: int) -> list[float] | None:
        """The buffered samples of one GPU's `series` newer than the last read (None: none, or the first read)."""
        key = (pos, series)
        since = self._last_ts.get(key, 0)
        try:
            value_type, samples = self._nv.nvmlDeviceGetSamples(h, kind, since)
        except Exception as exc:  # noqa: BLE001 - NVMLError: not supported, or nothing new
            if getattr(exc, "value", None) != getattr(self._nv, "NVML_ERROR_NOT_FOUND", _NVML_ERROR_NOT_FOUND):
                self._no_buffer.add(series)
                log.info("NVML keeps no %s samples on GPU %d (%s): its instantaneous value is read", series,
                         self.indices[pos], exc)
            return None
        fresh = sorted((s for s in samples if int(s.timeStamp) > since), key=lambda s: int(s.timeStamp))
        if not fresh:
            return None
        self._last_ts[key] = int(fresh[-1].timeStamp)
        if since == 0:
            return None  # the first read: the buffer's older samples belong to no window
        if series not in self._short_buffer:  # once said, not looked at again
            self._say_short_buffer(series, pos, since, [int(s.timeStamp) for s in fresh])
        member = _VALUE_FIELDS.get(int(value_type), "uiVal")
        return [float(getattr(s.sampleValue, member)) for s in fresh]

    def _throttle_masks(self) -> dict[str, int]:
        nv = self._nv
        return {
            "power": int(nv.nvmlClocksEventReasonSwPowerCap) | int(nv.nvmlClocksEventReasonHwPowerBrakeSlowdown),
            "thermal": int(nv.nvmlClocksEventReasonSwThermalSlowdown)
            | int(nv.nvmlClocksEventReasonHwThermalSlowdown),
            "hw": int(nv.nvmlClocksEventReasonHwSlowdown),
        }

    def _throttle_mask(self) -> int:
        m = 0
        for v in self._throttle_masks().values():
            m |= v
        return m

    # ------------------------------------------------------------- result
    def result(self) -> dict[str, float]:
        if not self._handles:
            return {}
        out: dict[str, float] = {"gpu_count": float(len(self._handles)), "gpu_samples": float(len(self.util))}
        if self._t1 > self._t0:
            out["gpu_sampled_s"] = self._t1 - self._t0
        if self.util:
            out["gpu_util_pct_mean"] = _mean(self.util)
            out["gpu_util_pct_max"] = max(self.util)
            out["gpu_mem_busy_pct_mean"] = _mean(self.mem_busy)
            out["gpu_memory_used_mb_mean"] = _mean(self.mem_mb)
            out["gpu_memory_used_mb_max"] = max(self.mem_mb)
            out["gpu_power_w_mean"] = _mean(self.power_w)
            out["gpu_power_w_max"] = max(self.power_w)
            out["gpu_sm_clock_mhz_mean"] = _mean(self.sm_mhz)
            out["gpu_sm_clock_mhz_min"] = min(self.sm_mhz)
            for name, m in self._throttle_masks().items():
                out[f"gpu_throttle_{name}_frac"] = sum(1 for r in self.reasons if r & m) / len(self.reasons)
            mask = 0
            for r in self.reasons:
                mask |= r
            out["gpu_clocks_event_reasons_mask"] = float(mask)
        e0, e1 = self._energy0, self._energy1
        if e0 and e1 and all(x is not None for x in e0 + e1):
            out["gpu_energy_j"] = sum((b or 0.0) - (a or 0.0) for a, b in zip(e0, e1, strict=True)) / 1000.0
        for key, vals in self.gpm.items():
            if vals:
                out[f"gpu_{key}_mean"] = _mean(vals)
                if key == "dram_bw_util_pct":
                    out[f"gpu_{key}_max"] = max(vals)
        return out
