"""Prompt lengths fitted to a counter (tuner.measure.promptfit), the byte-level tokenizer `tuner make-model`
writes, and the definitions table that maps the tuner's latencies to other tools' names."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.engine.checkpoint import write_checkpoint
from tuner.measure import definitions
from tuner.measure.promptfit import CountError, FittedPrompts, fitted_for_server, residual
from tuner.measure.records import RequestRecord
from tuner.measure.tokenize import load_tokenizer

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def byte_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("m") / "tiny", "tiny")


def test_the_byte_level_tokenizer_make_model_writes_gives_exact_distinct_prompts(byte_dir: Path) -> None:
    tok = load_tokenizer(str(byte_dir))  # refused before ("no plain words to build prompts from")
    assert tok.exact
    for n in (1, 2, 5, 23, 24, 64, 333, 2000):
        texts = {tok.synth_text(n, key) for key in range(8)}
        assert all(tok.count(t) == n for t in texts), n
        if n >= 8:  # a head that differs per request: no shared prefix-cache block
            assert len({t[:4] for t in texts}) == 8


def test_lengths_fitted_to_a_counter_with_a_template(byte_dir: Path) -> None:
    tok = load_tokenizer(str(byte_dir))
    # a server that counts with this tokenizer and adds a 3-token template of its own
    calls: list[str] = []

    def count(text: str) -> int:
        calls.append(text)
        return tok.count(text) + 3

    fp = FittedPrompts(count, "server_tokenize", seed=1)
    fp.fit([16, 64, 64, 200])
    assert fp.report() == {"method": "server_tokenize", "probes": len(calls), "lengths_fitted": 3,
                           "fit_max_error_tokens": 0}
    assert len(calls) <= 3 * 4  # a few probes per length
    for n in (16, 64, 200):
        assert all(count(fp.synth_text(n, key)) == n for key in range(5))
    # a length between fitted ones: interpolated, within a token here
    assert abs(count(fp.synth_text(100, 7)) - 100) <= 1
    with pytest.raises(Exception, match="token ids need a tokenizer"):
        fp.synth_ids(8, 1)


def test_the_first_counter_that_counts_is_used_and_failures_are_said() -> None:
    def refuses(text: str) -> int:
        raise CountError("404 from /tokenize")

    def counts(text: str) -> int:
        return len(text.split())

    fp, why = fitted_for_server([10, 40], [("server_tokenize", lambda: refuses, 64),
                                           ("usage_calibration", lambda: counts, 16)], seed=0)
    assert fp is not None and fp.method == "usage_calibration" and why == ["server_tokenize: 404 from /tokenize"]
    assert counts(fp.synth_text(40, 3)) == 40
    fp, why = fitted_for_server([10], [("usage_calibration", lambda: refuses, 16)], seed=0)
    assert fp is None and len(why) == 1


def test_residual_is_what_the_server_counted_against_what_was_asked() -> None:
    def rec(i: int, asked: int, got: int | None) -> RequestRecord:
        return RequestRecord(index=i, scheduled_s=0, sent_s=0, first_token_s=0.1, done_s=0.2,
                             prompt_tokens=got or asked, output_tokens=2, requested_prompt_tokens=asked,
                             server_prompt_tokens=got)

    r = residual([rec(0, 100, 100), rec(1, 100, 101), rec(2, 100, 110), rec(3, 100, None)])
    assert r["counted_by_server"] == 3 and r["server_median"] == 101 and r["error_frac_median"] == pytest.approx(0.01)
    assert r["abs_error_frac_max"] == pytest.approx(0.10) and r["within_2pct_frac"] == pytest.approx(2 / 3)
    assert residual([rec(0, 100, None)]) == {"counted_by_server": 0}


def test_definitions_map_each_latency_to_the_other_tools_names() -> None:
    table = definitions.as_json()
    assert set(table) == {"ttft", "tpot", "itl", "e2el"}
    assert all(set(row) == {"meaning", "vllm", "guidellm", "aiperf"} for row in table.values())
    # the names that are easy to confuse
    assert table["tpot"]["aiperf"].startswith("inter_token_latency")
    assert table["tpot"]["guidellm"].startswith("inter_token_latency") and "time_per_output_token" in table["tpot"][
        "guidellm"]
    assert table["itl"]["aiperf"].startswith("inter_chunk_latency")
    # the docs print the same table
    assert definitions.markdown() in (REPO / "docs" / "metrics.md").read_text()
