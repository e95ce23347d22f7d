"""The latencies' baselines learnt again from a longer history of calm windows (MonitorConfig.history_windows), and
that history kept to the windows at the baseline's usual CPU wait (MonitorConfig.history_usual_wait): a host whose
speed wanders over minutes is judged against its longer normal; a busy host's history does not pool every
contention the wait law corrects for."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from tests.support import agents
from tuner.agent import load_agent
from tuner.errors import ConfigError
from tuner.monitor.classify import Monitor
from tuner.monitor.config import HOST_SPEED_HISTORY_WINDOWS, OWN_PROBE_AUTOCORRELATION_HORIZON, MonitorConfig


def _windows(rng: random.Random, n: int, level: Callable[[int], float],
             wait: Callable[[int], float] | None = None, law: float = 1.0) -> Iterator[dict[str, float]]:
    """`n` 15-s windows of a steady load whose ITL mean is `level(i)` times its own (spread 4 %), the server waiting
    a share `wait(i)` of each window for a CPU (stretched by (1 / (1 - share)) ** `law`) where given."""
    for i in range(n):
        w = wait(i) if wait else 0.0
        f = level(i) / (1.0 - w) ** law
        sig = {"rate_per_s": rng.gauss(4.0, 0.4), "prompt_tokens_mean": rng.gauss(100, 5),
               "output_tokens_mean": rng.gauss(16, 1), "itl_ms_mean": 8.0 * f * rng.lognormvariate(0, 0.04),
               "ttft_ms_p50": 50.0 * f * rng.lognormvariate(0, 0.08)}
        if wait:
            sig["cpu_wait_frac"] = w
        yield sig


def _anomalies(m: Monitor, windows: Iterator[dict[str, float]]) -> list[int]:
    return [i for i, sig in enumerate(windows) for e in m.observe(15.0 * i, sig) if e.kind == "anomaly"]


def _wander(i: int) -> float:
    """A host whose speed wanders +-10 % over 40 minutes: fast while the first baseline is learnt."""
    return 1.0 - 0.1 * math.cos(2 * math.pi * i / 160)


def test_a_host_whose_speed_wanders_is_judged_against_its_longer_normal() -> None:
    """The first baseline, learnt at the host's fastest, flags each slower stretch (every 40 minutes, for as long
    as it runs); learnt again from up to 160 calm windows, it holds the wander once its history has seen it."""
    for s in range(6):
        without = _anomalies(Monitor(MonitorConfig(interval_s=15.0)), _windows(random.Random(s), 960, _wander))
        history = _anomalies(Monitor(MonitorConfig(interval_s=15.0, history_windows=160)),
                             _windows(random.Random(s), 960, _wander))
        assert sum(i >= 320 for i in without) >= 3, without
        assert all(i < 320 for i in history), history
    # a server twice as slow is still found at once against the longer normal
    for s in range(4):
        m = Monitor(MonitorConfig(interval_s=15.0, history_windows=160))
        found = _anomalies(m, _windows(random.Random(s), 420, lambda i: _wander(i) * (2.0 if i >= 400 else 1.0)))
        assert [i for i in found if i >= 400][:1] in ([400], [401], [402]), found


def _busy_host(usual_wait: bool, seed: int) -> Monitor:
    """A server learnt while it waited about 0.1 of each window, then judged through 200 windows at waits of
    0.3-0.45 (within max_wait_judged), its latency stretched by (1 / (1 - wait)) ** 1.2: the monitor's law,
    1 / (1 - wait), within its error (MonitorConfig.wait_law_error) but not exact."""
    m = Monitor(MonitorConfig(interval_s=15.0, history_windows=160, history_usual_wait=usual_wait))
    rng = random.Random(seed)
    assert _anomalies(m, _windows(rng, 240, lambda i: 1.0,
                                  lambda i: rng.uniform(0.08, 0.12) if i < 40 else rng.uniform(0.3, 0.45), 1.2)) == []
    return m


def test_a_busy_hosts_history_holds_only_the_windows_at_its_usual_wait() -> None:
    for seed in range(3):
        pooled, usual = _busy_host(False, seed), _busy_host(True, seed)
        b_pooled, b_usual = pooled.tracks["itl_ms_mean"].baseline, usual.tracks["itl_ms_mean"].baseline
        assert b_pooled is not None and b_usual is not None
        # at the usual wait only: learnt from the 40 windows at about 0.1 (ending before t = 600 s); pooled: from
        # 160 windows at three or four times that wait, its normal moved by the law's error there (+0.2 x their
        # stretch of 0.36-0.6 over the usual 0.1: +5-10 %, +7 % on seed 0), which then hides as much of a
        # slowdown at the usual wait
        assert max(usual._calm) < 600.0 and len(pooled._calm) == 160
        assert abs(b_usual.centre - math.log(8.0 / 0.9 ** 0.2)) < 0.03, b_usual
        assert b_pooled.centre - b_usual.centre > 0.04, (b_usual, b_pooled)


def test_the_history_is_the_agent_files_and_checked(tmp_path: Path) -> None:
    watch = {"url": "http://127.0.0.1:9/metrics", "interval_s": 15, "monitor": {"history_windows": 160}}
    spec = load_agent(agents.write_agent(tmp_path / "a.yaml", name="a", watch=watch)).spec
    assert spec.watch is not None and spec.watch.monitor is not None
    cfg = MonitorConfig.from_spec(spec.watch.monitor, 15.0)
    assert cfg.history_windows == 160 and cfg.history_usual_wait
    watch["monitor"] = {}
    spec = load_agent(agents.write_agent(tmp_path / "b.yaml", name="b", watch=watch)).spec
    assert spec.watch is not None and spec.watch.monitor is not None
    assert MonitorConfig.from_spec(spec.watch.monitor, 15.0).history_windows is None  # off unless asked for
    watch["monitor"] = {"history_windows": 10, "learn_windows": 20}
    with pytest.raises(ConfigError, match=r"c\.yaml[\s\S]*history_windows \(10\) must be at least learn_windows"):
        load_agent(agents.write_agent(tmp_path / "c.yaml", name="c", watch=watch))


def _config_of(tmp_path: Path, name: str, monitor: Mapping[str, object]) -> MonitorConfig:
    """The monitor's config of an agent file `name` whose watch (every 15 s) has `monitor` as its monitor."""
    watch = {"url": "http://127.0.0.1:9/metrics", "interval_s": 15, "monitor": dict(monitor)}
    spec = load_agent(agents.write_agent(tmp_path / f"{name}.yaml", name=name, watch=watch)).spec
    assert spec.watch is not None and spec.watch.monitor is not None
    return MonitorConfig.from_spec(spec.watch.monitor, 15.0)


def test_latencies_judged_at_the_hosts_speed_keep_the_longer_normal_unless_told(tmp_path: Path) -> None:
    """With host_speed_elasticity the history is on at 160 windows (at least learn_windows) unless the agent
    file names one, null included."""
    def cfg(name: str, monitor: Mapping[str, object]) -> MonitorConfig:
        return _config_of(tmp_path, name, monitor)

    probed = {"host_speed_probe": True, "host_speed_elasticity": 1.0}
    assert cfg("a", probed).history_windows == HOST_SPEED_HISTORY_WINDOWS == 160
    assert cfg("b", {**probed, "learn_windows": 200}).history_windows == 200
    assert cfg("c", {**probed, "history_windows": None}).history_windows is None
    assert cfg("d", {**probed, "history_windows": 40}).history_windows == 40
    assert cfg("e", {"host_speed_probe": True}).history_windows is None  # the probe recorded, not judged by


def test_latencies_judged_at_the_speed_of_the_servers_own_cpu_widen_over_a_cusums_horizon(tmp_path: Path) -> None:
    """With host_speed_elasticity and a probe that follows the server's processes (cpu_wait_source pid: or title:)
    the autocorrelation widens the latencies' scales over 3 windows unless the agent file names a horizon; an
    unpinned probe (no source, or a PSI file's) keeps the long-run scale."""
    def cfg(name: str, monitor: Mapping[str, object]) -> MonitorConfig:
        return _config_of(tmp_path, name, monitor)

    probed = {"host_speed_probe": True, "host_speed_elasticity": 1.0}
    own = {**probed, "cpu_wait_source": "title:EngineCore"}
    assert cfg("a", own).autocorrelation_horizon == OWN_PROBE_AUTOCORRELATION_HORIZON == 3
    assert cfg("b", {**probed, "cpu_wait_source": "pid:4242"}).autocorrelation_horizon == 3
    assert cfg("c", {**own, "autocorrelation_horizon": None}).autocorrelation_horizon is None
    assert cfg("d", {**own, "autocorrelation_horizon": 5}).autocorrelation_horizon == 5
    assert cfg("e", probed).autocorrelation_horizon is None  # unpinned
    assert cfg("f", {**probed, "cpu_wait_source": str(tmp_path / "cpu.pressure")}).autocorrelation_horizon is None
    assert cfg("g", {"host_speed_probe": True, "cpu_wait_source": "title:EngineCore"}).autocorrelation_horizon is None
    with pytest.raises(ConfigError, match=r"h\.yaml[\s\S]*autocorrelation_horizon"):
        cfg("h", {**own, "autocorrelation_horizon": 0})


def test_the_autocorrelation_is_estimated_again_from_the_history() -> None:
    """The host wanders slowly (an AR(1) of lag-1 0.9 on the latencies) through the first 80 windows, the first
    baseline's among them, and not after: with MonitorConfig.autocorrelation_history the baselines relearnt from
    the history take its autocorrelation from their own windows and their latencies' scale narrows to the noise;
    without, the first estimate keeps widening every relearnt one."""
    for s in range(3):
        rng = random.Random(100 + s)
        x, wander = 0.0, []
        for _ in range(80):
            x = 0.9 * x + rng.gauss(0, 0.05)
            wander.append(math.exp(x))

        def level(i: int, wander: list[float] = wander) -> float:
            return wander[i] if i < len(wander) else 1.0

        kept = Monitor(MonitorConfig(interval_s=15.0, history_windows=160))
        again = Monitor(MonitorConfig(interval_s=15.0, history_windows=160, autocorrelation_history=True))
        assert _anomalies(kept, _windows(random.Random(s), 240, level)) == []
        assert _anomalies(again, _windows(random.Random(s), 240, level)) == []
        b_kept, b_again = kept.tracks["itl_ms_mean"].baseline, again.tracks["itl_ms_mean"].baseline
        assert b_kept is not None and b_again is not None
        assert kept._rho > 0.3 and again._rho < 0.15, (kept._rho, again._rho)
        assert b_again.scale < 0.8 * b_kept.scale, (b_again.scale, b_kept.scale)
