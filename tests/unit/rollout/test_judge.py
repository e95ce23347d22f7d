"""A stage's judgement (paired windows, the verification's one-sided test), shares from histogram buckets, and
the weights that give a stage its share."""

from __future__ import annotations

import math

import pytest

from tuner.measure.scrape import parse
from tuner.rollout.judge import Window, figures, judge, judged_metrics, share_below, slo_breaking
from tuner.rollout.rollout import stage_weights
from tuner.spec import SLO


def _windows(stable: list[float], canary: list[float]) -> list[tuple[Window, Window]]:
    return [(Window(5, {"ttft_ms.mean": s}), Window(2, {"ttft_ms.mean": c})) for s, c in zip(stable, canary,
                                                                                            strict=True)]


def test_judge_passes_a_better_canary_and_rolls_back_a_worse_one() -> None:
    stable = [100.0, 120.0, 95.0, 110.0, 105.0]
    better = judge(_windows(stable, [s * 0.7 for s in stable]), ["ttft_ms.mean"], max_regression=0.05,
                   confidence=0.95)
    assert better.passed and not better.regressed and better.metrics[0].improvement > 0.4
    worse = judge(_windows(stable, [s * 1.5 * f for s, f in zip(stable, [1, 1.05, 0.97, 1.02, 1], strict=True)]),
                  ["ttft_ms.mean"], max_regression=0.05, confidence=0.95)
    assert worse.regressed and not worse.passed and "significant regression" in worse.reason
    same = judge(_windows(stable, [s * f for s, f in zip(stable, [1.3, 0.8, 1.2, 0.85, 1.1], strict=True)]),
                 ["ttft_ms.mean"], max_regression=0.05, confidence=0.95)
    assert not same.passed and not same.regressed and "undecided" in same.reason  # noisy: neither shown


def test_judge_needs_two_windows_with_traffic_on_both_sides() -> None:
    pairs = [(Window(5, {"ttft_ms.mean": 100.0}), Window(0, {})), (Window(5, {"ttft_ms.mean": 100.0}),
                                                                   Window(1, {"ttft_ms.mean": 50.0}))]
    v = judge(pairs, ["ttft_ms.mean"], max_regression=0.05, confidence=0.95)
    assert not v.passed and not v.regressed and v.metrics[0].pairs == 1 and math.isnan(v.metrics[0].improvement)


def _hist(counts: dict[str, int], total_s: float) -> str:
    n = max(counts.values())
    lines = [f'vllm:time_to_first_token_seconds_bucket{{model_name="m",le="{le}"}} {c}' for le, c in counts.items()]
    lines += [f'vllm:time_to_first_token_seconds_count{{model_name="m"}} {n}',
              f'vllm:time_to_first_token_seconds_sum{{model_name="m"}} {total_s}']
    return "# TYPE vllm:time_to_first_token_seconds histogram\n" + "\n".join(lines) + "\n"


def test_shares_and_slo_breaks_from_bucket_deltas() -> None:
    before = parse(_hist({"0.1": 2, "0.5": 4, "1.0": 4, "+Inf": 4}, 1.0))
    after = parse(_hist({"0.1": 4, "0.5": 10, "1.0": 12, "+Inf": 14}, 8.0))  # 10 new: 2, 4, 2 and 2 over 1 s
    n, share = share_below(before, after, "ttft_ms", 0.5)
    assert n == 10 and share == pytest.approx(0.6)
    assert share_below(before, after, "ttft_ms", 0.3)[1] == pytest.approx((2 + 4 * 0.5) / 10)  # within a bucket
    assert slo_breaking(before, after, {"ttft": 1000.0}) == pytest.approx(2)
    w = figures(before, after, ["ttft_ms.mean", "goodput_fraction"], {"ttft": 500.0})
    assert w.figures["ttft_ms.mean"] == pytest.approx(700.0) and w.figures["goodput_fraction"] == pytest.approx(0.6)


def _gp(requests: float, share: float) -> Window:
    return Window(requests, {"goodput_fraction": share})


def test_goodput_is_judged_on_the_stage_pooled_counts() -> None:
    """A window of a few canary requests cannot be paired on a share; the stage's counts are tested instead."""
    one = [(_gp(15, 1.0), _gp(1, 1.0))] * 4
    all_good = judge(one, ["goodput_fraction"], max_regression=0.1, confidence=0.95,
                     totals=(_gp(60, 1.0), _gp(12, 1.0)))
    assert all_good.passed and all_good.metrics[0].improvement == pytest.approx(0.0)
    bad = judge(one, ["goodput_fraction"], max_regression=0.1, confidence=0.95, totals=(_gp(200, 0.99),
                                                                                         _gp(40, 0.5)))
    assert bad.regressed and "goodput_fraction" in bad.reason
    few = judge(one, ["goodput_fraction"], max_regression=0.1, confidence=0.95, totals=(_gp(200, 1.0),
                                                                                         _gp(10, 0.8)))
    assert not few.passed and not few.regressed  # 2 of 10 missed: not yet shown either way
    stable_zero = judge(one, ["goodput_fraction"], max_regression=0.1, confidence=0.95,
                        totals=(_gp(100, 0.0), _gp(20, 1.0)))
    assert stable_zero.passed  # a stable share of 0 (overloaded) does not keep a good canary undecided


def test_judged_metrics_default_to_what_the_servers_export() -> None:
    slos = [SLO(metric="ttft_ms.p99", max=500), SLO(metric="tpot_ms.p99", max=50)]
    assert judged_metrics("ttft_ms.mean", slos, None) == ["ttft_ms.mean", "ttft_ms.p99", "goodput_fraction"]
    assert judged_metrics("output_throughput", [], None) == ["ttft_ms.mean", "e2el_ms.mean"]
    assert judged_metrics("x", slos, ["e2el_ms.p99"]) == ["e2el_ms.p99"]


@pytest.mark.parametrize("stable", [{"a": 100}, {"a": 100, "b": 100}, {"a": 256, "b": 256, "c": 10}])
@pytest.mark.parametrize("percent", [5, 25, 50, 75, 90])
def test_stage_weights_give_the_share(stable: dict[str, int], percent: float) -> None:
    cw, sw = stage_weights(percent, stable)
    assert 1 <= cw <= 256 and all(0 < w <= 256 for w in sw.values())
    assert cw / (cw + sum(sw.values())) == pytest.approx(percent / 100, abs=0.02)


def test_full_traffic_drains_the_stable_replicas() -> None:
    cw, sw = stage_weights(100, {"a": 100, "b": 50})
    assert cw > 0 and sw == {"a": 0, "b": 0}
