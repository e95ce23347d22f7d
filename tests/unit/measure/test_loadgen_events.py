"""Review: the load generator parses SSE streams whose events end with CRLF (the SSE spec allows it)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator

import pytest
from aiohttp import web

from tuner.measure.loadgen import RunConfig, run_sync
from tuner.measure.records import RequestPlan
from tuner.measure.tokenize import ByteTokenizer


async def _crlf_completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    malformed = body["model"] == "malformed"  # an event that is JSON but not an object
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for _ in range(body["max_tokens"]):
        await resp.write(b"data: " + json.dumps({"choices": [{"index": 0, "text": "a"}]}).encode() + b"\r\n\r\n")
    usage = {"prompt_tokens": 3, "completion_tokens": body["max_tokens"]}
    await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\r\n\r\n")
    if malformed:
        await resp.write(b"data: []\r\n\r\n")
    await resp.write(b"data: [DONE]\r\n\r\n")
    await resp.write_eof()
    return resp


@pytest.fixture()
def crlf_server() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/v1/completions", _crlf_completions)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        t.join(5)
        loop.run_until_complete(runner.cleanup())
        loop.close()


def test_crlf_separated_events_are_parsed(crlf_server: str) -> None:
    cfg = RunConfig(base_url=crlf_server, model="m", num_requests=3, concurrency=1)
    plans = [RequestPlan(index=i, arrival_s=0.0, prompt_tokens=3, output_tokens=4) for i in range(3)]
    result = run_sync(cfg, plans, tok=ByteTokenizer())
    assert [r.error for r in result.records] == [None, None, None], result.records[0].error_detail
    assert all(r.output_tokens == 4 and len(r.token_times_s) == 4 for r in result.records)


def test_energy_per_token_counts_the_tokens_of_the_whole_sampled_run() -> None:
    from tuner.measure.loadgen import energy_per_output_token
    from tuner.measure.metrics import summarise
    from tuner.measure.records import RequestRecord

    def rec(i: int, warmup: bool) -> RequestRecord:
        return RequestRecord(index=i, scheduled_s=i, sent_s=i, first_token_s=i + 0.1, done_s=i + 1.0,
                             prompt_tokens=10, output_tokens=100, warmup=warmup)

    records = [rec(i, warmup=i < 5) for i in range(10)]  # half of the sampled run is warm-up
    assert summarise(records)["total_output_tokens"] == 500
    # 1000 J over the run that generated 1000 tokens: 1 J per token (not 2)
    assert energy_per_output_token(1000.0, records) == 1.0
    assert energy_per_output_token(1000.0, []) is None


def test_a_malformed_event_is_a_counted_error_not_a_lost_run(crlf_server: str) -> None:
    cfg = RunConfig(base_url=crlf_server, model="malformed", num_requests=4, concurrency=2)
    plans = [RequestPlan(index=i, arrival_s=0.0, prompt_tokens=3, output_tokens=4) for i in range(4)]
    result = run_sync(cfg, plans, tok=ByteTokenizer())
    assert [r.index for r in result.records] == [0, 1, 2, 3]
    assert all(r.error == "stream_broken" and r.status == 200 for r in result.records), result.records[0]
