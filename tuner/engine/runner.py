"""Model execution: prefill chunks, the decode step, CUDA graphs, torch.compile and sampling.

Decode state lives on the device, one row per KV slot: `dec_tok[s]` (the token slot s feeds next)
and `dec_pos[s]` (its position). The scheduler keeps decoding sequences in slots 0..n-1, so a decode
step over n sequences reads rows and slots [0, b) with b >= n (b is a captured batch size when
graphs or compile pad the batch; padded rows write to the scratch column and are discarded). The
step updates dec_tok and dec_pos in place, so consecutive steps need no host round trip.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from tuner.engine.config import EngineConfig
from tuner.engine.kv_pool import KVPool
from tuner.engine.model import LlamaModel

log = logging.getLogger(__name__)


def batch_buckets(limit: int) -> list[int]:
    """Batch sizes to capture or pad to: 1, 2, 4, 8, then every 8 to 64, then every 32."""
    out = [1, 2, 4, 8]
    b = 16
    while b <= 64:
        out.append(b)
        b += 8
    b = 96
    while b <= 4096:
        out.append(b)
        b += 32
    sizes = [s for s in out if s < limit] + [limit]
    return sorted(set(sizes))


def attn_buckets(max_model_len: int) -> list[int]:
    """Attention lengths to capture decode graphs for: 256, 384, 512, 768, 1024, ... (x1.5/x1.33 steps),
    then the full slot (max_model_len + 1). A replay attends over the smallest bucket that covers the
    longest live row, so a step reads at most ~1.5x the live context's KV, not the whole slot."""
    out: list[int] = []
    a = 256
    while a <= max_model_len:
        out.append(a)
        if a + a // 2 <= max_model_len:
            out.append(a + a // 2)
        a *= 2
    return sorted({x for x in out if x <= max_model_len} | {max_model_len + 1})


class GraphBackend:
    """How the runner captures a decode step and replays it. Production: CUDA graphs."""

    def runs_on(self, device: str) -> bool:
        return device.startswith("cuda")

    def pool(self) -> Any:
        return torch.cuda.graph_pool_handle()

    def capture(self, step: Callable[[], object], pool: Any, stream: Any) -> Callable[[], None]:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=stream):
            step()
        return graph.replay


class HostCopy:
    """How `async_output` brings a step's new tokens to the host without waiting for the step. Production:
    a non-blocking copy into pinned memory and a CUDA event recorded after it on the engine's stream."""

    def runs_on(self, device: str) -> bool:
        return device.startswith("cuda")

    def start(self, out: torch.Tensor, stream: Any) -> tuple[torch.Tensor, Any]:
        host = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
        host.copy_(out, non_blocking=True)
        event = torch.cuda.Event()
        event.record(stream)
        return host, event

    def wait(self, event: Any) -> None:
        event.synchronize()


class Runner:
    def __init__(self, cfg: EngineConfig, model: LlamaModel, pool: KVPool, device: str,
                 graph_backend: GraphBackend | None = None) -> None:
        self.cfg = cfg
        self.graph_backend = graph_backend or GraphBackend()
        self.model = model
        self.pool = pool
        self.device = device
        self.is_cuda = device.startswith("cuda")
        self.L = model.cfg.max_model_len  # scratch column index
        self.max_rows = max(1, min(cfg.max_batch_size, pool.capacity))
        self.pad = cfg.cuda_graphs or cfg.compile
        self.buckets = batch_buckets(self.max_rows)
        graph_limit = min(cfg.cuda_graph_max_batch, self.max_rows)
        self.graph_sizes = [b for b in self.buckets if b <= graph_limit]
        if cfg.cuda_graphs and graph_limit not in self.graph_sizes:
            self.graph_sizes.append(graph_limit)
        rows = max(pool.capacity, self.buckets[-1])
        self.dec_tok = torch.zeros(rows, dtype=torch.long, device=device)
        self.dec_pos = torch.zeros(rows, dtype=torch.long, device=device)
        self.stream: Any = None
        if self.is_cuda:
            prio = -1 if cfg.stream_priority == "high" else 0
            self.stream = torch.cuda.Stream(device=device, priority=prio)
        # flash reads only each row's own keys whatever the attention length: one graph per batch size serves
        # every length, so warm-up captures no bucket it would not need
        self.attn_sizes = [self.L + 1] if cfg.attention == "flash" else attn_buckets(self.L)
        # (batch, attn_len) -> (replay, the logits it writes)
        self.graphs: dict[tuple[int, int], tuple[Callable[[], None], torch.Tensor]] = {}
        self.graph_pool: Any = None
        # Every graph copies its logits into this one buffer (allocated outside the graphs' pool), so the
        # graphs keep no output of their own: with one graph per (batch, attention bucket), per-graph
        # outputs would pin sum(batch sizes) x buckets x vocab floats (GBs for a large vocabulary).
        self.graph_logits: torch.Tensor | None = None
        self.capture_s = 0.0
        self.compile_s = 0.0
        self._compiled_sizes: set[int] = set()
        self._decode_model: Callable[..., torch.Tensor] = model.decode
        if cfg.compile:
            from torch import _dynamo

            _dynamo.config.cache_size_limit = max(_dynamo.config.cache_size_limit, 64)
            self._decode_model = torch.compile(model.decode)

    # ------------------------------------------------------------------ context
    def stream_ctx(self) -> Any:
        if self.stream is not None:
            return torch.cuda.stream(self.stream)
        import contextlib

        return contextlib.nullcontext()

    # ------------------------------------------------------------------ prefill
    @torch.inference_mode()
    def prefill(self, tokens: list[int], start: int, slot: int) -> torch.Tensor:
        t = torch.tensor(tokens, dtype=torch.long, device=self.device)
        return self.model.prefill(t, start, slot, self.pool.k, self.pool.v)

    @torch.inference_mode()
    def set_decode_state(self, slot: int, token: torch.Tensor, position: int) -> None:
        self.dec_tok[slot] = token
        self.dec_pos[slot] = position

    @torch.inference_mode()
    def swap_rows(self, a: int, b: int) -> None:
        idx = torch.tensor([a, b], device=self.device)
        rev = torch.tensor([b, a], device=self.device)
        self.dec_tok[idx] = self.dec_tok[rev]
        self.dec_pos[idx] = self.dec_pos[rev]

    # ------------------------------------------------------------------ decode
    def _step(self, b: int, attn_len: int) -> torch.Tensor:
        tok = self.dec_tok[:b]
        pos = self.dec_pos[:b]
        logits = self._decode_model(tok, pos, self.pool.k, self.pool.v, attn_len)
        self.dec_tok[:b] = logits.argmax(dim=-1)
        self.dec_pos[:b] += 1
        return logits

    def padded_size(self, n: int) -> int:
        if not self.pad:
            return n
        # the smallest captured graph that fits (the largest graph size need not be a bucket)
        for b in self.graph_sizes if self.cfg.cuda_graphs else ():
            if b >= n:
                return b
        for b in self.buckets:
            if b >= n:
                return b
        return n

    @torch.inference_mode()
    def decode(self, n: int, max_len: int) -> torch.Tensor:
        """One decode step over slots [0, n). max_len: the longest row's length after this step.

        Returns float32 logits of rows [0, n) (a view that the next step may overwrite).
        """
        b = self.padded_size(n)
        graphed = self.cfg.cuda_graphs and b in self.graph_sizes
        if not graphed and not self.cfg.compile:
            # eager (also a batch larger than the largest graph): the rows as they are, the live context
            return self._step(n, min(self.L + 1, -(-max_len // 64) * 64))[:n]
        # Padded rows [n, b) are slots of other sequences (prefilling, or done with their prefill in this
        # very iteration): their decode state is set aside, they write only the scratch column, and their
        # state is put back after the step.
        kept = (self.dec_tok[n:b].clone(), self.dec_pos[n:b].clone()) if b > n else None
        if kept is not None:
            self.dec_pos[n:b] = self.L
        if graphed:
            key = (b, self.attn_bucket(max_len))
            if key not in self.graphs:
                self.capture(*key)
            replay, logits = self.graphs[key]
            replay()
        elif b not in self._compiled_sizes:
            # few shapes for the compiler: batch sizes padded to buckets, attention over the whole slot
            t0 = time.perf_counter()
            logits = self._step(b, self.L + 1)
            self._sync()
            self.compile_s += time.perf_counter() - t0
            self._compiled_sizes.add(b)
        else:
            logits = self._step(b, self.L + 1)
        if kept is not None:
            self.dec_tok[n:b] = kept[0]
            self.dec_pos[n:b] = kept[1]
        return logits[:n]

    def _sync_stream(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()

    def _sync(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def attn_bucket(self, max_len: int) -> int:
        """The smallest captured attention length that covers rows of length up to `max_len`."""
        for a in self.attn_sizes:
            if a >= max_len:
                return a
        return self.L + 1

    @torch.inference_mode()
    def capture(self, b: int, attn_len: int | None = None) -> None:
        """Capture the decode step for batch size b attending over `attn_len` positions (default: the
        whole slot). Rows [0, b) keep their state."""
        t0 = time.perf_counter()
        saved_tok = self.dec_tok[:b].clone()
        saved_pos = self.dec_pos[:b].clone()
        if self.graph_pool is None:
            self.graph_pool = self.graph_backend.pool()
        if self.graph_logits is None or self.graph_logits.shape[0] < b:
            # (graphs captured before keep the old buffer alive through the views they hold)
            rows = max(self.graph_sizes + [b])
            self.graph_logits = torch.empty(rows, self.model.cfg.vocab_size, dtype=torch.float32, device=self.device)
        out = self.graph_logits
        attn_len = self.L + 1 if attn_len is None else attn_len
        # warm-up runs on the side stream (compiles, and lets cuBLAS pick its kernels)
        for _ in range(2):
            self.dec_pos[:b] = self.L
            self._step(b, attn_len)
        self.dec_pos[:b] = self.L
        self._sync_stream()
        replay = self.graph_backend.capture(lambda: out[:b].copy_(self._step(b, attn_len)), self.graph_pool,
                                            self.stream)
        self.dec_tok[:b] = saved_tok
        self.dec_pos[:b] = saved_pos
        self._sync_stream()
        self.graphs[(b, attn_len)] = (replay, out[:b])
        dt = time.perf_counter() - t0
        self.capture_s += dt
        log.debug("captured decode graph for batch %d, attention %d in %.3f s", b, attn_len, dt)

    @torch.inference_mode()
    def capture_all(self) -> None:
        """Every graph serving can replay: each captured batch size x each attention-length bucket, the
        largest first (later captures reuse the first ones' memory pool). Without this (warmup off), a
        graph is captured the first time serving needs it, which costs that step a few milliseconds."""
        for b in sorted(self.graph_sizes, reverse=True):
            for a in sorted(self.attn_sizes, reverse=True):
                if (b, a) not in self.graphs:
                    self.capture(b, a)

    @torch.inference_mode()
    def sample_rows(self, logits: torch.Tensor, rows: list[tuple[int, float, torch.Generator]]) -> None:
        """Replace the greedy choice of the given rows by a sample at their temperature."""
        for row, temperature, gen in rows:
            probs = torch.softmax(logits[row].float() / temperature, dim=-1)
            self.dec_tok[row] = torch.multinomial(probs, 1, generator=gen)[0]

    @torch.inference_mode()
    def warmup(self, prefill_tokens: int) -> None:
        """Dummy prefill and decode batches on scratch state: caches, kernels, graphs, compilation."""
        slot = self.pool.acquire()
        if slot is None:
            return
        try:
            n = max(1, min(prefill_tokens, self.L - 1))
            self.prefill([1] * n, 0, slot)
            sizes = self.graph_sizes if self.cfg.cuda_graphs else (
                self.buckets if self.cfg.compile else sorted({1, self.max_rows}))
            for b in sizes:
                b = min(b, self.pool.allocated)
                self.dec_pos[:b] = self.L - 1
                self.dec_tok[:b] = 1
                self.decode(b, self.L)
            self.dec_pos.zero_()
            self.dec_tok.zero_()
            self._sync()
        finally:
            self.pool.release(slot)
