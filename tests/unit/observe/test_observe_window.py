"""Observation from /metrics scrapes: window increases (resets, label sets, late series), the fit, and errors
naming the series, on vLLM-style expositions parsed by tuner.measure.scrape."""

from __future__ import annotations

import pytest

from tuner.errors import ObservationError
from tuner.measure.scrape import parse
from tuner.observe import MetricsWindow
from tuner.observe.fit import dispersion, fit_arrival

BOUNDS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)


def _hist(name: str, lengths: list[int], labels: str) -> list[str]:
    lines = [f"# TYPE {name} histogram"]
    for le in BOUNDS:
        lines.append(f'{name}_bucket{{{labels}le="{float(le)}"}} {sum(x <= le for x in lengths)}')
    lines += [f'{name}_bucket{{{labels}le="+Inf"}} {len(lengths)}', f"{name}_sum{{{labels}}} {sum(lengths)}",
              f"{name}_count{{{labels}}} {len(lengths)}"]
    return lines


def exposition(prompts: list[int], outputs: list[int], running: float, waiting: float = 0.0, *,
               engines: int = 1, prefix: tuple[float, float] | None = (0.0, 0.0), drop: str = "") -> str:
    """vLLM's exposition after the finished requests `prompts`/`outputs`, split over `engines` label sets."""
    lines: list[str] = []
    for e in range(engines):
        lab = f'engine="{e}",model_name="m",'
        mine_p, mine_o = prompts[e::engines], outputs[e::engines]
        if drop != "prompt":
            lines += _hist("vllm:request_prompt_tokens", mine_p, lab)
        lines += _hist("vllm:request_generation_tokens", mine_o, lab)
        lines += ["# TYPE vllm:request_success counter",
                  f'vllm:request_success_total{{{lab}finished_reason="length"}} {len(mine_p)}',
                  "# TYPE vllm:num_requests_running gauge",
                  f"vllm:num_requests_running{{{lab.rstrip(',')}}} {running / engines}",
                  "# TYPE vllm:num_requests_waiting gauge",
                  f"vllm:num_requests_waiting{{{lab.rstrip(',')}}} {waiting / engines}"]
        if prefix is not None:
            lines += ["# TYPE vllm:prefix_cache_queries counter",
                      f"vllm:prefix_cache_queries_total{{{lab.rstrip(',')}}} {prefix[0] / engines}",
                      "# TYPE vllm:prefix_cache_hits counter",
                      f"vllm:prefix_cache_hits_total{{{lab.rstrip(',')}}} {prefix[1] / engines}"]
    return "\n".join(lines) + "\n"


def test_a_closed_loop_window_gives_rate_lengths_and_concurrency() -> None:
    win = MetricsWindow("metrics test")
    done = 0
    for i in range(11):  # 10 s, 8 requests a second, 4 in flight, 300-token prompts, 40-token answers
        win.add(parse(exposition([300] * done, [40] * done, running=4, prefix=(300.0 * done, 75.0 * done))),
                1000.0 + i)
        done += 8
    obs = win.observe()
    assert obs.stats["requests"] == 80 and obs.stats["rate_per_s"] == pytest.approx(8.0)
    assert obs.stats["prompt_tokens_mean"] == 300 and obs.stats["output_tokens_mean"] == 40
    assert obs.stats["concurrency_mean"] == 4 and obs.stats["prefix_cache_hit_rate"] == pytest.approx(0.25)
    wl = obs.workload
    assert wl.arrival.kind == "closed" and wl.arrival.concurrency == 4
    assert wl.prompt_tokens.dist == "fixed" and wl.prompt_tokens.value == 300
    assert wl.output_tokens.value == 40 and wl.num_requests == 80
    assert obs.fit_error["prompt_tokens_bucket_ks"] == 0 and obs.fit_error["output_tokens_mean_rel_err"] == 0
    assert (obs.start_s, obs.end_s) == (1000.0, 1010.0)


def test_a_restart_is_no_negative_increase_and_engines_are_summed() -> None:
    win = MetricsWindow("metrics test")
    # two engines; 30 requests, then the server restarts (counters from 0) and finishes 12 more
    win.add(parse(exposition([100] * 20, [10] * 20, running=2, engines=2)), 0.0)
    win.add(parse(exposition([100] * 50, [10] * 50, running=2, engines=2)), 5.0)
    win.add(parse(exposition([100] * 4, [10] * 4, running=2, engines=2)), 10.0)
    win.add(parse(exposition([100] * 12, [10] * 12, running=2, engines=2)), 15.0)
    assert win.counter_steps("request_success") == [30, 4, 8]
    assert win.hist_increase("request_prompt_tokens").count == 42
    assert win.hist_increase("request_prompt_tokens").sum == 4200
    assert win.gauge_samples("num_requests_running") == [2, 2, 2, 2]


def test_a_series_first_seen_inside_the_window_started_at_zero() -> None:
    win = MetricsWindow("metrics test")
    win.add(parse("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n"), 0.0)
    win.add(parse(exposition([64] * 5, [8] * 5, running=1)), 1.0)
    assert win.counter_increase("request_success") == 5
    assert win.hist_increase("request_generation_tokens").count == 5


@pytest.mark.parametrize(("drop", "series"), [("prompt", "vllm:request_prompt_tokens_bucket")])
def test_a_missing_series_is_an_error_naming_it(drop: str, series: str) -> None:
    win = MetricsWindow("metrics http://127.0.0.1:1/metrics")
    for i in range(3):
        win.add(parse(exposition([10] * i, [10] * i, running=1, drop=drop)), float(i))
    with pytest.raises(ObservationError, match=series) as exc:
        win.observe()
    assert "metrics http://127.0.0.1:1/metrics" in str(exc.value)


def test_no_gauge_or_no_request_is_an_error_not_a_zero() -> None:
    win = MetricsWindow("m")
    text = exposition([10] * 3, [10] * 3, running=1).replace("vllm:num_requests_waiting", "other_gauge")
    win.add(parse(text), 0.0)
    win.add(parse(text), 1.0)
    with pytest.raises(ObservationError, match="vllm:num_requests_waiting"):
        win.counts()
    idle = MetricsWindow("m")
    idle.add(parse(exposition([10] * 3, [10] * 3, running=0)), 0.0)
    idle.add(parse(exposition([10] * 3, [10] * 3, running=0)), 1.0)
    with pytest.raises(ObservationError, match="vllm:request_success_total did not increase"):
        idle.observe()
    one = MetricsWindow("m")
    one.add(parse(exposition([10], [10], running=0)), 0.0)
    with pytest.raises(ObservationError, match="at least two scrapes"):
        one.observe()


def test_an_open_loop_window_is_fitted_as_poisson_with_its_spread_of_lengths() -> None:
    import numpy as np

    rng = np.random.default_rng(3)
    win = MetricsWindow("m")
    prompts: list[int] = []
    outputs: list[int] = []
    for i in range(31):
        n = int(rng.poisson(6))
        prompts += [int(x) for x in np.clip(rng.lognormal(np.log(180), 0.5, n), 1, 1999)]
        outputs += [int(x) for x in rng.integers(20, 120, n)]
        win.add(parse(exposition(prompts, outputs, running=float(rng.poisson(3)))), float(i))
    obs = win.observe()
    assert obs.workload.arrival.kind == "poisson"
    assert obs.workload.arrival.rate_per_s == pytest.approx(obs.stats["requests"] / 30)
    assert 0.5 <= obs.stats["burstiness"] <= 2.0
    assert obs.workload.prompt_tokens.dist != "fixed"
    assert obs.fit_error["prompt_tokens_mean_rel_err"] < 0.05 and obs.fit_error["prompt_tokens_bucket_ks"] < 0.1


def test_a_rolling_window_keeps_its_age() -> None:
    win = MetricsWindow("m", max_age_s=5)
    for i in range(20):
        win.add(parse(exposition([10] * i, [10] * i, running=1)), float(i))
    assert win.start_s == 13.0 and win.end_s == 19.0
    assert win.counter_increase("request_success") == 6


def test_dispersion_of_regular_and_bursty_counts() -> None:
    assert dispersion([(1.0, 5.0)] * 10) == 0
    assert dispersion([(1.0, 0.0), (1.0, 20.0)] * 5) == pytest.approx(100 / 9)  # each interval 10 off a mean of 10
    assert dispersion([(1.0, 5.0)] * 2) is None
    assert dispersion([(1.0, 3.0), (2.0, 6.0), (1.0, 3.0)]) == 0  # intervals of any length, one rate


def test_prometheus_range_counts_are_differenced_per_series() -> None:
    from tuner.observe.prom import step_increases

    a = {100.0: 10.0, 102.0: 14.0, 104.0: 2.0, 106.0: 5.0}  # restarted between 102 and 104
    b = {104.0: 3.0, 106.0: 4.0}  # first seen at 104: it began at 0 inside the window
    assert step_increases([a, b], 100.0) == [(2.0, 4.0), (2.0, 5.0), (2.0, 4.0)]


def test_selectors_are_label_matchers() -> None:
    from tuner.observe.prom import check_selector

    assert check_selector('{job="vllm", model_name=~"m.*"}') == 'job="vllm", model_name=~"m.*"'
    assert check_selector("") == ""
    for bad in ("job=vllm", 'job="a"} or vector(1) {', 'up{job="a"}', '"a"="b"'):
        with pytest.raises(ObservationError, match="expected label matchers"):
            check_selector(bad)


def test_a_scrape_from_a_clock_set_back_is_left_out() -> None:
    win = MetricsWindow("m")
    assert win.add(parse(exposition([10], [10], running=1)), 10.0)
    assert not win.add(parse(exposition([10] * 5, [10] * 5, running=1)), 9.0)
    assert len(win.scrapes) == 1


def test_a_quiet_open_loop_is_not_read_as_a_closed_loop_of_one() -> None:
    """0 or 1 requests in the server at once never pass 1 in an open loop either (the failure of a busy CI
    host: Poisson at 6/s, 1 in the server in 7 of 16 samples); a closed loop of 1 sits at 1 nearly always."""
    open_loop, _, _ = fit_arrival(6.0, 1.0, [1.0] * 7 + [0.0] * 9)
    assert open_loop.kind == "poisson" and open_loop.rate_per_s == 6.0
    one, _, notes = fit_arrival(3.0, 0.4, [1.0] * 14 + [0.0] * 2)
    assert (one.kind, one.concurrency) == ("closed", 1), notes
    two, _, _ = fit_arrival(3.0, 0.4, [2.0] * 8 + [1.0] * 6 + [0.0] * 2)
    assert (two.kind, two.concurrency) == ("closed", 2)
