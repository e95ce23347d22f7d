"""Load generator: an asyncio (aiohttp) client for OpenAI-compatible /v1/completions and /v1/chat/completions.

One request yields one RequestRecord (scheduled, sent, first token, every streamed chunk's arrival, token
counts from `usage` when reported, HTTP status, error kind). Errors are counted, never dropped.

Arrivals: closed loop (`concurrency` requests in flight) or open loop (constant, Poisson, gamma, trace)
scheduled on the clock, so a slow server shows up as latency, not as a lower offered rate (an open loop with
`concurrency` set caps requests in flight, as `vllm bench serve --max-concurrency`; the wait shows in
`client_queue_ms`). Warm-up (plans marked warmup, requests scheduled before `warmup_s`) and cool-down
(requests sent after the measured ones, to keep the load steady until they finish, at most `cooldown_s`)
are marked `warmup` and left out of the summary.

Entry point for other code: `measure_endpoint(...)` (sync; runs its own event loop, safe from worker threads).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import aiohttp
import numpy as np

from tuner.base.redact import redact_text
from tuner.errors import ConfigError
from tuner.measure.early_stop import EarlyStop, EarlyStopRule
from tuner.measure.measurement import Measurement
from tuner.measure.metrics import offered_rate_per_s, prompt_length_check, summarise
from tuner.measure.promptfit import FittedPrompts, fitted_for_server, residual, tokenize_counter, usage_counter
from tuner.measure.records import RequestPlan, RequestRecord
from tuner.measure.stream import StreamReader, spread, token_times
from tuner.measure.tokenize import HFTokenizer, Tokenizer, load_tokenizer
from tuner.spec import WorkloadSpec

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]
_HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream, application/json"}


@dataclass(frozen=True)
class RunConfig:
    """How to drive one run against one endpoint."""

    base_url: str
    model: str
    endpoint: Literal["completions", "chat"] = "completions"
    stream: bool = True
    ignore_eos: bool | Literal["auto"] = "auto"  # auto: dropped once the server refuses the field
    timeout_s: float = 120.0
    closed_loop: bool = True
    concurrency: int | None = None  # closed loop: in flight; open loop: cap (None = no cap)
    num_requests: int | None = None  # measured requests (None: bounded by duration_s)
    duration_s: float | None = None  # measured window after warmup_s
    warmup_s: float = 0.0
    cooldown_s: float = 0.0
    max_in_flight: int | None = None  # open loop: stop dispatching (saturated) beyond this backlog
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    prompt_format: Literal["text", "token_ids"] = "text"
    keep_text: bool = False  # keep each request's generated text (bench --json's generated_texts)
    api_key: str | None = None
    seed: int = 0

    @property
    def url(self) -> str:
        path = "/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions"
        return self.base_url.rstrip("/") + path


@dataclass
class RunResult:
    records: list[RequestRecord]
    wall_s: float
    saturated: bool = False
    max_concurrent: int = 0
    notes: list[str] = field(default_factory=list)
    cooldown_sent: int = 0  # requests sent after the measured window (cancelled once the measured ones finished)
    interrupted: bool = False  # stop_event was set: the run ended early
    early_stop: EarlyStop | None = None  # the early-stop rule ended the run (its partial breaks an SLO by far)
    clock_origin_s: float = 0.0  # time.perf_counter() at the run's start: records' times are relative to it


# --------------------------------------------------------------------------------------------- requests
def _body(cfg: RunConfig, plan: RequestPlan, prompt: str | list[int], ignore_eos: bool | None = None) -> bytes:
    if cfg.endpoint == "chat":
        if not isinstance(prompt, str):
            raise ConfigError("the chat endpoint needs text prompts (got token ids)")
        body: dict[str, Any] = {"model": cfg.model, "messages": [{"role": "user", "content": prompt}],
                                "max_completion_tokens": plan.output_tokens}
    else:
        body = {"model": cfg.model, "prompt": prompt, "max_tokens": plan.output_tokens}
    body["stream"] = cfg.stream
    if cfg.stream:
        body["stream_options"] = {"include_usage": True}
    if (cfg.ignore_eos is not False) if ignore_eos is None else ignore_eos:
        body["ignore_eos"] = True
    for k, v in cfg.extra_body.items():  # a null value removes a field the client would send
        if v is None:
            body.pop(k, None)
        else:
            body[k] = v
    return json.dumps(body, separators=(",", ":")).encode()


def _error_kind(status: int) -> str:
    if status == 503:
        return "overload_503"
    return "http_4xx" if 400 <= status < 500 else "http_5xx"


class _Client:
    """Sends one planned request and turns what happened into a RequestRecord."""

    def __init__(self, cfg: RunConfig, session: aiohttp.ClientSession, tok: Tokenizer, t0: float) -> None:
        self.cfg = cfg
        self.session = session
        self.tok = tok
        self.t0 = t0
        self.url = cfg.url
        self.headers = dict(_HEADERS)
        if cfg.api_key:
            self.headers["Authorization"] = f"Bearer {cfg.api_key}"
        self.timeout = aiohttp.ClientTimeout(total=cfg.timeout_s)
        self.chat = cfg.endpoint == "chat"
        self.key_base = (cfg.seed % 1000) * 10_000_000
        # a streamed chunk's tokens are counted with the tokenizer when it is a real one (not the byte or
        # approximate ones: the engine streams one token per chunk and says so in usage)
        self.count_text = tok.count if isinstance(tok, HFTokenizer) else None
        self.send_ignore_eos = cfg.ignore_eos is not False
        self.ignore_eos_refused: str | None = None  # the server's message when it refused the field (auto)

    def prompt(self, plan: RequestPlan) -> tuple[str | list[int], bool]:
        """The prompt to send and whether plan.prompt_tokens is its exact token count."""
        if plan.prompt is not None:
            if isinstance(plan.prompt, list):
                return plan.prompt, True
            return plan.prompt, self.tok.exact and not self.chat
        key = self.key_base + plan.index
        if self.cfg.prompt_format == "token_ids" and not self.chat:
            return self.tok.synth_ids(plan.prompt_tokens, key), True
        # the chat template adds tokens: the exact count is the server's (usage)
        return self.tok.synth_text(plan.prompt_tokens, key), self.tok.exact and not self.chat

    async def send(self, plan: RequestPlan, scheduled_s: float, warmup: bool) -> RequestRecord:
        prompt, exact = self.prompt(plan)
        with_ignore_eos = self.send_ignore_eos
        data = _body(self.cfg, plan, prompt, with_ignore_eos)
        retry = False
        clock = time.perf_counter
        t0 = self.t0
        sent = clock() - t0
        usage: dict[str, Any] | None = None
        status: int | None = None
        error: str | None = None
        detail = ""
        stream_end = ""
        reader = StreamReader(chat=self.chat, count_text=self.count_text, keep_text=self.cfg.keep_text)
        text: str | None = None
        n_out: int | None = None
        try:
            async with self.session.post(self.url, data=data, headers=self.headers,
                                         timeout=self.timeout) as resp:
                status = resp.status
                if status != 200:
                    error = _error_kind(status)
                    detail = (await resp.text(errors="replace"))[:300]
                    if (self.cfg.ignore_eos == "auto" and with_ignore_eos and 400 <= status < 500
                            and "ignore_eos" in detail):
                        self.send_ignore_eos = False
                        self.ignore_eos_refused = detail
                        retry = True
                elif self.cfg.stream:
                    buf = b""
                    async for chunk in resp.content.iter_any():
                        now = clock() - t0
                        buf += chunk
                        if b"\r" in buf:  # SSE lines may end with CRLF (sse-starlette's default)
                            buf = buf.replace(b"\r\n", b"\n")
                        if b"\n\n" not in buf:
                            continue
                        events = buf.split(b"\n\n")
                        buf = events.pop()
                        for ev in events:
                            for line in ev.split(b"\n"):  # an event may hold several lines (id:, event:)
                                if line.startswith(b"data:"):
                                    reader.feed(line[5:].strip(), now)
                    if buf.strip().startswith(b"data:"):  # a last event without its blank line
                        reader.feed(buf.strip()[5:].strip(), clock() - t0)
                    stream_end = reader.end()
                    usage, error, detail = reader.usage, reader.error, reader.detail
                    n_out = reader.output_tokens()
                    text = reader.text() if self.cfg.keep_text else None
                else:
                    d = json.loads(await resp.read())
                    usage = d.get("usage")
                    c = (d.get("choices") or [{}])[0]
                    out_text = (c.get("message") or {}).get("content") if self.chat else c.get("text")
                    out_text = out_text or ""
                    if usage is not None and usage.get("completion_tokens") is not None:
                        n_out = int(usage["completion_tokens"])
                    elif self.count_text is not None:
                        n_out = self.count_text(out_text)
                    else:
                        n_out = plan.output_tokens
                    text = out_text if self.cfg.keep_text else None
        except TimeoutError:
            error, detail = "timeout", f"no complete answer within {self.cfg.timeout_s} s"
        except aiohttp.ClientConnectorError as exc:
            error, detail = "connect", str(exc)[:300]
        except (aiohttp.ClientError, OSError, ValueError, TypeError, AttributeError, KeyError, IndexError) as exc:
            # disconnects and payload errors (an event that is JSON but not the expected object: counted,
            # not a dead worker): before the status line it is a connection failure
            error = "stream_broken" if status is not None else "connect"
            detail = f"{type(exc).__name__}: {exc}"[:300]
        if retry:  # sent again at once without the refused field
            return await self.send(plan, scheduled_s, warmup)
        done_s = clock() - t0
        times: tuple[float, ...] = ()
        multi = 0
        if self.cfg.stream and reader.chunk_times:
            total = n_out if n_out is not None else reader.output_tokens()
            times, multi = token_times(reader.chunk_times, spread(reader.chunk_tokens, total))
        server_in: int | None = None
        if usage is not None and usage.get("prompt_tokens") is not None:
            n_in = server_in = int(usage["prompt_tokens"])
            exact = True
        else:
            n_in = plan.prompt_tokens
        if n_out is None:
            n_out = len(times) if self.cfg.stream else 0
        return RequestRecord(
            index=plan.index, scheduled_s=scheduled_s, sent_s=sent,
            first_token_s=times[0] if times else None, done_s=done_s,
            prompt_tokens=n_in, output_tokens=n_out, token_times_s=times, status=status,
            error=error, error_detail=redact_text(detail), warmup=warmup, prompt_tokens_exact=exact,
            streamed=self.cfg.stream, chunks=len(reader.chunk_times), multi_token_chunks=multi,
            stream_end=stream_end, requested_prompt_tokens=plan.prompt_tokens, server_prompt_tokens=server_in,
            generated_text=text,
        )


# --------------------------------------------------------------------------------------------- arrivals
def _cycle(plans: Sequence[RequestPlan], closed: bool) -> Iterator[RequestPlan]:
    """The plans, then (for warm-up/cool-down fill and duration-bound runs) the same plans again, forever,
    with fresh indices and arrival times continuing the pattern."""
    if not plans:
        return
    n = len(plans)
    span = plans[-1].arrival_s - plans[0].arrival_s
    gap = span / max(1, n - 1) if n > 1 else 1.0
    offset = 0.0
    rnd = 0
    while True:
        for p in plans:
            if rnd == 0:
                yield p
            else:
                yield replace(p, index=p.index + rnd * n, arrival_s=p.arrival_s + offset, warmup=False)
        rnd += 1
        offset += span + (gap if not closed else 0.0)


class _Run:
    def __init__(self, cfg: RunConfig, client: _Client, plans: Sequence[RequestPlan],
                 progress: Progress | None, early_stop: EarlyStopRule | None = None) -> None:
        self.cfg = cfg
        self.rule = early_stop
        self.stopped_early: EarlyStop | None = None
        self.main: asyncio.Task[None] | None = None  # the dispatching task, cancelled by an early stop
        self.client = client
        self.source = _cycle(plans, cfg.closed_loop)
        self.records: list[RequestRecord] = []
        self.progress = progress
        self.in_flight = 0
        self.max_concurrent = 0
        self.measured_sent = 0
        self.measured_done = 0
        self.measuring_over = False  # no more measured requests will be sent
        self.measure_end_s: float | None = None
        self.stop_s = math.inf  # no requests at all after this (cool-down limit)
        self.saturated = False
        self.interrupted = False
        self.tasks: set[asyncio.Task[None]] = set()
        self.cooldown_sent = 0
        self.all_measured_done = asyncio.Event()
        self._last_progress = 0.0
        self.sem = asyncio.Semaphore(cfg.concurrency) if (not cfg.closed_loop and cfg.concurrency) else None
        if cfg.num_requests is None and cfg.duration_s is None:
            raise ConfigError("a run needs num_requests or duration_s")

    def now(self) -> float:
        return time.perf_counter() - self.client.t0

    def _classify(self, plan: RequestPlan, sched: float) -> bool:
        """Decide (at dispatch) whether this request is measured; returns warmup flag. Ends the window."""
        cfg = self.cfg
        if self.measuring_over:
            self.cooldown_sent += 1
            return True
        if plan.warmup or sched < cfg.warmup_s:
            return True
        if cfg.duration_s is not None and sched >= cfg.warmup_s + cfg.duration_s:
            self._end_measuring(sched)
            self.cooldown_sent += 1
            return True
        self.measured_sent += 1
        if cfg.num_requests is not None and self.measured_sent >= cfg.num_requests:
            self._end_measuring(sched)
        return False

    def _end_measuring(self, t: float) -> None:
        if not self.measuring_over:
            self.measuring_over = True
            self.measure_end_s = t
            self.stop_s = t + self.cfg.cooldown_s
            if self.measured_done >= self.measured_sent:
                self.all_measured_done.set()

    def finished(self) -> bool:
        return self.measuring_over and (self.all_measured_done.is_set() or self.now() >= self.stop_s)

    def _report(self, force: bool = False) -> None:
        if self.progress is None:
            return
        now = time.perf_counter()
        if not force and now - self._last_progress < 0.1:
            return
        self._last_progress = now
        if self.cfg.num_requests is not None:
            self.progress(self.measured_done, self.cfg.num_requests)
        else:
            assert self.cfg.duration_s is not None
            total = int(self.cfg.warmup_s + self.cfg.duration_s)
            self.progress(min(total, int(self.now())), total)

    async def _one(self, plan: RequestPlan, sched: float, warmup: bool) -> None:
        if self.sem is not None:
            await self.sem.acquire()
        self.in_flight += 1
        if self.in_flight > self.max_concurrent:
            self.max_concurrent = self.in_flight
        try:
            rec = await self.client.send(plan, sched, warmup)
        finally:
            self.in_flight -= 1
            if self.sem is not None:
                self.sem.release()
        self.records.append(rec)
        if not warmup:
            self.measured_done += 1
            if self.measuring_over and self.measured_done >= self.measured_sent:
                self.all_measured_done.set()
            self._report()
            self._judge()

    def _judge(self) -> None:
        """Stop the run when the early-stop rule finds its partial measurement breaking an SLO by far."""
        rule = self.rule
        if rule is None or self.stopped_early is not None or self.interrupted or self.all_measured_done.is_set():
            return
        if not rule.due(self.measured_done):
            return
        stop = rule.judge(self.records, at_s=self.now())
        if stop is None:
            return
        self.stopped_early = stop
        log.info("stopping the run early: %s", stop.text())
        if self.main is not None:
            self.main.cancel()

    async def closed(self) -> None:
        conc = self.cfg.concurrency or 1

        async def worker() -> None:
            while not self.finished():
                if self.measuring_over and self.now() >= self.stop_s:
                    return
                plan = next(self.source)
                sched = self.now()
                warmup = self._classify(plan, sched)
                if warmup and self.measuring_over and sched >= self.stop_s:
                    self.cooldown_sent -= 1  # not sent after all
                    return
                await self._one(plan, sched, warmup)

        workers = [asyncio.create_task(worker()) for _ in range(conc)]
        self.tasks.update(workers)
        await self._drain(workers)

    async def _drain(self, tasks: Sequence[asyncio.Task[None]]) -> None:
        """Wait for `tasks`; once every measured request is done, cancel what is left (warm-up and
        cool-down requests only: their records are not needed)."""
        if not tasks:
            return
        everything: asyncio.Future[Any] = asyncio.gather(*tasks)
        # a run cancelled here (a stop request, an early stop) leaves the gather to end with its cancelled
        # requests: its outcome is read, not logged as "never retrieved"
        everything.add_done_callback(lambda f: f.cancelled() or f.exception())
        measured: asyncio.Future[Any] = asyncio.create_task(self.all_measured_done.wait())
        try:
            await asyncio.wait([everything, measured], return_when=asyncio.FIRST_COMPLETED)
            if not everything.done():
                for t in tasks:
                    t.cancel()
            await asyncio.gather(everything, return_exceptions=True)
        finally:
            measured.cancel()

    async def open(self) -> None:
        tasks: set[asyncio.Task[None]] = set()
        t0 = self.client.t0
        clock = time.perf_counter
        burst = 0
        for plan in self.source:
            target = plan.arrival_s
            delay = target - (clock() - t0)
            if delay > 0.0005:
                burst = 0
                if self.measuring_over:
                    # sleep until the arrival, but wake as soon as the measured requests are done
                    try:
                        await asyncio.wait_for(self.all_measured_done.wait(), timeout=delay)
                    except TimeoutError:
                        pass
                else:
                    await asyncio.sleep(delay)
            else:
                burst += 1
                if burst % 64 == 0:
                    await asyncio.sleep(0)  # let responses be read while catching up
            if self.finished() or (self.measuring_over and target >= self.stop_s):
                break
            if self.cfg.max_in_flight is not None and self.in_flight >= self.cfg.max_in_flight:
                self.saturated = True
                log.info("backlog of %d requests in flight: stopping the run (saturated)", self.in_flight)
                self._end_measuring(target)
                break
            warmup = self._classify(plan, target)
            if warmup and self.measuring_over and target >= self.stop_s:
                self.cooldown_sent -= 1  # not sent after all
                break
            task = asyncio.create_task(self._one(plan, target, warmup))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        await self._drain(list(tasks))


_gc_lock = threading.Lock()
_gc_users = 0
_gc_saved: tuple[int, ...] = ()


@contextmanager
def _quiet_gc() -> Iterator[None]:
    """Fewer, cheaper collector pauses while runs are timed (not none: long runs must not pile up cycles).

    Process-wide and reference-counted, so concurrent runs in worker threads restore the settings once."""
    global _gc_users, _gc_saved
    with _gc_lock:
        if _gc_users == 0:
            _gc_saved = gc.get_threshold()
            gc.freeze()
            gc.set_threshold(50_000, 50, 100)
        _gc_users += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_users -= 1
            if _gc_users == 0:
                gc.set_threshold(*_gc_saved)
                gc.unfreeze()


def _pool_size(cfg: RunConfig) -> int:
    if cfg.closed_loop:
        return max(1, cfg.concurrency or 1)
    return cfg.concurrency or 0  # 0: no limit (the open loop must not queue inside the pool)


async def run_async(cfg: RunConfig, plans: Sequence[RequestPlan], *, tok: Tokenizer | None = None,
                    progress: Progress | None = None, stop_event: threading.Event | None = None,
                    early_stop: EarlyStopRule | None = None) -> RunResult:
    """Drive `plans` against cfg.base_url and return every request's record.

    Setting `stop_event` (from any thread) ends the run within ~50 ms: requests in flight are abandoned
    (no records) and the result says `interrupted`. `early_stop` judges the completed requests as they come
    and ends the run the same way once its partial measurement breaks an SLO by far (the result's
    `early_stop` says why)."""
    tok = tok or load_tokenizer(None)
    conn = aiohttp.TCPConnector(limit=_pool_size(cfg), limit_per_host=0, keepalive_timeout=60,
                                enable_cleanup_closed=False, ttl_dns_cache=300)
    async with aiohttp.ClientSession(connector=conn, auto_decompress=False,
                                     timeout=aiohttp.ClientTimeout(total=None),
                                     skip_auto_headers=("User-Agent",)) as session:
        t0 = time.perf_counter()
        run = _Run(cfg, _Client(cfg, session, tok, t0), plans, progress, early_stop)
        with _quiet_gc():
            main = run.main = asyncio.create_task(run.closed() if cfg.closed_loop else run.open())
            watcher = asyncio.create_task(_watch(stop_event, main, run)) if stop_event is not None else None
            try:
                await main
            except asyncio.CancelledError:
                if not run.interrupted and run.stopped_early is None:
                    raise
                for t in list(run.tasks):
                    t.cancel()
                await asyncio.gather(*run.tasks, return_exceptions=True)
            finally:
                if watcher is not None:
                    watcher.cancel()
        wall = time.perf_counter() - t0
        run._report(force=True)
    notes = []
    if run.saturated:
        notes.append(f"stopped early: more than {cfg.max_in_flight} requests in flight (saturated)")
    if run.interrupted:
        notes.append("interrupted: stop requested mid-run; requests in flight were abandoned")
    elif run.stopped_early is not None:
        notes.append(f"stopped early: {run.stopped_early.text()}; requests in flight were abandoned")
    if run.client.ignore_eos_refused is not None:
        notes.append(f"the server refused ignore_eos ({run.client.ignore_eos_refused[:160]}): requests were sent "
                     "without it, so answers may end before the asked output length (ignore_eos: false to "
                     "say so up front)")
    return RunResult(records=sorted(run.records, key=lambda r: r.index), wall_s=wall,
                     saturated=run.saturated, max_concurrent=run.max_concurrent, notes=notes,
                     cooldown_sent=run.cooldown_sent, interrupted=run.interrupted, clock_origin_s=t0,
                     early_stop=None if run.interrupted else run.stopped_early)


async def _watch(stop: threading.Event, main: asyncio.Task[None], run: _Run) -> None:
    while not stop.is_set():
        await asyncio.sleep(0.05)
    run.interrupted = True
    main.cancel()


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when installed (~15 % less client CPU per request), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run_fresh(coro: Any) -> Any:
    """Run `coro` to completion on a new event loop of its own, then close it."""
    loop = new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()


def run_sync(cfg: RunConfig, plans: Sequence[RequestPlan], *, tok: Tokenizer | None = None,
             progress: Progress | None = None, stop_event: threading.Event | None = None,
             early_stop: EarlyStopRule | None = None) -> RunResult:
    """run_async on a fresh event loop (in a helper thread when this thread already runs a loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run_fresh(  # type: ignore[no-any-return]
            run_async(cfg, plans, tok=tok, progress=progress, stop_event=stop_event, early_stop=early_stop))
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["r"] = run_fresh(run_async(cfg, plans, tok=tok, progress=progress, stop_event=stop_event,
                                           early_stop=early_stop))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            box["e"] = exc

    t = threading.Thread(target=target, name="loadgen")
    t.start()
    t.join()
    if "e" in box:
        raise box["e"]
    return box["r"]  # type: ignore[no-any-return]


# --------------------------------------------------------------------------------------------- summary
def client_summary(records: Sequence[RequestRecord], result: RunResult) -> dict[str, float]:
    """Extra summary keys about the client side: max concurrency, scheduling lag, offered rate."""
    meas = [r for r in records if not r.warmup]
    out: dict[str, float] = {"max_concurrent_requests": float(result.max_concurrent),
                             "saturated": float(result.saturated), "cooldown_requests": float(result.cooldown_sent),
                             "interrupted": float(result.interrupted)}
    if meas:
        lag = np.array([(r.sent_s - r.scheduled_s) * 1000.0 for r in meas])
        out["client_queue_ms_mean"] = float(lag.mean())
        out["client_queue_ms_p99"] = float(np.percentile(lag, 99))
        offered = offered_rate_per_s(meas)
        if offered is not None:
            out["offered_rate_per_s"] = offered
        multi = [r for r in meas if r.ok and r.streamed and len(r.token_times_s) > 1]
        if multi:
            burst = sum(1 for r in multi if r.token_times_s[-1] - r.token_times_s[0] <= ONE_BURST_S)
            out["one_burst_streams"] = float(burst)
            out["one_burst_frac"] = burst / len(multi)
    return out


ONE_BURST_S = 0.001  # a stream whose tokens all arrived within this of each other came in one burst


def one_burst_note(summary: Mapping[str, float]) -> str | None:
    """A warning when many streams came in one burst: their TTFT is late and their TPOT/ITL near 0."""
    frac = summary.get("one_burst_frac", 0.0)
    if frac < 0.1:
        return None
    return (f"{summary['one_burst_streams']:.0f} streamed requests ({frac:.0%}) got every token in one burst: the "
            "server sent nothing until the answer was done (its front end fell behind, e.g. a CPU server "
            "starved on a busy host; see docs/metrics.md), so their TTFT is late and TPOT/ITL read near 0")


def energy_per_output_token(energy_j: float, records: Sequence[RequestRecord]) -> float | None:
    """Joules per generated token. The GPU sampler covers the whole run, warm-up and cool-down included,
    so the tokens of every request of the run count (not only the measured ones)."""
    tokens = sum(r.output_tokens for r in records)
    return energy_j / tokens if tokens > 0 else None


def fit_prompts(cfg: RunConfig, lengths: Sequence[int], *, seed: int) -> tuple[FittedPrompts | None, list[str]]:
    """Prompts fitted to `lengths` as the server at cfg.base_url counts them: with its /tokenize endpoint,
    else with the usage of one-token probe requests (see tuner.measure.promptfit); (None, why) when it
    cannot count."""
    headers = dict(_HEADERS)
    if cfg.api_key:
        headers["Authorization"] = f"Bearer {cfg.api_key}"
    chat = cfg.endpoint == "chat"
    probe_cfg = replace(cfg, stream=False)
    probe = RequestPlan(index=-1, arrival_s=0.0, prompt_tokens=0, output_tokens=1)
    timeout_s = min(cfg.timeout_s, 60.0)

    def body_for(text: str) -> bytes:
        return _body(probe_cfg, probe, text, ignore_eos=False)

    counters = [
        ("server_tokenize", lambda: tokenize_counter(cfg.base_url, cfg.model, chat=chat, headers=headers,
                                                     timeout_s=timeout_s), 256),
        ("usage_calibration", lambda: usage_counter(cfg.url, body_for, headers=headers, timeout_s=timeout_s),
         16),
    ]
    return fitted_for_server(lengths, counters, seed=seed)


def config_for(spec: WorkloadSpec, base_url: str, model: str) -> RunConfig:
    a = spec.arrival
    closed = a.kind == "closed"
    return RunConfig(
        base_url=base_url, model=model, endpoint=spec.endpoint, stream=spec.stream, ignore_eos=spec.ignore_eos,
        timeout_s=spec.timeout_s, closed_loop=closed, concurrency=a.concurrency,
        num_requests=spec.num_requests, duration_s=spec.duration_s, warmup_s=spec.warmup_s,
        cooldown_s=spec.cooldown_s, seed=spec.seed, extra_body=dict(spec.extra_body),
        prompt_format=spec.prompt_format,
    )


def measure_endpoint(base_url: str, *, model: str, workload: WorkloadSpec, goodput_ms: Mapping[str, float],
                     seed: int, base_dir: Path | None = None, tokenizer: str | None = None,
                     metrics_url: str | None = None, gpu_indices: Sequence[int] = (),
                     progress: Callable[[int, int], None] | None = None,
                     max_in_flight: int | None = None,
                     stop_event: threading.Event | None = None, keep_text: bool = False,
                     fit_prompt_lengths: bool = False, early_stop: EarlyStopRule | None = None) -> Measurement:
    """Run `workload` against an OpenAI-compatible server at `base_url` and summarise it.

    Sync (own event loop; safe from worker threads). `base_dir` resolves relative dataset/trace paths;
    `tokenizer` is "byte", a local Hugging Face tokenizer dir, or None (approximate prompt lengths);
    `metrics_url` is scraped before/during/after (server_* telemetry); `gpu_indices` are sampled with NVML
    (gpu_* telemetry). `progress(done, total)` gets measured requests done (or seconds elapsed for
    duration-bound runs). cold_start_s is left 0 for the caller to fill in. `max_in_flight` stops an open
    loop that builds a larger backlog (summary `saturated` = 1); setting `stop_event` ends the run early
    (summary `interrupted` = 1, with a note). `keep_text` keeps each request's generated text.
    `fit_prompt_lengths` (without a tokenizer) makes synthesised prompts the asked length as the server counts
    them, before the run (tuner.measure.promptfit); the Measurement's `prompt_lengths` says how and how well.
    `early_stop` (tuner.measure.early_stop) ends the run once its partial measurement breaks an SLO by far:
    the Measurement holds the requests completed by then and its `early_stop` says why.
    """
    from tuner.measure.datasets import plans_for
    from tuner.measure.gpu import GpuSampler
    from tuner.measure.scrape import scrape, telemetry

    tok = load_tokenizer(tokenizer, base_dir=base_dir, seed=seed)
    plans, notes = plans_for(workload, seed=seed, tok=tok, base_dir=base_dir)
    if workload.endpoint == "chat" and any(isinstance(p.prompt, list) for p in plans):
        raise ConfigError("the chat endpoint needs text prompts; the dataset or trace gives token ids "
                          "(use endpoint: completions)")
    cfg = replace(config_for(workload, base_url, model), seed=seed, max_in_flight=max_in_flight,
                  keep_text=keep_text)
    if workload.arrival.kind == "trace":
        # a trace is replayed once: its own length bounds the run
        n_meas = sum(1 for p in plans if not p.warmup)
        cfg = replace(cfg, num_requests=n_meas, duration_s=None)
    synthesised = [p.prompt_tokens for p in plans if p.prompt is None]
    lengths: dict[str, Any] = {"method": "tokenizer", "tokenizer": tok.name}
    if not synthesised:
        lengths = {"method": "dataset"}
    elif tokenizer in (None, "approx"):
        lengths = {"method": "approximate"}
        if fit_prompt_lengths and tokenizer is None and workload.prompt_format == "text":
            fitted, why = fit_prompts(cfg, synthesised, seed=seed)
            if fitted is not None:
                tok = fitted
                lengths = fitted.report()
            else:
                notes.append("the server counts no prompt tokens (" + "; ".join(why)[:300] + "): prompt lengths "
                             "are approximate (give --tokenizer DIR for exact ones)")
    before = scrape(metrics_url) if metrics_url else None
    during: list[Any] = []
    stop_poll = threading.Event()
    poller: threading.Thread | None = None
    if metrics_url:
        def poll() -> None:
            while not stop_poll.wait(1.0):
                s = scrape(metrics_url, timeout_s=2.0)
                if s is not None:
                    during.append(s)

        poller = threading.Thread(target=poll, name="metrics-poll", daemon=True)
        poller.start()
    sampler = GpuSampler(gpu_indices).start() if gpu_indices else None
    try:
        result = run_sync(cfg, plans, tok=tok, progress=progress, stop_event=stop_event, early_stop=early_stop)
    finally:
        if sampler is not None:
            sampler.stop()
        stop_poll.set()
        if poller is not None:
            poller.join(5.0)
    after = scrape(metrics_url) if metrics_url else None
    summary = summarise(result.records, goodput_ms=goodput_ms or None)
    summary.update(client_summary(result.records, result))
    tel: dict[str, float] = {}
    if sampler is not None:
        tel.update(sampler.result())
        if "gpu_energy_j" in tel:
            per_token = energy_per_output_token(tel["gpu_energy_j"], result.records)
            if per_token is not None:
                tel["gpu_energy_j_per_output_token"] = per_token
    if metrics_url:
        tel.update(telemetry(before, after, during))
    notes = list(notes) + result.notes
    if summary.get("prompt_tokens_exact", 1.0) < 1.0:
        notes.append(f"prompt token counts are approximate (tokenizer {tok.name}; the server reported no usage)")
    if not tok.exact or workload.endpoint == "completions":  # a chat template adds tokens of its own
        mismatch = prompt_length_check(result.records)
        if mismatch:
            log.warning("%s", mismatch)
            notes.append(mismatch)
    if not workload.stream:
        notes.append("stream off: TTFT, TPOT and ITL are not measured (only end-to-end latency)")
    burst_note = one_burst_note(summary)
    if burst_note:
        notes.append(burst_note)
    if summary.get("multi_token_chunks", 0) > 0:
        notes.append(f"{summary['multi_token_chunks']:.0f} streamed chunks carried several tokens: ITL splits "
                     "each such chunk's gap evenly over its tokens (TPOT is per request and unaffected)")
    lengths.update(residual(result.records))
    return Measurement(summary=summary, records=tuple(result.records), telemetry=tel, notes=tuple(notes),
                       prompt_lengths=lengths, clock_origin_s=result.clock_origin_s,
                       early_stop=result.early_stop.to_attr() if result.early_stop is not None else None)
