"""The engine: a scheduler loop in its own thread over the runner and the KV pool.

Requests come in through `submit` (any thread) and leave through the `emit` callback, called once per
iteration from the engine thread with every (request, new tokens, finish reason) of that iteration.

Each iteration: take new requests and aborts; admit waiting requests (continuous batching: whenever a
slot and a batch place are free; static batching: only when no batch is running, once
`max_batch_size` requests wait or the oldest has waited `batch_timeout_ms`); run prefill chunks (at
most `prefill_chunk_tokens` prompt tokens, chunk boundaries fixed per sequence); then one decode step
over every decoding sequence. With `async_output` the new tokens are copied to pinned host memory
without blocking and handed out while the device runs the next iteration.

With `step_log` set, every loop pass that runs an iteration appends one JSON line to that file: the pass's
wall time (intake, admission with any KV pool growth, the iteration, the hand-out of its tokens) and the
iteration's shape (tuner.sim.refengine fits its step cost to these lines).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from tuner.engine.config import EngineConfig, EngineConfigError, ModelConfig
from tuner.engine.kv_pool import KVPool
from tuner.engine.model import DTYPES, build_model, hf_model_config
from tuner.engine.runner import GraphBackend, HostCopy, Runner
from tuner.engine.varlen import VarlenAttention

log = logging.getLogger(__name__)

MAX_CONSECUTIVE_FAILURES = 3  # iterations failing in a row: the device, not a request, is at fault

_ids = itertools.count()


@dataclass(eq=False)
class Request:
    prompt: list[int]
    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None
    ignore_eos: bool = False
    priority: int = 0
    arrival_s: float = field(default_factory=time.monotonic)
    id: int = field(default_factory=lambda: next(_ids))
    context: Any = None  # the caller's handle, returned with every output

    # engine state
    slot: int | None = None
    prefilled: int = 0  # prompt tokens already in the cache
    launched: int = 0  # output tokens whose computation has been launched
    emitted: int = 0
    finished: bool = False
    aborted: bool = False
    generator: torch.Generator | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None

    @property
    def decoding(self) -> bool:
        return self.prefilled == len(self.prompt) and self.launched > 0

    @property
    def done_launching(self) -> bool:
        return self.launched >= self.max_tokens


Output = tuple[Request, list[int], str | None]  # request, new token ids, finish reason or None


class EngineStats:
    """Hooks for metrics; the server plugs in Prometheus. Default: no-op."""

    def queue(self, running: int, waiting: int, kv_usage: float) -> None: ...

    def admitted(self, req: Request, queue_s: float) -> None: ...

    def ttft(self, seconds: float) -> None: ...

    def itl(self, seconds: float) -> None: ...

    def generated(self, tokens: int) -> None: ...

    def finished(self, req: Request, reason: str, e2e_s: float) -> None: ...

    def aborted(self, req: Request) -> None: ...


class Engine:
    def __init__(self, cfg: EngineConfig, *, emit: Callable[[list[Output]], None],
                 stats: EngineStats | None = None, graph_backend: GraphBackend | None = None,
                 host_copy: HostCopy | None = None, varlen: VarlenAttention | None = None) -> None:
        self.cfg = cfg
        self.device = cfg.resolved_device()
        self.graph_backend = graph_backend or GraphBackend()
        self.host_copy = host_copy or HostCopy()
        self.varlen = varlen or VarlenAttention()
        runs_here = [name for name, backend in (("cuda_graphs", self.graph_backend), ("async_output", self.host_copy))
                     if backend.runs_on(self.device)]
        cfg.validate(self.device, runs_here=tuple(runs_here), varlen=self.varlen)
        self.emit = emit
        self.stats = stats or EngineStats()
        self.phase_s: dict[str, float] = {}
        self.ready = threading.Event()
        self.fatal: BaseException | None = None
        self._inbox: queue.SimpleQueue[tuple[str, Request]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.waiting: list[Request] = []
        self.running: list[Request] = []  # holding a slot (prefilling or decoding)
        self.static_batch_open = False
        self.iterations = 0
        self._pending: tuple[list[tuple[Request, bool]], torch.Tensor, Any] | None = None
        self.shape: dict[str, int] = {}  # what the current pass computed (the step log's fields)
        self._step_log: Any = None
        self.mc: ModelConfig = self._model_config()
        if cfg.attention == "flash" and cfg.weights:  # a checkpoint's head dimension is known only now
            why = self.varlen.unavailable(self.device, cfg.dtype, self.mc.head_dim)
            if why:
                raise EngineConfigError(f"attention='flash' cannot run this model: {why}; use attention=sdpa or "
                                        "matmul", "attention")

    def _model_config(self) -> ModelConfig:
        if self.cfg.weights:
            from pathlib import Path

            mc = hf_model_config(Path(self.cfg.weights))
            if self.cfg.max_model_len is not None:
                import dataclasses

                mc = dataclasses.replace(mc, max_model_len=self.cfg.max_model_len)
            return mc
        return self.cfg.model_config()

    # ------------------------------------------------------------------ start-up
    def load(self) -> None:
        """Build the model, allocate the pool, capture graphs and warm up (timed phases)."""
        cfg = self.cfg
        if cfg.cpu_threads:
            torch.set_num_threads(cfg.cpu_threads)
        if self.device.startswith("cuda"):
            torch.backends.cuda.matmul.allow_tf32 = False
        t0 = time.perf_counter()
        self.model = build_model(self.mc, dtype=cfg.dtype, device=self.device, seed=cfg.seed,
                                 weights=cfg.weights, quantization=cfg.quantization,
                                 attention=cfg.attention, varlen=self.varlen)
        self._sync()
        self.phase_s["load"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        self.pool = KVPool(self.mc, dtype=DTYPES[cfg.dtype], device=self.device, pool_mb=cfg.kv_pool_mb,
                           pre_allocate=cfg.pre_allocate)
        self.runner = Runner(cfg, self.model, self.pool, self.device, graph_backend=self.graph_backend)
        self._sync()
        self.phase_s["allocate"] = time.perf_counter() - t0
        self.phase_s["capture"] = 0.0
        self.phase_s["compile"] = 0.0
        self.phase_s["warmup"] = 0.0
        if cfg.warmup:
            t0 = time.perf_counter()
            with self.runner.stream_ctx():
                if cfg.cuda_graphs:
                    self.runner.capture_all()
                    self.phase_s["capture"] = self.runner.capture_s
                self.runner.warmup(min(cfg.prefill_chunk_tokens, 64))
                self._sync()
            self.phase_s["compile"] = self.runner.compile_s
            self.phase_s["warmup"] = (time.perf_counter() - t0 - self.phase_s["capture"]
                                      - self.phase_s["compile"])
        log.info("engine ready on %s: %s, %.1f M params, pool %d slots (%d allocated), phases %s",
                 self.device, cfg.preset, self.mc.param_count() / 1e6, self.pool.capacity,
                 self.pool.allocated, {k: round(v, 3) for k, v in self.phase_s.items()})

    def _sync(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize(self.device)

    def start(self) -> None:
        """Load and run the loop in a daemon thread; `ready` is set once it serves."""
        self._thread = threading.Thread(target=self._main, name="engine", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        try:
            self.load()
            self.ready.set()
            # every device operation of the loop on the runner's stream: prefill, decode, sampling, and the
            # KV pool's growth at admission (allocate, zero, copy), which must be ordered with the work that
            # reads and writes the pool (that stream does not wait for the default one)
            if self.cfg.step_log:
                self._step_log = open(self.cfg.step_log, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
            with self.runner.stream_ctx():
                self._loop()
        except BaseException as exc:  # noqa: BLE001 - reported through /health and every request
            log.exception("engine failed")
            self.fatal = exc
            self._fail_all(f"engine failed: {exc}")
        finally:
            if self._step_log is not None:
                self._step_log.close()

    def stop(self) -> None:
        self._stop.set()
        self._inbox.put(("wake", Request([], 0)))
        if self._thread is not None:
            self._thread.join(timeout=10)

    # ------------------------------------------------------------------ intake
    def submit(self, req: Request) -> None:
        if self.fatal is not None:
            raise RuntimeError(f"engine failed: {self.fatal}")
        self._inbox.put(("add", req))

    def abort(self, req: Request) -> None:
        self._inbox.put(("abort", req))

    def _intake(self, block_s: float | None) -> None:
        try:
            item = self._inbox.get(timeout=block_s) if block_s is not None else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, req = item
            if kind == "add":
                try:
                    if req.temperature > 0:
                        req.generator = torch.Generator(device=self.device)
                        req.generator.manual_seed(req.seed if req.seed is not None
                                                  else int.from_bytes(os.urandom(8), "little") >> 1)
                except (RuntimeError, ValueError, OverflowError, TypeError) as exc:
                    self._fail([req], f"request refused: {exc}")  # this request alone
                else:
                    self.waiting.append(req)
            elif kind == "abort":
                self._abort(req)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _abort(self, req: Request) -> None:
        if req.finished:
            return
        req.aborted = True
        req.finished = True
        self.stats.aborted(req)
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self._release(req)

    def _release(self, req: Request) -> None:
        self.running.remove(req)
        if req.slot is not None:
            self.pool.release(req.slot)
            req.slot = None

    # ------------------------------------------------------------------ scheduling
    def _order(self) -> None:
        policy = self.cfg.scheduling_policy
        if policy == "priority":
            self.waiting.sort(key=lambda r: (r.priority, r.arrival_s, r.id))
        elif policy == "shortest-prompt-first":
            self.waiting.sort(key=lambda r: (len(r.prompt), r.arrival_s, r.id))
        else:
            self.waiting.sort(key=lambda r: (r.arrival_s, r.id))

    def _admit(self) -> float | None:
        """Move waiting requests into running. Returns seconds until a static batch may form."""
        if not self.waiting:
            return None
        cfg = self.cfg
        self._order()
        if cfg.batching == "static":
            if self.running:
                return None
            oldest = min(r.arrival_s for r in self.waiting)
            wait_s = cfg.batch_timeout_ms / 1000.0 - (time.monotonic() - oldest)
            if len(self.waiting) < cfg.max_batch_size and wait_s > 0:
                return wait_s
        while self.waiting and len(self.running) < cfg.max_batch_size:
            allocated = self.pool.allocated
            slot = self.pool.acquire()
            self.shape["grown_slots"] = self.shape.get("grown_slots", 0) + self.pool.allocated - allocated
            if slot is None:
                break  # pool full: the request waits
            req = self.waiting.pop(0)
            req.slot = slot
            self.running.append(req)
            self.stats.admitted(req, time.monotonic() - req.arrival_s)
        return None

    # ------------------------------------------------------------------ the loop
    def _loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            t0 = time.perf_counter()
            self.shape = {}
            self._intake(None)
            wait_s = self._admit()
            if not self.running:
                self._flush()
                self._publish()
                self._intake(wait_s if wait_s is not None else 0.5)
                continue
            try:
                t_step = time.perf_counter()
                self._iteration()
                if self.cfg.step_slowdown_frac > 0:  # a server slower by a known share (config step_slowdown_frac)
                    time.sleep(self.cfg.step_slowdown_frac * (time.perf_counter() - t_step))
                failures = 0
            except Exception as exc:  # noqa: BLE001 - the batch's requests fail, the engine goes on
                failures += 1
                if failures >= MAX_CONSECUTIVE_FAILURES:
                    raise  # the device itself is broken: the engine reports fatal
                log.exception("iteration failed; failing the %d request(s) it carried", len(self.running))
                self._fail_batch(f"request failed: {type(exc).__name__}: {exc}")
            self._publish()
            if self._step_log is not None:
                self._write_step(time.perf_counter() - t0)

    def _write_step(self, dt_s: float) -> None:
        """One line of the step log: the pass's wall time and the iteration's shape."""
        line = {"dt_s": round(dt_s, 7), "running": len(self.running), "waiting": len(self.waiting), **self.shape}
        self._step_log.write(json.dumps(line, separators=(",", ":")) + "\n")

    def _fail_batch(self, message: str) -> None:
        """Fail every running request (their slots come back) and drop an output copy in flight."""
        pending, self._pending = self._pending, None
        batch = list(self.running)
        for req in batch:
            self._release(req)
        if pending is not None:  # requests whose last token was still being copied out
            batch += [r for r, _ in pending[0] if r not in batch]
        self._fail([r for r in batch if not r.finished], message)

    def _fail(self, reqs: list[Request], message: str) -> None:
        for r in reqs:
            r.finished = True
        if reqs:
            self.emit([(r, [], "error:" + message) for r in reqs])

    def _publish(self) -> None:
        self.stats.queue(len(self.running), len(self.waiting), self.pool.usage())

    def _iteration(self) -> None:
        self.iterations += 1
        if self.cfg.step_delay_ms > 0:  # a deliberately slower engine (config step_delay_ms)
            time.sleep(self.cfg.step_delay_ms / 1000.0)
        emits: list[tuple[Request, bool]] = []  # (request, is_first_token)
        parts: list[torch.Tensor] = []
        decoding = [r for r in self.running if r.decoding and not r.done_launching]
        # ---- prefill: chunks of at most prefill_chunk_tokens, boundaries fixed per sequence
        budget = self.cfg.prefill_chunk_tokens
        done_slots: list[int] = []
        shape = self.shape
        for req in list(self.running):
            if req.prefilled == len(req.prompt) or budget <= 0:
                continue
            n = min(self.cfg.prefill_chunk_tokens, len(req.prompt) - req.prefilled)
            if n > budget and budget < self.cfg.prefill_chunk_tokens:
                break
            assert req.slot is not None
            logits = self.runner.prefill(req.prompt[req.prefilled: req.prefilled + n], req.prefilled, req.slot)
            shape["chunks"] = shape.get("chunks", 0) + 1
            shape["prefill_tokens"] = shape.get("prefill_tokens", 0) + n
            shape["prefill_pairs"] = shape.get("prefill_pairs", 0) + n * (req.prefilled + n)  # attention q x k
            req.prefilled += n
            budget -= n
            if req.prefilled == len(req.prompt):
                tok = self._choose(logits, req)
                self.runner.set_decode_state(req.slot, tok, len(req.prompt))
                req.launched = 1
                done_slots.append(req.slot)
                emits.append((req, True))
                shape["first_tokens"] = shape.get("first_tokens", 0) + 1
        if done_slots:
            parts.append(self.runner.dec_tok[torch.tensor(done_slots, device=self.device)])
        # ---- decode: one token for every decoding sequence, kept in slots [0, n)
        if decoding:
            self._compact(decoding)
            n = len(decoding)
            max_len = max(len(r.prompt) + r.launched for r in decoding)
            shape["decode_rows"] = n
            shape["decode_len"] = max_len
            logits = self.runner.decode(n, max_len)
            rows = sorted(decoding, key=lambda r: r.slot if r.slot is not None else -1)
            sampled = [(r.slot, r.temperature, r.generator) for r in rows
                       if r.temperature > 0 and r.generator is not None and r.slot is not None]
            if sampled:
                self.runner.sample_rows(logits, sampled)  # type: ignore[arg-type]
            parts.append(self.runner.dec_tok[:n].clone())
            for r in rows:
                r.launched += 1
                emits.append((r, False))
        # requests that have launched their last token free their slot now (stream-ordered)
        for req in [r for r in self.running if r.done_launching]:
            self._release(req)
        out = torch.cat(parts) if len(parts) > 1 else parts[0] if parts else None
        if out is None:
            self._flush()
            return
        if self.cfg.async_output:
            host, event = self.host_copy.start(out, self.runner.stream)
            previous, self._pending = self._pending, (emits, host, event)
            if previous is not None:
                self._deliver(*previous)
            return
        self._deliver(emits, out.cpu(), None)

    def _flush(self) -> None:
        if self._pending is not None:
            previous, self._pending = self._pending, None
            self._deliver(*previous)

    def _choose(self, logits: torch.Tensor, req: Request) -> torch.Tensor:
        if req.temperature > 0 and req.generator is not None:
            probs = torch.softmax(logits.float() / req.temperature, dim=-1)
            return torch.multinomial(probs, 1, generator=req.generator)[0]
        return logits.argmax()

    def _compact(self, decoding: list[Request]) -> None:
        """Move decoding sequences into slots [0, n) (swapping with prefilling ones or free slots)."""
        n = len(decoding)
        low = {r.slot for r in decoding if r.slot is not None and r.slot < n}
        holders = {r.slot: r for r in self.running if r.slot is not None}
        targets = iter(sorted(set(range(n)) - low))
        for req in decoding:
            assert req.slot is not None
            if req.slot < n:
                continue
            dst = next(targets)
            src = req.slot
            upto = len(req.prompt) + req.launched
            other = holders.get(dst)
            if other is None:
                self.pool.move(src, dst, upto)
            else:
                self.pool.swap(src, dst, max(upto, other.prefilled))
                other.slot = src
                holders[src] = other
            self.runner.swap_rows(src, dst)
            req.slot = dst
            holders[dst] = req

    def _deliver(self, emits: list[tuple[Request, bool]], host: torch.Tensor, event: Any) -> None:
        if event is not None:
            self.host_copy.wait(event)
        tokens = host.tolist()
        now = time.monotonic()
        outputs: list[Output] = []
        eos = self.mc.eos_token_id
        for (req, first), tok in zip(emits, tokens, strict=True):
            if req.finished:
                continue
            req.emitted += 1
            if first:
                req.first_token_s = now
                self.stats.ttft(now - req.arrival_s)
            elif req.last_token_s is not None:
                self.stats.itl(now - req.last_token_s)
            req.last_token_s = now
            reason = None
            if not req.ignore_eos and eos is not None and tok == eos:
                reason = "stop"
            elif req.emitted >= req.max_tokens:
                reason = "length"
            if reason is not None:
                req.finished = True
                if req in self.running:
                    self._release(req)
                self.stats.finished(req, reason, now - req.arrival_s)
            outputs.append((req, [tok], reason))
        if outputs:  # one token each
            self.stats.generated(len(outputs))
            self.emit(outputs)

    def _fail_all(self, message: str) -> None:
        reqs = [r for r in self.waiting + self.running if not r.finished]
        while True:
            try:
                kind, req = self._inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "add":
                reqs.append(req)
        self._fail(reqs, message)

    # ------------------------------------------------------------------ facts for the server
    def info(self) -> dict[str, Any]:
        return {"device": self.device, "preset": self.cfg.preset, "params": self.mc.param_count(),
                "max_model_len": self.mc.max_model_len, "pool_slots": self.pool.capacity,
                "phases_s": dict(self.phase_s), "torch": torch.__version__}
