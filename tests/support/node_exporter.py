"""A real node_exporter (Debian's prometheus-node-exporter, 1.5) on 127.0.0.1: the host's CPU counters as a
fleet's Prometheus holds them.

`running_node_exporter(dir)` starts it with only its cpu collector (node_cpu_seconds_total by mode, this host's
/proc/stat) and yields its host:port once /metrics answers. A missing binary skips the test, except under CI
(CI=true), where .ci/run installs the package and a missing one is a failure.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.sysprog import debian_program, group_process
from tuner.base.proc import free_port

NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"


@contextmanager
def running_node_exporter(workdir: Path, timeout_s: float = 60.0) -> Iterator[str]:
    exe = debian_program(NODE_EXPORTER, "prometheus-node-exporter", "prometheus-node-exporter")
    workdir.mkdir(parents=True, exist_ok=True)
    target = f"127.0.0.1:{free_port()}"
    argv = [exe, f"--web.listen-address={target}", "--collector.disable-defaults", "--collector.cpu",
            "--log.level=warn"]
    with group_process(argv, workdir / "node_exporter.log", lambda: _ready(target), timeout_s=timeout_s):
        yield target


def _ready(target: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{target}/metrics", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False
