"""A simulator of the reference engine (tuner/engine): its scheduling, with a step cost fitted to its own steps.

The scheduling mirrors tuner.engine.engine.Engine, one loop pass per step:
- admission: the waiting queue in policy order (fcfs: arrival; shortest-prompt-first: prompt length), moved
  into the running batch while fewer than `max_batch_size` run and the KV pool has a free slot (capacity
  `kv_pool_mb` // slot bytes; without `pre_allocate` the pool starts empty and doubles when full, which the
  step pays for); static batching admits only when nothing runs, once `max_batch_size` requests wait or the
  oldest has waited `batch_timeout_ms`, and nothing joins a running batch (it shrinks as requests finish);
- the iteration: prefill chunks in admission order, at most `prefill_chunk_tokens` prompt tokens in all (a
  chunk that does not fit what is left ends the prefills), a request whose prompt is done emits its first token;
  then one decode step over every sequence that was decoding before this iteration; a request that has
  launched its last token frees its slot; every token of the step is handed out at its end.
The event loop (arrivals, timeouts, wake-ups) is tuner.sim.engine.run_events; the step cost is
tuner.sim.refcost (one model per host, fitted by experiments/sim-calibration). Knobs the model does not
cover (quantization, compile, CUDA graphs, attention kernels, async output) are refused, not guessed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tuner.engine.config import EngineConfig, EngineConfigError, check_pool, slot_bytes
from tuner.errors import ConfigError, InfeasibleConfig
from tuner.measure.measurement import Measurement
from tuner.measure.metrics import summarise
from tuner.measure.records import RequestPlan
from tuner.sim.engine import DECODING, DONE, PREFILLING, SimResult, SimStats, _Req, run_events
from tuner.sim.refcost import StepCostFn, StepModel
from tuner.spec import WorkloadSpec

# knobs whose effect the fitted model covers; any other knob must keep its default
MODELLED = frozenset({"batching", "batch_timeout_ms", "max_batch_size", "prefill_chunk_tokens", "scheduling_policy",
                      "kv_pool_mb", "pre_allocate", "dtype", "warmup"})


def engine_config(params: Mapping[str, Any], *, preset: str = "tiny") -> EngineConfig:
    """The engine configuration of `params`, validated as the engine would on a CPU; InfeasibleConfig when the
    engine would refuse it, ConfigError when it sets a knob this simulator does not model."""
    default = EngineConfig()
    odd = sorted(k for k, v in params.items() if k not in MODELLED and getattr(default, k, v) != v)
    if odd:
        raise ConfigError(f"the reference-engine simulator does not model {odd} (modelled: {sorted(MODELLED)})",
                          field=odd[0])
    unknown = sorted(set(params) - set(EngineConfig.__dataclass_fields__))
    if unknown:
        raise ConfigError(f"unknown engine knob(s) {unknown}", field=unknown[0])
    try:
        cfg = EngineConfig(preset=preset, device="cpu", **dict(params))
        cfg.validate("cpu")
    except (EngineConfigError, TypeError) as exc:
        raise InfeasibleConfig(str(exc)) from None
    return cfg


class RefReplica:
    """The reference engine's scheduler over simulated time (the event loop's Replica)."""

    def __init__(self, rid: int, cfg: EngineConfig, cost: StepCostFn, stats: SimStats) -> None:
        self.rid = rid
        self.cfg = cfg
        self.cost = cost
        self.stats = stats
        self.busy = False
        self.wake_at: float | None = None
        self.outstanding = 0
        self.waiting: deque[_Req] = deque()
        self.aborts: list[_Req] = []
        self.step_end: list[float] = []
        self.running: list[_Req] = []
        mc = cfg.model_config()
        self.max_model_len = mc.max_model_len
        self.slot_mb = slot_bytes(mc, cfg.dtype) / 2**20
        self.capacity = check_pool(mc, cfg.dtype, cfg.kv_pool_mb)
        self.allocated = self.capacity if cfg.pre_allocate else 0
        self.used = 0
        self.timeout_s = cfg.batch_timeout_ms / 1000.0
        self.static = cfg.batching == "static"
        self.emits: list[tuple[_Req, bool]] = []

    def leftover(self) -> tuple[int, int, int]:
        return self.used, sum(1 for r in self.running if r.state == DECODING), len(self.running)

    # ------------------------------------------------------------ admission
    def _order(self) -> list[_Req]:
        live = [r for r in self.waiting if r.state != DONE]
        if self.cfg.scheduling_policy == "shortest-prompt-first":
            live.sort(key=lambda r: (r.prompt, r.arrived_s, r.plan.index))
        else:
            live.sort(key=lambda r: (r.arrived_s, r.plan.index))
        return live

    def _acquire(self, shape: dict[str, int]) -> bool:
        if self.used >= self.allocated:
            if self.allocated >= self.capacity:
                return False
            grown = min(self.capacity, max(1, 2 * self.allocated))
            shape["grown_slots"] = shape.get("grown_slots", 0) + grown - self.allocated
            self.allocated = grown
        self.used += 1
        return True

    def _admit(self, t: float, shape: dict[str, int]) -> None:
        queue = self._order()
        self.waiting = deque(queue)
        if not queue:
            return
        cfg = self.cfg
        if self.static:
            if self.running:
                return
            deadline = min(r.arrived_s for r in queue) + self.timeout_s
            if len(queue) < cfg.max_batch_size and t < deadline:
                self.wake_at = deadline
                return
            self.wake_at = None
        while self.waiting and len(self.running) < cfg.max_batch_size:
            if not self._acquire(shape):
                break
            r = self.waiting.popleft()
            r.state = PREFILLING
            r.prefilled = 0
            r.gen = 0
            self.running.append(r)

    def _release(self, r: _Req) -> None:
        self.running.remove(r)
        self.used -= 1

    def _apply_aborts(self) -> None:
        for r in self.aborts:
            if r in self.running:
                self._release(r)
            r.state = DONE
        self.aborts.clear()

    # ------------------------------------------------------------ one step
    def start_step(self, t: float) -> float | None:
        if self.aborts:
            self._apply_aborts()
        shape: dict[str, int] = {}
        self._admit(t, shape)
        if not self.running:
            return None
        cfg = self.cfg
        chunk = cfg.prefill_chunk_tokens
        decoding = [r for r in self.running if r.state == DECODING and r.gen < r.out]
        emits: list[tuple[_Req, bool]] = []
        budget = chunk
        for r in list(self.running):
            if r.state != PREFILLING or budget <= 0:
                continue
            n = min(chunk, r.prompt - r.prefilled)
            if n > budget and budget < chunk:
                break
            shape["chunks"] = shape.get("chunks", 0) + 1
            shape["prefill_tokens"] = shape.get("prefill_tokens", 0) + n
            shape["prefill_pairs"] = shape.get("prefill_pairs", 0) + n * (r.prefilled + n)
            r.prefilled += n
            budget -= n
            if r.prefilled == r.prompt:
                r.state = DECODING
                r.gen = 1
                emits.append((r, True))
                shape["first_tokens"] = shape.get("first_tokens", 0) + 1
        if decoding:
            shape["decode_rows"] = len(decoding)
            shape["decode_len"] = max(r.prompt + r.gen for r in decoding)
            for r in decoding:
                r.gen += 1
                emits.append((r, False))
        for r in [r for r in self.running if r.state == DECODING and r.gen >= r.out]:
            self._release(r)
        dt = self.cost.seconds(shape, max_model_len=self.max_model_len, slot_mb=self.slot_mb)
        st = self.stats
        st.steps += 1
        st.batch_tokens += shape.get("prefill_tokens", 0) + shape.get("decode_rows", 0)
        st.running_sum += len(self.running)
        st.busy_s += dt
        st.peak_waiting = max(st.peak_waiting, len(self.waiting))
        self.emits = emits
        t_end = t + dt
        self.step_end.append(t_end)
        return t_end

    def finish_step(self, t_end: float) -> list[_Req]:
        done: list[_Req] = []
        for r, first in self.emits:
            if r.state == DONE or r.error is not None:  # aborted meanwhile, or its client gave up
                continue
            r.times.append(t_end)
            if first:
                r.first_s = t_end
            if len(r.times) >= r.out:
                r.state = DONE
                r.done_s = t_end
                done.append(r)
        self.emits = []
        return done


def simulate_ref(cfg: EngineConfig, model: StepModel, plans: Sequence[RequestPlan], *, concurrency: int | None,
                 timeout_s: float, stop_sending_s: float | None = None, warmup_s: float = 0.0) -> SimResult:
    """Run `plans` through the reference engine configured as `cfg`, priced by `model` (noise-free)."""
    stats = SimStats()
    rep = RefReplica(0, cfg, model.cost(cfg.dtype), stats)
    return run_events([rep], plans, stats=stats, max_model_len=cfg.model_config().max_model_len,
                      concurrency=concurrency, timeout_s=timeout_s, stop_sending_s=stop_sending_s,
                      warmup_s=warmup_s, ingress_s=model.ingress_s)


def predict(model: StepModel, params: Mapping[str, Any], workload: WorkloadSpec, *, seed: int,
            goodput_ms: Mapping[str, float] | None = None, preset: str = "tiny",
            base_dir: Path | None = None) -> Measurement:
    """The measurement the load generator would take of `params` under `workload` with plans of `seed`
    (the real run's requests: same lengths and arrival times), as the simulator predicts it."""
    from tuner.measure.datasets import plans_for
    from tuner.measure.tokenize import load_tokenizer

    cfg = engine_config(params, preset=preset)
    if workload.auto_rate:
        raise ConfigError("the workload's rate is still auto: predict a sized workload", field="workload.arrival")
    tok = load_tokenizer("byte", seed=seed)
    plans, notes = plans_for(workload, seed=seed, tok=tok, base_dir=base_dir)
    a = workload.arrival
    concurrency = a.concurrency if a.kind == "closed" else None
    stop = workload.warmup_s + workload.duration_s if workload.duration_s is not None else None
    res = simulate_ref(cfg, model, plans, concurrency=concurrency, timeout_s=workload.timeout_s,
                       stop_sending_s=stop, warmup_s=workload.warmup_s)
    telemetry = {"sim_steps": float(res.stats.steps), "sim_timeouts": float(res.stats.timeouts),
                 "sim_peak_waiting": float(res.stats.peak_waiting)}
    return Measurement(summary=summarise(res.records, goodput_ms=goodput_ms or None), records=tuple(res.records),
                       telemetry=telemetry, notes=tuple(notes))


__all__ = ["MODELLED", "RefReplica", "StepModel", "engine_config", "predict", "simulate_ref"]
