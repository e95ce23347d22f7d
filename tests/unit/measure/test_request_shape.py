"""Request shape options in the workload, their validation, and a trial whose requests all failed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.agent import load_agent
from tuner.errors import ConfigError
from tuner.measure.failures import (
    CAUSE_ALL_REQUESTS_FAILED,
    CAUSE_REQUEST_ERRORS,
    error_rate_slo,
    request_failure,
)
from tuner.measure.measurement import Measurement
from tuner.measure.metrics import first_errors, prompt_length_check, summarise
from tuner.measure.records import RequestRecord
from tuner.spec import SLO, WorkloadSpec

AGENT = """\
name: t
target: {kind: sim, hardware: a100-80gb-sxm}
search_space:
  params:
    max_num_seqs: {type: int, low: 8, high: 512, default: 256}
workload:
  arrival: {kind: poisson, rate_per_s: 10}
  num_requests: 50
  stream: false
objectives:
  - {metric: output_throughput, direction: maximize}
slos:
  - {metric: SLO_METRIC, max: 2000}
"""


def rec(i: int, *, error: str | None = None, detail: str = "", asked: int = 64, got: int = 64) -> RequestRecord:
    return RequestRecord(index=i, scheduled_s=0.0, sent_s=0.0, first_token_s=0.1, done_s=0.5, prompt_tokens=got,
                         output_tokens=4, token_times_s=(0.1, 0.2, 0.3, 0.4), error=error, error_detail=detail,
                         status=400 if error else 200, requested_prompt_tokens=asked)


def test_slos_on_streamed_only_latencies_are_refused_without_streaming(tmp_path: Path) -> None:
    p = tmp_path / "a.yaml"
    p.write_text(AGENT.replace("SLO_METRIC", "ttft_ms.p99"))
    with pytest.raises(ConfigError, match="ttft_ms.p99 is measured only on streamed responses"):
        load_agent(p)
    p.write_text(AGENT.replace("SLO_METRIC", "e2el_ms.p99"))
    assert not load_agent(p).spec.workload.stream


def test_workload_shape_fields() -> None:
    w = WorkloadSpec(num_requests=1, extra_body={"temperature": 0, "stream_options": None},
                     prompt_format="token_ids")
    assert w.extra_body["temperature"] == 0 and w.prompt_format == "token_ids"
    with pytest.raises(ValueError, match="token_ids.*completions"):
        WorkloadSpec(num_requests=1, endpoint="chat", prompt_format="token_ids")
    with pytest.raises(ValueError, match="must not set 'messages'"):
        WorkloadSpec(num_requests=1, extra_body={"messages": []})


def test_a_trial_whose_requests_all_failed_has_a_cause_and_the_servers_words() -> None:
    recs = [rec(i, error="http_4xx", detail='{"error": "unexpected field ignore_eos"}') for i in range(5)]
    m = Measurement(summary=summarise(recs), records=tuple(recs))
    assert first_errors(recs) == {"http_4xx": (5, '{"error": "unexpected field ignore_eos"}')}
    cause, detail = request_failure(m, None) or ("", "")
    assert cause == CAUSE_ALL_REQUESTS_FAILED and "every request failed" in detail and "ignore_eos" in detail
    # some failed, one cause, over the error_rate SLO: request_errors (not "all failed"); under it (or no SLO): none
    recs = [rec(0), rec(1), rec(2, error="timeout", detail="slow"), rec(3, error="timeout", detail="slow")]
    m = Measurement(summary=summarise(recs), records=tuple(recs))
    assert request_failure(m, 0.1) == (CAUSE_REQUEST_ERRORS,
                                       "error rate 0.50 over the SLO (0.1); timeout x2: slow")
    assert request_failure(m, 0.6) is None and request_failure(m, None) is None
    assert error_rate_slo([SLO(metric="error_rate", max=0.2), SLO(metric="error_rate", max=0.05)]) == 0.05


def test_the_servers_prompt_count_is_compared_with_what_was_asked() -> None:
    assert prompt_length_check([rec(i, asked=64, got=70) for i in range(4)]) is None  # within 10 %
    msg = prompt_length_check([rec(i, asked=64, got=281) for i in range(4)])
    assert msg is not None and "asked for 64" in msg and "counted 281" in msg and "--tokenizer" in msg
