"""The host's CPU steal through a fleet's path, against software nobody here wrote: a real node_exporter (1.5)
exports this host's CPU seconds, a real Prometheus (2.42) scrapes it, and CpuSteal reads the steal and runnable
seconds back through Prometheus' HTTP API: the same counters /proc/stat gives directly."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.support.node_exporter import running_node_exporter
from tests.support.prometheus import running_prometheus
from tuner.monitor.contention import MAX_WAIT_FRAC, CpuSteal, proc_stat_steal
from tuner.monitor.telemetry import node_steal_reading

pytestmark = pytest.mark.process


def test_the_hosts_steal_through_node_exporter_and_prometheus(tmp_path: Path) -> None:
    ticks = os.sysconf("SC_CLK_TCK")  # /proc/stat counts USER_HZ ticks, node_exporter seconds
    with running_node_exporter(tmp_path / "node") as target, \
            running_prometheus(tmp_path / "prom", [target], scrape_interval_s=1.0) as prom:
        prom.wait_scraped()
        first = node_steal_reading(prom.url, f'instance="{target}"')
        direct = proc_stat_steal(Path("/proc/stat").read_text())
        assert first is not None and direct is not None
        # Prometheus' sample is the same counters read up to a few scrapes ago: never ahead, a little behind
        steal_s, runnable_s = direct[0] / ticks, direct[1] / ticks
        assert steal_s - 30 <= first[0] <= steal_s + 0.05
        assert runnable_s - 30 * (os.cpu_count() or 1) <= first[1] <= runnable_s + 0.05
        assert 0 < first[1] and first[0] <= first[1]

        steal = CpuSteal(prom.url, f'instance="{target}"')
        assert steal.read() == {}  # the first read opens the window
        opened = node_steal_reading(prom.url, f'instance="{target}"')
        assert opened is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until Prometheus holds a newer sample of the counters
            sum(i * i for i in range(100_000))
            now = node_steal_reading(prom.url, f'instance="{target}"')
            if now is not None and now[1] > opened[1]:
                break
            time.sleep(0.2)
        got = steal.read()
        assert set(got) == {"cpu_steal_frac"} and 0.0 <= got["cpu_steal_frac"] <= MAX_WAIT_FRAC

        nowhere = CpuSteal(prom.url, 'instance="nowhere:1"')  # a selector that matches no host
        assert nowhere.read() == {} and nowhere.read() == {} and len(nowhere.missing.named) == 1
