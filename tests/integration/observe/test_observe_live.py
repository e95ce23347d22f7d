"""Observation of live traffic: `tuner bench` drives real reference-engine replicas (`tuner serve-engine`, tiny
preset, CPU) and the workload it sent is recovered from their /metrics and from a real Prometheus scraping both.
Bounds are generous (a busy 2-core host); experiments/observation/ measures the errors."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.support.prometheus import running_prometheus
from tests.support.thirdparty import Server, free_port, running
from tuner.cli.main import app
from tuner.errors import ObservationError
from tuner.observe import ObservedWorkload, observe_metrics, observe_prometheus

pytestmark = pytest.mark.process


def engine_argv(port: int) -> list[str]:
    return [sys.executable, "-m", "tuner.cli", "serve-engine", "--port", str(port), "--cpu-threads", "1",
            "--max-batch-size", "8", "--max-model-len", "512", "--kv-pool-mb", "32"]


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Server]]:
    d = tmp_path_factory.mktemp("engines")
    pa, pb = free_port(), free_port()
    with running(engine_argv(pa), port=pa, model="torch-engine-tiny", log=d / "a.log") as a, \
            running(engine_argv(pb), port=pb, model="torch-engine-tiny", log=d / "b.log") as b:
        yield [a, b]


def bench(url: str, out: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "tuner.cli", "bench", "--url", url, "--tokenizer", "byte",
                             "--json", str(out), *args], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def finished(proc: subprocess.Popen[bytes], out: Path) -> dict:
    assert proc.wait(180) == 0
    return json.loads(out.read_text())


def test_a_closed_loop_is_recovered_from_the_servers_metrics(engines: list[Server], tmp_path: Path) -> None:
    srv = engines[0]
    load = bench(srv.url, tmp_path / "b.json", "--concurrency", "3", "--duration-s", "14", "--prompt-tokens",
                 "120", "--output-tokens", "10")
    time.sleep(3)  # past the client's start-up
    obs = observe_metrics(srv.url + "/metrics", 8, interval_s=0.5)
    res = finished(load, tmp_path / "b.json")
    assert obs.source == f"metrics {srv.url}/metrics"
    wl = obs.workload
    assert wl.arrival.kind == "closed" and wl.arrival.concurrency == 3, obs.stats
    assert (wl.prompt_tokens.dist, wl.prompt_tokens.value) == ("fixed", 120)
    assert (wl.output_tokens.dist, wl.output_tokens.value) == ("fixed", 10)
    assert obs.stats["rate_per_s"] == pytest.approx(res["request_throughput"], rel=0.35)
    assert obs.stats["prefix_cache_hit_rate"] == 0  # the engine has no prefix cache, and says so


def test_prometheus_sums_the_replicas_and_names_missing_series(engines: list[Server], tmp_path: Path) -> None:
    targets = [srv.url.removeprefix("http://") for srv in engines]
    with running_prometheus(tmp_path / "prom", targets) as prom:
        prom.wait_scraped()
        t0 = time.time()
        runs = [bench(srv.url, tmp_path / f"b{i}.json", "--rate", str(rate), "--duration-s", "12",
                      "--prompt-tokens", "80", "--output-tokens", "8", "--seed", str(i))
                for i, (srv, rate) in enumerate(zip(engines, (2.0, 4.0), strict=True))]
        results = [finished(p, tmp_path / f"b{i}.json") for i, p in enumerate(runs)]
        time.sleep(3)  # two more scrapes
        end = time.time()
        window_s = end - t0
        obs = observe_prometheus(prom.url, window_s, end_s=end, selector='job="engine"')
        sent = sum(r["completed"] for r in results)
        assert obs.stats["requests"] == pytest.approx(sent, rel=0.15), obs.stats
        assert obs.stats["rate_per_s"] == pytest.approx(sent / window_s, rel=0.15)
        assert obs.workload.arrival.kind in ("poisson", "gamma"), obs.notes
        assert (obs.workload.prompt_tokens.dist, obs.workload.prompt_tokens.value) == ("fixed", 80)
        assert (obs.workload.output_tokens.dist, obs.workload.output_tokens.value) == ("fixed", 8)
        assert obs.fit_error["prompt_tokens_mean_rel_err"] < 0.02
        assert obs.source == f'prometheus {prom.url} {{job="engine"}}'

        with pytest.raises(ObservationError, match=r'vllm:request_success_total\{job="nope"\}'):
            observe_prometheus(prom.url, window_s, end_s=end, selector='job="nope"')
        out = tmp_path / "w.yaml"
        cli = CliRunner().invoke(app, ["observe", "--prometheus", prom.url, "--window-s", f"{window_s:.0f}",
                                       "--end", f"{end:.3f}", "--out", str(out)])
        assert cli.exit_code == 0, cli.output
        import yaml

        again = ObservedWorkload.from_dict(yaml.safe_load(out.read_text()))
        assert again.workload.prompt_tokens.value == 80 and again.stats["requests"] > 0
        bad = CliRunner().invoke(app, ["observe", "--prometheus", prom.url, "--window-s", "5", "--selector",
                                       "job=engine"])
        assert bad.exit_code == 2 and "expected label matchers" in bad.output


def test_a_stopped_window_still_needs_two_scrapes(engines: list[Server]) -> None:
    stop = threading.Event()
    stop.set()
    with pytest.raises(ObservationError, match="at least two scrapes"):
        observe_metrics(engines[1].url + "/metrics", 5, stop=stop)


def test_a_replayed_trace_is_sent_as_it_was(engines: list[Server], tmp_path: Path) -> None:
    from tuner.observe import observe_trace

    rows = [(0.0, 40, 4), (0.1, 90, 6), (0.15, 20, 3), (0.6, 150, 5), (1.2, 60, 8), (1.25, 75, 2)]
    src = tmp_path / "log.csv"
    src.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n" + "".join(
        f"{t},m,{p},{o},{p + o},API log\n" for t, p, o in rows))
    out = tmp_path / "replay" / "workload.yaml"
    out.parent.mkdir()
    observe_trace(src, replay=True).save(out)
    res = finished(bench(engines[1].url, tmp_path / "r.json", "--workload", str(out)), tmp_path / "r.json")
    assert res["completed"] == len(rows)
    assert [(p, o) for p, o in zip(res["input_lens"], res["output_lens"], strict=True)] == [(p, o) for _, p, o in rows]
    sent = [t - res["start_times"][0] for t in res["start_times"]]
    assert sent == pytest.approx([t for t, _, _ in rows], abs=0.25)  # the schedule kept on a busy host
