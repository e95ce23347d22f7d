"""The autocorrelation that widens a latency baseline pooled over the baselines of the monitor's life
(MonitorConfig.autocorrelation_baselines): after a drift the server and its host are the same, and twenty windows'
lag-1 estimate is noisy; one wander in a relearnt baseline's windows no longer widens its scale alone."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import agents
from tuner.agent import load_agent
from tuner.errors import ConfigError
from tuner.monitor.classify import Monitor
from tuner.monitor.config import MonitorConfig

SLOW_AT = 140


def _life(rng: random.Random, bump: float = 1.15) -> Iterator[dict[str, float]]:
    """A server at 4 req/s whose rate doubles at window 60 and goes back at 100 (two drifts, a baseline learnt
    again after each), its ITL mean `bump` times as high for windows 110-115 (a wander in the windows the second
    relearning learns from), then +30 % from SLOW_AT on (a slowdown at the same load)."""
    for i in range(SLOW_AT + 30):
        rate = 8.0 if 60 <= i < 100 else 4.0
        f = (1.3 if i >= SLOW_AT else 1.0) * (bump if 110 <= i < 116 else 1.0)
        yield {"rate_per_s": rng.gauss(rate, 0.1 * rate), "prompt_tokens_mean": rng.gauss(100, 5),
               "output_tokens_mean": rng.gauss(16, 1), "itl_ms_mean": 8.0 * f * rng.lognormvariate(0, 0.04),
               "ttft_ms_p50": 50.0 * f * rng.lognormvariate(0, 0.08)}


def _replay(baselines: int, seed: int, bump: float = 1.15) -> tuple[Monitor, list[tuple[int, str]]]:
    m = Monitor(MonitorConfig(interval_s=15.0, autocorrelation_baselines=baselines))
    events = [(i, e.kind) for i, w in enumerate(_life(random.Random(seed), bump)) for e in m.observe(15.0 * i, w)]
    return m, [(i, k) for i, k in events if k != "recovery"]


def _delay(events: list[tuple[int, str]]) -> int:
    """Windows from the slowdown's start to its anomaly (1: at its first window's end); 99 where not found."""
    return next((i - SLOW_AT + 1 for i, k in events if i >= SLOW_AT and k == "anomaly"), 99)


def test_a_wander_in_a_relearnt_baselines_windows_is_weighed_with_the_baselines_before_it() -> None:
    alone, pooled = [], []
    for seed in range(8):
        m1, ev1 = _replay(1, seed)
        m4, ev4 = _replay(4, seed)
        for ev in (ev1, ev4):  # both drifts found as drifts, nothing else before the slowdown
            assert [k for i, k in ev if i < SLOW_AT] == ["drift", "drift"], ev
        assert len(m1._rhos) == 1 and len(m4._rhos) == 3  # the first baseline and one after each drift
        assert m4._rhos[-1] == m1._rhos[-1] and m4._rho < m1._rho  # the same estimate, weighed with two before
        alone.append(_delay(ev1))
        pooled.append(_delay(ev4))
    assert sorted(pooled)[4] <= 8 and max(pooled) < 12, pooled  # found within the horizon, every seed
    assert sum(p < a for p, a in zip(pooled, alone, strict=True)) >= 6, (pooled, alone)
    assert sum(a == 99 for a in alone) >= 3, alone  # this baseline's estimate alone: the slowdown missed


def test_without_a_drift_the_pooled_autocorrelation_is_the_baselines_own() -> None:
    """One baseline in the monitor's life (no drift): the option changes nothing, its warm-up's relearning
    replacing the estimate rather than adding one."""
    for seed in range(3):
        rng = random.Random(seed)
        windows = [{"rate_per_s": rng.gauss(4.0, 0.4), "prompt_tokens_mean": rng.gauss(100, 5),
                    "output_tokens_mean": rng.gauss(16, 1),
                    # a warm-up: the first 15 windows slower, falling (judged, the latencies learnt again)
                    "itl_ms_mean": 8.0 * (1.0 + 0.3 * max(0, 15 - i) / 15) * rng.lognormvariate(0, 0.04)}
                   for i in range(120)]
        got = []
        for n in (1, 4):
            m = Monitor(MonitorConfig(interval_s=15.0, autocorrelation_baselines=n))
            got.append(([e.kind for i, w in enumerate(windows) for e in m.observe(15.0 * i, w)], m._rho, m._rhos))
            assert len(m._rhos) == 1 and m._spent > m.config.learn_windows  # learnt again in the warm-up
        assert got[0] == got[1]


def test_the_pooling_is_the_agent_files_and_checked(tmp_path: Path) -> None:
    watch: dict[str, Any] = {"url": "http://127.0.0.1:9/metrics", "interval_s": 15,
                             "monitor": {"autocorrelation_baselines": 4}}
    spec = load_agent(agents.write_agent(tmp_path / "a.yaml", name="a", watch=watch)).spec
    assert spec.watch is not None and spec.watch.monitor is not None
    assert MonitorConfig.from_spec(spec.watch.monitor, 15.0).autocorrelation_baselines == 4
    watch["monitor"] = {}
    spec = load_agent(agents.write_agent(tmp_path / "b.yaml", name="b", watch=watch)).spec
    assert spec.watch is not None and spec.watch.monitor is not None
    assert MonitorConfig.from_spec(spec.watch.monitor, 15.0).autocorrelation_baselines == 1  # each its own
    watch["monitor"] = {"autocorrelation_baselines": 0}
    with pytest.raises(ConfigError, match=r"c\.yaml[\s\S]*autocorrelation_baselines[\s\S]*greater than or equal "
                                          r"to 1"):
        load_agent(agents.write_agent(tmp_path / "c.yaml", name="c", watch=watch))
