"""Reading SSE streams as real servers send them: no [DONE], several tokens a chunk, usage on every chunk."""

from __future__ import annotations

import json

import pytest

from tuner.measure.stream import STREAM_END_DONE, STREAM_END_EOF, StreamReader, spread, token_times


def chunk(text: str | None, *, finish: str | None = None, usage: dict[str, int] | None = None,
          chat: bool = False, spaced: bool = False) -> bytes:
    if chat:
        choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish}
    d: dict[str, object] = {"id": "x", "choices": [choice] if text is not None or finish else []}
    if usage is not None:
        d["usage"] = usage
    return json.dumps(d, separators=None if spaced else (",", ":")).encode()


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("spaced", [False, True])
def test_a_stream_that_ends_after_finish_reason_without_done_is_complete(chat: bool, spaced: bool) -> None:
    r = StreamReader(chat=chat)
    for i, t in enumerate(["a", "b", "c"]):
        r.feed(chunk(t, chat=chat, spaced=spaced), float(i))
    r.feed(chunk("", finish="length", chat=chat, spaced=spaced), 3.0)
    assert r.end() == STREAM_END_EOF and r.error is None
    assert r.chunk_times == [0.0, 1.0, 2.0] and r.output_tokens() == 3


def test_usage_chunk_alone_also_ends_a_stream_and_a_bare_end_is_broken() -> None:
    r = StreamReader(chat=False)
    r.feed(chunk("a"), 0.0)
    r.feed(chunk(None, usage={"prompt_tokens": 5, "completion_tokens": 1}), 0.1)
    assert r.end() == STREAM_END_EOF and r.error is None and r.usage == {"prompt_tokens": 5, "completion_tokens": 1}
    r = StreamReader(chat=False)
    r.feed(chunk("a"), 0.0)
    assert r.end() == "" and r.error == "stream_broken" and "finish_reason" in r.detail
    r = StreamReader(chat=False)
    r.feed(chunk("a"), 0.0)
    r.feed(b"[DONE]", 0.1)
    assert r.end() == STREAM_END_DONE and r.error is None


def test_token_counts_come_from_usage_deltas_or_the_tokenizer_not_the_chunk_count() -> None:
    r = StreamReader(chat=False)  # usage on every chunk (vLLM's continuous_usage_stats)
    r.feed(chunk("ab", usage={"prompt_tokens": 4, "completion_tokens": 2}), 1.0)
    r.feed(chunk("cde", usage={"prompt_tokens": 4, "completion_tokens": 5}), 2.0)
    r.feed(b"[DONE]", 2.0)
    assert r.chunk_tokens == [2, 3] and r.output_tokens() == 5
    r = StreamReader(chat=True, count_text=lambda s: len(s.split()), keep_text=True)
    r.feed(chunk("one two", chat=True), 1.0)
    r.feed(chunk(" three", chat=True, finish="stop"), 2.0)
    assert r.end() == STREAM_END_EOF and r.chunk_tokens == [2, 1] and r.text() == "one two three"
    # a final usage that says more tokens than the chunks: the unknown chunks share them
    r = StreamReader(chat=False)
    for i in range(4):
        r.feed(chunk("xx"), float(i))
    r.feed(chunk(None, usage={"prompt_tokens": 1, "completion_tokens": 8}), 4.0)
    assert spread(r.chunk_tokens, r.output_tokens()) == [2, 2, 2, 2]


def test_multi_token_chunks_split_their_gap_and_are_counted() -> None:
    times, multi = token_times([1.0, 2.0, 5.0], [1, 2, 3])
    assert times == pytest.approx((1.0, 1.5, 2.0, 3.0, 4.0, 5.0)) and multi == 2
    times, multi = token_times([1.0, 2.0], [2, 1])  # the first chunk's tokens arrive together
    assert times == (1.0, 1.0, 2.0) and multi == 1
    assert spread([None, None, None], 7) == [3, 2, 2]
    assert spread([2, None], 2) == [1, 1]  # known counts that overshoot the total are rescaled
    assert sum(spread([5, 5, 1], 6)) == 6
    for counts, total in (([1, 1, 1, 4], 5), ([3, 1, 1, 1, 1], 6), ([2, 2, 2, 1, 1], 6), ([9, 1, 1], 3)):
        got = spread(list(counts), total)  # type: ignore[arg-type]
        assert sum(got) == total and min(got) >= 1, (counts, total, got)


def test_an_error_event_is_a_broken_stream() -> None:
    r = StreamReader(chat=False)
    r.feed(json.dumps({"error": {"message": "boom"}}).encode(), 0.0)
    r.feed(b"[DONE]", 0.0)
    assert r.error == "stream_broken" and "boom" in r.detail


def test_empty_text_chunks_are_tokens_as_vllm_bench_counts_them() -> None:
    # vLLM streams one chunk per token; a token whose bytes do not decode yet comes with empty text, first
    # chunk included: the TTFT stops there, and the empty last chunk counts when usage says it held a token
    r = StreamReader(chat=False)
    for i, t in enumerate(["", "a", "", "b"]):
        r.feed(chunk(t), float(i))
    r.feed(chunk("", finish="length"), 4.0)
    r.feed(b'{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5}}', 4.5)
    r.feed(b"[DONE]", 4.6)
    assert r.end() == "done" and r.chunk_times == [0.0, 1.0, 2.0, 3.0, 4.0] and r.output_tokens() == 5
    # chat: the role-only chunk is no token
    r = StreamReader(chat=True)
    r.feed(b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}', 0.0)
    r.feed(chunk("", chat=True), 1.0)
    r.feed(chunk("x", chat=True), 2.0)
    assert r.chunk_times == [1.0, 2.0]
