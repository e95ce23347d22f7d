"""A small OpenAI-compatible server with known latencies, for tests and experiments.

Run as a process (other helpers launch it this way; keep the CLI stable):

    python tests/support/fake_openai_server.py --port 8000 [--host 127.0.0.1] [--model fake]
        [--ttft-ms 20] [--itl-ms 5] [--error-status 0] [--error-every 0] [--ready-delay-s 0]
        [--max-concurrency 0] [--queue] [--break-every 0] [--cpu N]

or in-process from a test:

    with start_fake_server(ttft_ms=20, itl_ms=5) as srv:   # runs in a background thread
        measure(srv.url, ...)
    with spawn_fake_server(ttft_ms=20) as srv:              # runs as a subprocess (separate core/GIL)
        ...

Behaviour:
- `POST /v1/completions` and `/v1/chat/completions` produce exactly `max_tokens` tokens (default 16),
  streamed as SSE `data: {...}` chunks with TTFT `--ttft-ms` and inter-token gap `--itl-ms` (scheduled
  against absolute deadlines, so delays do not drift), an extra usage chunk when
  `stream_options.include_usage`, then `data: [DONE]`. Non-streaming answers wait the same total time.
- Prompt tokens are counted byte-level (1 token per UTF-8 byte) for text, or the list length for token ids.
- `--error-status S` makes requests fail with HTTP S: every request when `--error-every` <= 1, else every
  N-th request (1-based count of completion requests).
- `--max-concurrency C`: more than C requests in flight get 503 (or wait, with `--queue`).
- `--break-every N`: every N-th request's stream is cut after half its tokens (no `[DONE]`).
- `--ready-delay-s D`: the port is bound only after D seconds (connection refused until ready, like vLLM).
- `GET /v1/models`, `GET /health` (200, empty body), `GET /metrics` (Prometheus text, vLLM metric names).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)
STATE: web.AppKey[Any] = web.AppKey("state", object)

TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0)
E2E_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


@dataclass
class FakeOptions:
    model: str = "fake"
    ttft_ms: float = 20.0
    itl_ms: float = 5.0
    error_status: int = 0
    error_every: int = 0
    ready_delay_s: float = 0.0
    max_concurrency: int = 0
    queue: bool = False
    break_every: int = 0
    default_max_tokens: int = 16


class _Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.sum += v
        self.count += 1
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out = [f"# HELP {name} fake histogram", f"# TYPE {name} histogram"]
        for b, c in zip(self.buckets, self.counts, strict=True):
            out.append(f'{name}_bucket{{{labels},le="{b}"}} {c}')
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.count}')
        out.append(f"{name}_sum{{{labels}}} {self.sum}")
        out.append(f"{name}_count{{{labels}}} {self.count}")
        return out


@dataclass
class _State:
    opts: FakeOptions
    requests: int = 0  # completion requests received
    in_flight: int = 0
    waiting: int = 0
    peak_in_flight: int = 0
    success: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    ttft: _Histogram = field(default_factory=lambda: _Histogram(TTFT_BUCKETS_S))
    itl: _Histogram = field(default_factory=lambda: _Histogram(ITL_BUCKETS_S))
    e2e: _Histogram = field(default_factory=lambda: _Histogram(E2E_BUCKETS_S))
    sem: asyncio.Semaphore | None = None
    last_body: dict[str, Any] | None = None  # the last completion request's body, as received


def _count_prompt(body: dict[str, Any], chat: bool) -> int:
    if chat:
        n = 0
        for m in body.get("messages") or []:
            c = m.get("content", "")
            if isinstance(c, str):
                n += len(c.encode())
            elif isinstance(c, list):
                n += sum(len(str(p.get("text", "")).encode()) for p in c if isinstance(p, dict))
        return n
    p = body.get("prompt", "")
    if isinstance(p, list):
        if p and isinstance(p[0], list):
            return len(p[0])
        if p and isinstance(p[0], str):
            return len(p[0].encode())
        return len(p)
    return len(str(p).encode())


def _chunk(rid: str, model: str, chat: bool, created: int, text: str, finish: str | None) -> bytes:
    if chat:
        delta: dict[str, Any] = {"content": text}
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    d = {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}
    return b"data: " + json.dumps(d, separators=(",", ":")).encode() + b"\n\n"


def build_app(opts: FakeOptions) -> web.Application:
    """The aiohttp application of the fake server."""
    st = _State(opts=opts)
    if opts.max_concurrency > 0 and opts.queue:
        st.sem = asyncio.Semaphore(opts.max_concurrency)

    async def health(_: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": opts.model, "object": "model", "created": 0, "owned_by": "fake", "max_model_len": 1 << 20}
        ]})

    async def metrics(_: web.Request) -> web.Response:
        lab = f'model_name="{opts.model}",engine="0"'
        cap = opts.max_concurrency or 256
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{lab}}} {st.in_flight}",
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{lab}}} {st.waiting}",
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{{{lab}}} {min(1.0, st.in_flight / cap)}",
            "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.",
            "# TYPE vllm:num_preemptions_total counter",
            f"vllm:num_preemptions_total{{{lab}}} 0.0",
            "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{{{lab}}} {float(st.prompt_tokens)}",
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{{{lab}}} {float(st.generation_tokens)}",
            "# HELP vllm:request_success_total Count of successfully processed requests.",
            "# TYPE vllm:request_success_total counter",
            f'vllm:request_success_total{{{lab},finished_reason="length"}} {float(st.success)}',
        ]
        lines += st.ttft.lines("vllm:time_to_first_token_seconds", lab)
        lines += st.itl.lines("vllm:inter_token_latency_seconds", lab)
        lines += st.e2e.lines("vllm:e2e_request_latency_seconds", lab)
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def complete(request: web.Request) -> web.StreamResponse:
        chat = request.path.endswith("/chat/completions")
        def err(msg: str, status: int) -> web.Response:
            return web.json_response({"error": {"message": msg, "code": status}}, status=status)

        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return err("invalid JSON", 400)
        if not isinstance(body, dict):
            return err("body must be an object", 400)
        st.requests += 1
        st.last_body = body
        k = st.requests
        if opts.error_status and (opts.error_every <= 1 or k % opts.error_every == 0):
            return web.json_response({"error": {"message": "injected error", "code": opts.error_status}},
                                     status=opts.error_status)
        if body.get("model") not in (None, opts.model):
            return web.json_response({"error": {"message": f"model {body.get('model')!r} not found",
                                                "code": 404}}, status=404)
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or opts.default_max_tokens
        try:
            n_out = int(max_tokens)
        except (TypeError, ValueError):
            return err("max_tokens must be an int", 400)
        if n_out < 1:
            return err("max_tokens must be >= 1", 400)
        if opts.max_concurrency > 0 and st.sem is None and st.in_flight >= opts.max_concurrency:
            return err("server overloaded", 503)
        if st.sem is not None:
            st.waiting += 1
            try:
                await st.sem.acquire()
            finally:
                st.waiting -= 1
        st.in_flight += 1
        st.peak_in_flight = max(st.peak_in_flight, st.in_flight)
        try:
            return await _serve(request, body, chat, n_out, k)
        finally:
            st.in_flight -= 1
            if st.sem is not None:
                st.sem.release()

    async def _serve(request: web.Request, body: dict[str, Any], chat: bool, n_out: int,
                     k: int) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        n_in = _count_prompt(body, chat)
        rid = f"cmpl-{k}"
        created = int(time.time())
        model = opts.model
        ttft_s = opts.ttft_ms / 1000.0
        itl_s = opts.itl_ms / 1000.0
        usage = {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}
        broken = opts.break_every > 0 and k % opts.break_every == 0
        if not body.get("stream"):
            await asyncio.sleep(max(0.0, ttft_s + itl_s * (n_out - 1)))
            st.success += 1
            st.prompt_tokens += n_in
            st.generation_tokens += n_out
            st.e2e.observe(loop.time() - t0)
            st.ttft.observe(ttft_s)
            text = "x" * n_out
            if chat:
                choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                          "finish_reason": "length"}
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
            return web.json_response({"id": rid, "object": "chat.completion" if chat else "text_completion",
                                      "created": created, "model": model, "choices": [choice],
                                      "usage": usage})
        so = body.get("stream_options") or {}
        include_usage = bool(so.get("include_usage"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        n_send = n_out // 2 if broken else n_out
        if ttft_s <= 0 and itl_s <= 0:
            # instant server: one write for the whole stream (keeps the server off the critical path)
            parts = [_chunk(rid, model, chat, created, "x", "length" if i == n_out - 1 else None)
                     for i in range(n_send)]
            if broken:
                await resp.write(b"".join(parts))
                if request.transport is not None:
                    request.transport.close()
                return resp
            if include_usage:
                final = {"id": rid, "object": "text_completion", "created": created, "model": model,
                         "choices": [], "usage": usage}
                parts.append(b"data: " + json.dumps(final, separators=(",", ":")).encode() + b"\n\n")
            parts.append(b"data: [DONE]\n\n")
            await resp.write(b"".join(parts))
            st.ttft.observe(loop.time() - t0)
        else:
            last = t0
            for i in range(n_send):
                deadline = t0 + ttft_s + itl_s * i
                delay = deadline - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                await resp.write(_chunk(rid, model, chat, created, "x", "length" if i == n_out - 1 else None))
                now = loop.time()
                if i == 0:
                    st.ttft.observe(now - t0)
                else:
                    st.itl.observe(now - last)
                last = now
            if broken:
                if request.transport is not None:
                    request.transport.close()
                return resp
            if include_usage:
                await resp.write(b"data: " + json.dumps(
                    {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                     "created": created, "model": model, "choices": [], "usage": usage},
                    separators=(",", ":")).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        st.success += 1
        st.prompt_tokens += n_in
        st.generation_tokens += n_out
        st.e2e.observe(loop.time() - t0)
        return resp

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[STATE] = st
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", complete)
    app.router.add_post("/v1/chat/completions", complete)
    return app


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


async def _serve_forever(opts: FakeOptions, host: str, port: int, reuse_port: bool = False) -> None:
    if opts.ready_delay_s > 0:
        await asyncio.sleep(opts.ready_delay_s)
    runner = web.AppRunner(build_app(opts), access_log=None, handle_signals=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096, reuse_port=reuse_port or None)
    await site.start()
    log.info("fake OpenAI server on http://%s:%d (model %s)", host, port, opts.model)
    await asyncio.Event().wait()


class FakeServer:
    """A fake server running on its own event loop in a background thread."""

    def __init__(self, opts: FakeOptions, host: str = "127.0.0.1") -> None:
        self.opts = opts
        self.host = host
        self.port = free_port(host)
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="fake-openai-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def state(self) -> Any:
        """Counters of the running server (requests, peak_in_flight, success, ...)."""
        assert self._runner is not None
        return self._runner.app[STATE]

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._start())
        except BaseException as exc:  # noqa: BLE001 - reported to the starter
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        if self._runner is not None:
            self._loop.run_until_complete(self._runner.cleanup())
        pending = asyncio.all_tasks(self._loop)
        for t in pending:
            t.cancel()
        self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._loop.close()

    async def _start(self) -> None:
        self._runner = web.AppRunner(build_app(self.opts), access_log=None, handle_signals=False,
                                     shutdown_timeout=0.5)
        await self._runner.setup()
        if self.opts.ready_delay_s > 0:
            self._loop.call_later(self.opts.ready_delay_s, lambda: asyncio.ensure_future(self._bind()))
        else:
            await self._bind()

    async def _bind(self) -> None:
        assert self._runner is not None
        await web.TCPSite(self._runner, self.host, self.port, backlog=4096).start()

    def start(self) -> FakeServer:
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise RuntimeError(f"fake server failed to start: {self._error}") from self._error
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self) -> FakeServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def start_fake_server(**kwargs: Any) -> Iterator[FakeServer]:
    """Run a fake server in a background thread of this process; yields it (`.url`, `.port`, `.state`)."""
    srv = FakeServer(FakeOptions(**kwargs)).start()
    try:
        yield srv
    finally:
        srv.stop()


@dataclass
class SpawnedServer:
    proc: subprocess.Popen[bytes]
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def wait_healthy(url: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1.0) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url}/health not ready after {timeout_s} s")
        time.sleep(0.05)


def cli_args(opts: FakeOptions) -> list[str]:
    """Command-line flags that reproduce `opts`."""
    args = ["--model", opts.model, "--ttft-ms", str(opts.ttft_ms), "--itl-ms", str(opts.itl_ms),
            "--error-status", str(opts.error_status), "--error-every", str(opts.error_every),
            "--ready-delay-s", str(opts.ready_delay_s), "--max-concurrency", str(opts.max_concurrency),
            "--break-every", str(opts.break_every)]
    if opts.queue:
        args.append("--queue")
    return args


@contextmanager
def spawn_fake_server(*, cpu: int | None = None, wait: bool = True, uvloop: bool = False,
                      **kwargs: Any) -> Iterator[SpawnedServer]:
    """Run a fake server as a subprocess (optionally pinned to CPU `cpu`); yields it once healthy."""
    opts = FakeOptions(**kwargs)
    port = free_port()
    cmd = [sys.executable, str(Path(__file__).resolve()), "--port", str(port), *cli_args(opts)]
    if cpu is not None:
        cmd += ["--cpu", str(cpu)]
    if uvloop:
        cmd.append("--uvloop")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    srv = SpawnedServer(proc=proc, host="127.0.0.1", port=port)
    try:
        if wait:
            wait_healthy(srv.url, timeout_s=15.0 + opts.ready_delay_s)
        yield srv
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if proc.stderr is not None:
            proc.stderr.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="fake OpenAI-compatible server with known latencies")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--model", default="fake")
    p.add_argument("--ttft-ms", type=float, default=20.0)
    p.add_argument("--itl-ms", type=float, default=5.0)
    p.add_argument("--error-status", type=int, default=0)
    p.add_argument("--error-every", type=int, default=0)
    p.add_argument("--ready-delay-s", type=float, default=0.0)
    p.add_argument("--max-concurrency", type=int, default=0,
                   help="503 beyond this many in flight (0: none)")
    p.add_argument("--queue", action="store_true", help="with --max-concurrency: queue instead of 503")
    p.add_argument("--break-every", type=int, default=0, help="cut every N-th stream halfway")
    p.add_argument("--cpu", type=int, default=None, help="pin this process to one CPU")
    p.add_argument("--uvloop", action="store_true", help="use uvloop when installed")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if a.cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {a.cpu})
    opts = FakeOptions(model=a.model, ttft_ms=a.ttft_ms, itl_ms=a.itl_ms, error_status=a.error_status,
                       error_every=a.error_every, ready_delay_s=a.ready_delay_s,
                       max_concurrency=a.max_concurrency, queue=a.queue, break_every=a.break_every)
    if a.uvloop:
        try:
            import uvloop  # type: ignore[import-not-found]

            uvloop.install()
        except ImportError:
            log.warning("uvloop not installed; using asyncio's loop")
    try:
        asyncio.run(_serve_forever(opts, a.host, a.port))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
