"""A real Prometheus (Debian's /usr/bin/prometheus, 2.42) on 127.0.0.1 for the observation tests and experiment.

`running_prometheus(dir, ["127.0.0.1:PORT", ...])` writes a configuration scraping those targets' /metrics every
`scrape_interval_s` (one job, `engine`), starts Prometheus with its storage in `dir`, waits until it is ready and
ends it afterwards; `Prom.wait_scraped()` waits until every target has been scraped successfully. A missing
binary skips the test, except under CI (CI=true), where .ci/run installs the package and a missing one is a
failure. No pytest import at module level: experiments/observation/ uses it as a plain script.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.sysprog import debian_program, group_process, log_tail
from tuner.base.proc import free_port

PROMETHEUS = "/usr/bin/prometheus"


def prometheus_binary() -> str:
    """The prometheus program, or skip (fail under CI) saying how to install it."""
    return debian_program(PROMETHEUS, "prometheus", "prometheus")


@dataclass
class Prom:
    url: str
    log: Path
    proc: subprocess.Popen[bytes]
    targets: tuple[str, ...]

    def log_tail(self, n: int = 3000) -> str:
        return log_tail(self.log, n)

    def query(self, promql: str) -> list[dict]:
        q = urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{q}", timeout=10) as r:
            return list(json.loads(r.read())["data"]["result"])

    def wait_scraped(self, timeout_s: float = 60.0, series: str = "up") -> None:
        """Until `series` (default: `up`) has a sample of value 1 for every target."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            res = self.query(series)
            up = {r["metric"].get("instance") for r in res if float(r["value"][1]) >= 1}
            if set(self.targets) <= up:
                return
            time.sleep(0.5)
        raise RuntimeError(f"Prometheus did not scrape {self.targets} within {timeout_s} s:\n{self.log_tail()}")


def config_text(targets: Sequence[str], scrape_interval_s: float) -> str:
    listed = ", ".join(f"'{t}'" for t in targets)
    return (f"global:\n  scrape_interval: {scrape_interval_s:g}s\n  evaluation_interval: {scrape_interval_s:g}s\n"
            "scrape_configs:\n  - job_name: engine\n    metrics_path: /metrics\n"
            f"    static_configs:\n      - targets: [{listed}]\n")


@contextmanager
def running_prometheus(workdir: Path, targets: Sequence[str], *, scrape_interval_s: float = 1.0,
                       timeout_s: float = 60.0) -> Iterator[Prom]:
    """Start Prometheus scraping `targets` (host:port each); yield it once /-/ready answers."""
    exe = prometheus_binary()
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = workdir / "prometheus.yml"
    cfg.write_text(config_text(targets, scrape_interval_s))
    port = free_port()
    log = workdir / "prometheus.log"
    argv = [exe, f"--config.file={cfg}", f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
    url = f"http://127.0.0.1:{port}"
    with group_process(argv, log, lambda: _ready(url), timeout_s=timeout_s, poll_s=0.2) as proc:
        yield Prom(url=url, log=log, proc=proc, targets=tuple(targets))


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/-/ready", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False
