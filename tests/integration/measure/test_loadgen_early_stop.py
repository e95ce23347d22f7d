"""The load generator's early stop (tuner.measure.early_stop) against a local server that serves one request at
a time (fault injection: tests/support/fake_openai_server.py): 8 requests in flight queue behind each other, so
the 8th waits for 7 others' 100 ms TTFT (>= 0.7 s whatever the host's speed) against a 50 ms limit; the run stops
once its partial p99 TTFT passes 3 x 50 ms, keeping the requests completed by then. A limit the server meets by
far never stops it."""

from __future__ import annotations

import pytest

from tests.support.fake_openai_server import start_fake_server
from tuner.measure.early_stop import EarlyStopRule
from tuner.measure.loadgen import measure_endpoint
from tuner.spec import Arrival, LengthDist, WorkloadSpec

N = 60


def workload(arrival: Arrival) -> WorkloadSpec:
    return WorkloadSpec(arrival=arrival, num_requests=N, prompt_tokens=LengthDist(value=16),
                        output_tokens=LengthDist(value=2), timeout_s=60.0)


@pytest.mark.parametrize("arrival", [Arrival(kind="closed", concurrency=8), Arrival(kind="constant", rate_per_s=40)])
def test_a_run_breaking_the_limit_by_far_stops_with_its_partial(arrival: Arrival) -> None:
    rule = EarlyStopRule(limits={"ttft_ms.p99": 50.0}, factor=3.0, min_requests=10, check_every=5)
    with start_fake_server(ttft_ms=100, itl_ms=0, max_concurrency=1, queue=True) as srv:
        m = measure_endpoint(srv.url, model="fake", seed=0, goodput_ms={}, tokenizer="byte",
                             workload=workload(arrival), early_stop=rule)
    stop = m.early_stop
    assert stop is not None and stop["metric"] == "ttft_ms.p99" and stop["value"] > 150.0
    done = int(m.summary["completed"])
    assert stop["completed"] == done and 10 <= done < N
    assert len([r for r in m.records if not r.warmup]) == done  # the requests in flight were abandoned
    assert m.summary["p99_ttft_ms"] == stop["value"]
    assert m.summary["interrupted"] == 0.0 and any("stopped early" in n for n in m.notes)


def test_a_run_within_the_limit_runs_to_its_end() -> None:
    rule = EarlyStopRule(limits={"ttft_ms.p99": 60_000.0}, factor=3.0, min_requests=10, check_every=5)
    with start_fake_server(ttft_ms=5, itl_ms=0) as srv:
        m = measure_endpoint(srv.url, model="fake", seed=0, goodput_ms={}, tokenizer="byte",
                             workload=workload(Arrival(kind="closed", concurrency=4)), early_stop=rule)
    assert m.early_stop is None and m.summary["completed"] == N
