"""Review: a daemon that cannot start says what to fix and does not keep the state dir's daemon lock."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from tests.support import agents
from tuner.daemon.scheduler import run_daemon, single_instance
from tuner.errors import ConfigError


def write_agent(d: Path, file: str, name: str, schedule: dict[str, str] | None = None) -> Path:
    return agents.write_agent(d / f"{file}.yaml", name=name, schedule=schedule or {"every": "1h"},
                              at={"workload.arrival.concurrency": 8, "workload.num_requests": 20})


def lock_is_free(sd: Path) -> bool:
    try:
        f = single_instance(sd)
    except ConfigError:
        return False
    with contextlib.closing(f):
        return True


def test_bad_cron_is_a_config_error_naming_the_field(tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "a", "cron-agent", schedule={"cron": "99 * * * *"})
    sd = tmp_path / "state"
    with pytest.raises(ConfigError) as ei:
        run_daemon([agent], sd, install_signals=False)
    assert "schedule.cron" in str(ei.value) and "99 * * * *" in str(ei.value)
    assert lock_is_free(sd)


def test_duplicate_names_leave_the_daemon_lock_free(tmp_path: Path) -> None:
    a = write_agent(tmp_path, "a", "same")
    b = write_agent(tmp_path, "b", "same")
    sd = tmp_path / "state"
    with pytest.raises(ConfigError) as ei:
        run_daemon([a, b], sd, install_signals=False)
    assert "same" in str(ei.value)
    assert lock_is_free(sd)


def test_tuned_prompt_mean_of_a_dataset_workload_is_the_datasets(tmp_path: Path) -> None:
    import json

    from tuner.daemon.watch import tuned_prompt_mean
    from tuner.measure.datasets import load_dataset
    from tuner.measure.tokenize import load_tokenizer
    from tuner.spec import WorkloadSpec

    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": "lorem ipsum dolor " * (200 + 40 * i), "output_len": 32}) + "\n"
                            for i in range(5)))
    wl = WorkloadSpec.model_validate({"dataset": "prompts.jsonl", "num_requests": 50})
    samples = load_dataset(data, load_tokenizer(None))
    dataset_mean = sum(s.prompt_tokens for s in samples) / len(samples)
    assert dataset_mean > 2 * 256  # far from the synthetic default the dataset replaces
    tuned = tuned_prompt_mean(wl, base_dir=tmp_path)
    assert abs(tuned - dataset_mean) / dataset_mean < 0.3


def test_the_watcher_survives_a_failing_check(tmp_path: Path) -> None:
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tuner.daemon.metrics import DaemonMetrics
    from tuner.daemon.runtime import AgentState, Runtime
    from tuner.daemon.watch import watch_loop
    from tuner.spec import AgentSpec

    scrapes = {"n": 0}

    class Prod(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server API
            scrapes["n"] += 1
            n = 10 * scrapes["n"]
            body = (f"# TYPE vllm:prompt_tokens counter\nvllm:prompt_tokens_total {n * 256}\n"
                    f"# TYPE vllm:request_success counter\nvllm:request_success_total {n}\n").encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Prod)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    spec = AgentSpec.model_validate({
        "name": "w", "target": {"kind": "sim"}, "search_space": {"params": {}},
        "workload": {"dataset": "gone.jsonl", "num_requests": 20},  # removed since the daemon started
        "objectives": [{"metric": "output_throughput", "direction": "maximize"}],
        "watch": {"url": f"http://127.0.0.1:{srv.server_address[1]}/metrics", "interval_s": 0.05, "window_s": 1},
    })
    rt = Runtime(state_dir=tmp_path, stop=threading.Event(), agents={}, locks={}, metrics=DaemonMetrics(),
                 grace_s=1.0)
    done = threading.Event()
    t = threading.Thread(target=watch_loop, args=(rt, AgentState("w", tmp_path / "w.yaml"), spec, done),
                         daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 10
        while scrapes["n"] < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert scrapes["n"] >= 6 and t.is_alive()  # it kept watching after the failed checks
    finally:
        done.set()
        t.join(5)
        srv.shutdown()
