"""The early-stop rule (tuner.measure.early_stop): when a partial measurement prunes a run, and the replay of a
finished run's records (the simulator's) as a live watch would have stopped it."""

from __future__ import annotations

from tuner.measure.early_stop import EarlyStopRule, replay
from tuner.measure.records import RequestRecord


def rec(i: int, ttft_s: float, *, sent_s: float | None = None, warmup: bool = False) -> RequestRecord:
    sent = float(i) if sent_s is None else sent_s
    first = sent + ttft_s
    return RequestRecord(index=i, scheduled_s=sent, sent_s=sent, first_token_s=first, done_s=first + 0.1,
                         prompt_tokens=16, output_tokens=2, token_times_s=(first, first + 0.1), warmup=warmup)


RULE = EarlyStopRule(limits={"ttft_ms.p99": 100.0}, factor=3.0, min_requests=10, check_every=5)


def test_judges_only_after_min_requests_and_past_the_factor() -> None:
    slow = [rec(i, 1.0) for i in range(9)]  # 1000 ms, 10x the limit, but only 9 requests
    assert RULE.judge(slow) is None
    stop = RULE.judge([*slow, rec(9, 1.0)], at_s=12.0)
    assert stop is not None and stop.metric == "ttft_ms.p99" and stop.completed == 10 and stop.at_s == 12.0
    assert stop.value > 300.0 and stop.limit == 100.0
    assert "ttft_ms.p99" in stop.to_attr()["reason"]
    # 2.5x the limit breaks the SLO but not by the factor: no stop
    assert RULE.judge([rec(i, 0.25) for i in range(20)]) is None


def test_warmup_requests_do_not_count() -> None:
    records = [rec(i, 1.0, warmup=True) for i in range(30)] + [rec(100 + i, 0.05) for i in range(10)]
    assert RULE.judge(records) is None
    assert RULE.judge([rec(i, 1.0, warmup=True) for i in range(30)]) is None


def test_due_every_check_from_min_requests() -> None:
    assert [n for n in range(1, 26) if RULE.due(n)] == [10, 15, 20, 25]
    # a long run is judged 32 times per doubling of its completed requests, not n / 5
    assert sum(RULE.due(n) for n in range(10_240, 20_480)) == 32
    # every 5 up to 64 x 5 = 320, then every 10
    assert [n for n in range(300, 400) if RULE.due(n)] == [300, 305, 310, 315, 320, 330, 340, 350, 360, 370, 380, 390]


def test_replay_keeps_what_completed_before_the_stop() -> None:
    # the first 12 requests are fast, then the server falls behind: TTFT grows
    records = [rec(i, 0.01) for i in range(12)] + [rec(i, 0.5 * (i - 11)) for i in range(12, 60)]
    kept, stop = replay(records, RULE)
    assert stop is not None
    assert stop.completed == len(kept) < len(records)
    assert all(r.done_s <= stop.at_s for r in kept)
    assert max(r.done_s for r in kept) == stop.at_s
    # every request done by then is kept, in index order
    assert [r.index for r in kept] == sorted(r.index for r in records if r.done_s <= stop.at_s)


def test_replay_of_a_run_within_the_slo_keeps_everything() -> None:
    records = [rec(i, 0.05) for i in range(40)]
    kept, stop = replay(records, RULE)
    assert stop is None and kept == records


def test_the_last_request_never_prunes() -> None:
    # the run's end comes at the 10th request: judged then it would be complete anyway, so it is not cut
    records = [rec(i, 1.0) for i in range(10)]
    kept, stop = replay(records, RULE)
    assert stop is None and len(kept) == 10


def test_a_rule_without_limits_never_stops() -> None:
    assert EarlyStopRule(limits={}).judge([rec(i, 5.0) for i in range(50)]) is None
