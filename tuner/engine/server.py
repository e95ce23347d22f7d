"""OpenAI-compatible HTTP server for the reference engine (aiohttp).

    python -m tuner.engine.server --port 8000 [--preset tiny] [--device auto|cpu|cuda] [--batching continuous] ...

Endpoints: POST /v1/completions and /v1/chat/completions (streaming SSE or not; chat messages go through
the checkpoint's chat template or the preset's, tuner/engine/chat.py), GET /v1/models, GET /health (200 when ready,
503 while starting or after a fatal error), GET /metrics (Prometheus, vLLM's names where they mean the
same thing, plus `tuner_engine_startup_phase_seconds{phase}`). The server binds 127.0.0.1 unless told
otherwise and listens while the engine starts, so /health answers 503 until the engine is ready. A client that
goes away aborts its request's sequences, whatever the kind (`tuner_engine_aborted_requests_total` counts them);
a string that is not valid Unicode anywhere in a body (a lone surrogate) is a 400 (tuner/engine/schema.py).

Exit codes: 0 after SIGINT/SIGTERM, 2 for a knob that is invalid or cannot apply on the device (the
message is logged), 1 when the engine fails while starting.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import signal
import sys
import time
import uuid
from typing import Any

from aiohttp import web

from tuner.engine import chat
from tuner.engine.config import (
    PRESETS,
    EngineConfig,
    EngineConfigError,
    add_engine_arguments,
    config_from_namespace,
)
from tuner.engine.metrics import PromStats
from tuner.engine.schema import MAX_BODY_BYTES, ApiError, CompletionRequest, error_type, parse_body, parse_completion

log = logging.getLogger(__name__)


def error_response(err: ApiError) -> web.Response:
    return web.json_response(err.body(), status=err.status)


@web.middleware
async def json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every error leaves as a JSON body, whatever raised it: a route that does not exist (404), a method
    it does not take (405), a body over the size limit (413), or a failure inside a handler (500, logged;
    the failure ends that request alone)."""
    try:
        return await handler(request)
    except ApiError as err:
        return error_response(err)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after")}
        body = ApiError(exc.status, exc.reason if exc.text is None else exc.text.strip() or exc.reason,
                        type=error_type(exc.status)).body()
        return web.json_response(body, status=exc.status, headers=headers)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as exc:  # noqa: BLE001 - one request fails, never the server
        log.exception("request %s %s failed", request.method, request.path)
        return error_response(ApiError(500, f"internal error: {type(exc).__name__}", type="InternalServerError"))


class EngineServer:
    def __init__(self, cfg: EngineConfig, *, model_name: str | None = None) -> None:
        from tuner.engine.engine import Engine
        from tuner.engine.tokenizer import ByteTokenizer

        self.cfg = cfg
        self.model_name = model_name or f"torch-engine-{cfg.preset}"
        preset = PRESETS.get(cfg.preset)  # an unknown preset is the Engine's error to report, below
        self.stats = PromStats(self.model_name, cfg.max_model_len or (preset.max_model_len if preset else None))
        self.engine = Engine(cfg, emit=self._emit, stats=self.stats)  # validates the knobs
        mc = self.engine.mc
        self.tokenizer = ByteTokenizer(mc.vocab_size, mc.eos_token_id)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.created = int(time.time())
        self.chat_template = chat.ChatTemplate.for_weights(cfg.weights)

    # ------------------------------------------------------------------ app
    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[json_errors])
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/metrics", self.metrics)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        self.loop = asyncio.get_running_loop()
        self.engine.start()
        asyncio.ensure_future(self._watch_ready())

    async def _watch_ready(self) -> None:
        while not self.engine.ready.is_set() and self.engine.fatal is None:
            await asyncio.sleep(0.02)
        if self.engine.ready.is_set():
            for phase, secs in self.engine.phase_s.items():
                self.stats.phase.labels(self.model_name, phase).set(secs)
            self.stats.ready.labels(self.model_name).set(1)
            self.stats.queue(0, 0, 0.0)

    async def _on_cleanup(self, app: web.Application) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.engine.stop)

    def _emit(self, items: list[Any]) -> None:
        """Called from the engine thread: hand the outputs to the event loop."""
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self._dispatch, items)

    @staticmethod
    def _dispatch(items: list[Any]) -> None:
        for req, tokens, reason in items:
            q, index = req.context
            q.put_nowait((index, tokens, reason))

    # ------------------------------------------------------------------ handlers
    def _healthy(self) -> bool:
        return self.engine.ready.is_set() and self.engine.fatal is None

    async def health(self, request: web.Request) -> web.Response:
        if self._healthy():
            return web.Response(status=200)
        status = "failed" if self.engine.fatal is not None else "starting"
        return web.json_response({"status": status}, status=503)

    async def models(self, request: web.Request) -> web.Response:
        mc = self.engine.mc
        return web.json_response({"object": "list", "data": [{
            "id": self.model_name, "object": "model", "created": self.created, "owned_by": "tuner",
            "root": self.model_name, "max_model_len": mc.max_model_len}]})

    async def metrics(self, request: web.Request) -> web.Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        body = generate_latest(self.stats.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    def _parse(self, body: Any) -> CompletionRequest:
        mc = self.engine.mc
        return parse_completion(body, model_name=self.model_name, vocab_size=mc.vocab_size,
                                max_model_len=mc.max_model_len, encode=self.tokenizer.encode)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self.completions(request, is_chat=True)

    async def completions(self, request: web.Request, is_chat: bool = False) -> web.StreamResponse:
        from tuner.engine.engine import Request

        if not self._healthy():
            return error_response(ApiError(503, "the engine is not ready", type="ServiceUnavailableError"))
        body = parse_body(await request.read())
        if is_chat:
            try:
                body = chat.completion_body(body, self.chat_template)
            except chat.ChatError as exc:
                return error_response(ApiError(400, str(exc), param=exc.param))
        req_ = dataclasses.replace(self._parse(body), chat=is_chat)
        sp = req_.sampling
        q: asyncio.Queue[tuple[int, list[int], str | None]] = asyncio.Queue()
        reqs = [Request(prompt=p, max_tokens=sp.max_tokens, temperature=sp.temperature, seed=sp.seed,
                        ignore_eos=sp.ignore_eos, priority=sp.priority, context=(q, i))
                for i, p in enumerate(req_.prompts)]
        try:
            for r in reqs:
                self.engine.submit(r)
        except RuntimeError as exc:
            return error_response(ApiError(503, str(exc), type="ServiceUnavailableError"))
        cid = f"{'chatcmpl' if is_chat else 'cmpl'}-{uuid.uuid4().hex}"
        try:
            if req_.stream:
                return await self._stream(request, cid, reqs, q, req_)
            return await self._whole(cid, reqs, q, req_)
        finally:
            for r in reqs:
                if not r.finished:
                    self.engine.abort(r)

    async def _next(self, q: asyncio.Queue[Any]) -> tuple[int, list[int], str | None]:
        """The next output of a request; an error output if the engine fails meanwhile (a request never
        waits on a dead engine)."""
        while True:
            try:  # asyncio.timeout, not wait_for: Python 3.11's wait_for drops a cancellation (a client that went
                # away) that arrives while the queue's item is ready, and the request would generate on for nobody
                async with asyncio.timeout(1.0):
                    return await q.get()
            except TimeoutError:
                if self.engine.fatal is not None and q.empty():
                    return 0, [], f"error:engine failed: {self.engine.fatal}"

    def _usage(self, reqs: list[Any], completion: int) -> dict[str, int]:
        prompt = sum(len(r.prompt) for r in reqs)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    async def _whole(self, cid: str, reqs: list[Any], q: asyncio.Queue[Any], opts: CompletionRequest) -> web.Response:
        tokens: list[list[int]] = [[] for _ in reqs]
        reasons: list[str | None] = [None] * len(reqs)
        left = len(reqs)
        while left:
            index, new, reason = await self._next(q)
            tokens[index] += new
            if reason is not None:
                if reason.startswith("error:"):
                    return error_response(ApiError(500, reason[6:], type="InternalServerError"))
                reasons[index] = reason
                left -= 1
        usage = self._usage(reqs, sum(len(t) for t in tokens))
        if opts.chat:
            return web.json_response(chat.whole(cid, self.model_name, [self.tokenizer.decode(t) for t in tokens],
                                                reasons, usage))
        choices = []
        for i, toks in enumerate(tokens):
            c: dict[str, Any] = {"index": i, "text": self.tokenizer.decode(toks), "logprobs": None,
                                 "finish_reason": reasons[i], "stop_reason": None}
            if opts.return_token_ids:
                c["token_ids"] = toks
                c["prompt_token_ids"] = reqs[i].prompt
            choices.append(c)
        return web.json_response({"id": cid, "object": "text_completion", "created": int(time.time()),
                                  "model": self.model_name, "choices": choices, "usage": usage})

    async def _stream(self, request: web.Request, cid: str, reqs: list[Any], q: asyncio.Queue[Any],
                      opts: CompletionRequest) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        created = int(time.time())
        completion = 0
        left = len(reqs)

        async def send(obj: Any) -> None:
            data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
            await resp.write(f"data: {data}\n\n".encode())

        is_chat = opts.chat
        obj = "chat.completion.chunk" if is_chat else "text_completion"
        try:
            if is_chat:  # the assistant's role first, as OpenAI's and vLLM's chat streams do
                for i in range(len(reqs)):
                    await send(chat.chunk(cid, created, self.model_name, i, text="", role=True))
            while left:
                index, new, reason = await self._next(q)
                if reason is not None and reason.startswith("error:"):
                    await send(ApiError(500, reason[6:], type="InternalServerError").body())
                    break
                completion += len(new)
                if reason is not None:
                    left -= 1
                if is_chat:
                    await send(chat.chunk(cid, created, self.model_name, index, text=self.tokenizer.decode(new),
                                          finish_reason=reason))
                    continue
                choice: dict[str, Any] = {"index": index, "text": self.tokenizer.decode(new), "logprobs": None,
                                          "finish_reason": reason, "stop_reason": None}
                if opts.return_token_ids:
                    choice["token_ids"] = new
                await send({"id": cid, "object": "text_completion", "created": created,
                            "model": self.model_name, "choices": [choice]})
            if opts.include_usage:
                await send({"id": cid, "object": obj, "created": created, "model": self.model_name,
                            "choices": [], "usage": self._usage(reqs, completion)})
            await send("[DONE]")
            await resp.write_eof()
        except ConnectionResetError:  # the client went away while we wrote: the caller's `finally` aborts the rest
            log.debug("client went away during %s", cid)
        except asyncio.CancelledError:
            log.debug("client went away during %s", cid)
            raise
        return resp


# ---------------------------------------------------------------------------- entry point
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tuner.engine.server",
                                description="Reference PyTorch serving engine with an OpenAI-compatible API.")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None, help="model id in the API (torch-engine-<preset>)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    add_engine_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    try:
        cfg = config_from_namespace(args)
        server = EngineServer(cfg, model_name=args.served_model_name)
    except EngineConfigError as exc:
        # argparse's wording, so that a launcher can tell a rejected configuration from a crash
        flag = f"argument --{exc.field.replace('_', '-')}: " if exc.field else ""
        log.error("error: %sinvalid engine configuration: %s", flag, exc)
        return 2
    except (ValueError, OSError, KeyError) as exc:
        log.error("error: cannot start the engine: %s: %s", type(exc).__name__, exc)
        return 2
    log.info("serving %s on http://%s:%d (device %s)", server.model_name, args.host, args.port,
             server.engine.device)
    return asyncio.run(_serve(server, args.host, args.port))


async def _serve(server: EngineServer, host: str, port: int) -> int:
    # a client that goes away cancels its handler, whose `finally` aborts the request's sequences: without it a
    # non-streamed request would generate to the end for nobody (aiohttp leaves handlers running by default)
    runner = web.AppRunner(server.app(), access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    code = 0
    while not stop.is_set():
        if server.engine.fatal is not None and not server.engine.ready.is_set():
            log.error("engine failed while starting: %s", server.engine.fatal)
            code = 1
            break
        try:
            await asyncio.wait_for(stop.wait(), timeout=0.2)
        except asyncio.TimeoutError:
            pass
    await runner.cleanup()
    return code


if __name__ == "__main__":
    sys.exit(main())
