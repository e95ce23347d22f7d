"""Watch: production /metrics breaking an SLO or drifting in prompt length starts a cycle now."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.support.agents import write_agent
from tests.support.logged_proc import finish, output, start_logged
from tests.support.vllm_series import VllmSeries
from tuner.daemon.watch import detect_anomalies
from tuner.measure.scrape import parse
from tuner.spec import AgentSpec

REPO = Path(__file__).resolve().parents[3]
BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def metrics_text(n: int, ttft_s: float, prompt_tokens: int) -> str:
    """vLLM-style exposition after n requests that all had TTFT ttft_s and prompt_tokens tokens."""
    lines = ["# TYPE vllm:time_to_first_token_seconds histogram"]
    for le in BUCKETS:
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{le="{le}",model_name="m"}} {n if ttft_s <= le else 0}')
    lines += [f'vllm:time_to_first_token_seconds_bucket{{le="+Inf",model_name="m"}} {n}',
              f'vllm:time_to_first_token_seconds_sum{{model_name="m"}} {n * ttft_s}',
              f'vllm:time_to_first_token_seconds_count{{model_name="m"}} {n}',
              "# TYPE vllm:prompt_tokens counter", f'vllm:prompt_tokens_total{{model_name="m"}} {n * prompt_tokens}',
              "# TYPE vllm:request_success counter",
              f'vllm:request_success_total{{finished_reason="stop",model_name="m"}} {n}']
    return "\n".join(lines) + "\n"


SPEC = {
    "name": "w", "target": {"kind": "sim"}, "search_space": {"params": {}},
    "workload": {"prompt_tokens": {"dist": "fixed", "value": 256}, "num_requests": 20},
    "objectives": [{"metric": "output_throughput", "direction": "maximize"}],
    "slos": [{"metric": "ttft_ms.p99", "max": 500}],
    "watch": {"url": "http://127.0.0.1:1/metrics", "interval_s": 0.3, "window_s": 2, "drift_threshold": 0.3},
}


def test_detect_slo_breach_and_prompt_drift() -> None:
    spec = AgentSpec.model_validate(SPEC)
    calm = detect_anomalies(spec, parse(metrics_text(10, 0.2, 256)), parse(metrics_text(30, 0.2, 256)))
    assert calm == []
    slow = detect_anomalies(spec, parse(metrics_text(10, 0.2, 256)), _mixed(10, 0.2, 20, 2.0, 256))
    assert [k for k, _ in slow] == ["slo"]
    drift = detect_anomalies(spec, parse(metrics_text(10, 0.2, 256)), _mixed(10, 0.2, 20, 0.2, 256, 600))
    assert [k for k, _ in drift] == ["drift"]


def test_prompt_drift_is_of_the_requests_finished_not_the_prompts_prefilled() -> None:
    # vLLM counts a prompt's tokens at its prefill: long prompts started in the window and not finished are no
    # drift of the requests served (its per-request histogram); once they finish, they are
    spec = AgentSpec.model_validate(SPEC)
    s = VllmSeries()
    s.finish(10, 256, 16)
    before = parse(s.text())
    s.finish(10, 256, 16)
    s.start(10, 1000, 4)
    assert detect_anomalies(spec, before, parse(s.text())) == []
    before = parse(s.text())
    s.finish(10, 1000, 16)
    assert [k for k, _ in detect_anomalies(spec, before, parse(s.text()))] == ["drift"]


def _mixed(n1: int, t1: float, n2: int, t2: float, p1: int, p2: int | None = None):
    """A snapshot after n1 requests like (t1, p1) and then n2 more like (t2, p2)."""
    a, b = parse(metrics_text(n1, t1, p1)), parse(metrics_text(n2, t2, p2 or p1))
    for key, h in b.hists.items():
        ha = a.hists[key]
        for le, c in h.buckets.items():
            ha.buckets[le] = ha.buckets.get(le, 0) + c
        ha.sum += h.sum
        ha.count += h.count
    for key, v in b.counters.items():
        a.counters[key] = a.counters.get(key, 0) + v
    return a


class _Prod:
    """A fake production server whose TTFT turns bad after `bad_after` scrapes."""

    def __init__(self, bad_after: int) -> None:
        self.scrapes = 0
        self.bad_after = bad_after
        self.n_good = 0
        self.n_bad = 0
        prod = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                prod.scrapes += 1
                if prod.scrapes > prod.bad_after:
                    prod.n_bad += 20
                else:
                    prod.n_good += 20
                snap = metrics_text(prod.n_good, 0.2, 256) if prod.n_bad == 0 else _text_mixed(prod)
                body = snap.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: object) -> None:
                pass

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/metrics"


def _text_mixed(prod: _Prod) -> str:
    lines = ["# TYPE vllm:time_to_first_token_seconds histogram"]
    n = prod.n_good + prod.n_bad
    for le in BUCKETS:
        c = (prod.n_good if 0.2 <= le else 0) + (prod.n_bad if 3.0 <= le else 0)
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{le="{le}"}} {c}')
    lines += [f'vllm:time_to_first_token_seconds_bucket{{le="+Inf"}} {n}',
              f"vllm:time_to_first_token_seconds_sum {prod.n_good * 0.2 + prod.n_bad * 3.0}",
              f"vllm:time_to_first_token_seconds_count {n}"]
    return "\n".join(lines) + "\n"


def test_an_slo_breach_in_production_starts_a_cycle_now(tmp_path: Path) -> None:
    prod = _Prod(bad_after=8)
    agent = tmp_path / "watched.yaml"
    write_agent(agent, name="watched", tracking={"enabled": False}, slos=[{"metric": "ttft_ms.p99", "max": 1000}],
                search_space={"params": {"max_num_seqs": {"type": "int", "low": 8, "high": 512, "log": True,
                                                          "default": 16}}},
                schedule={"every": "1h", "trials_per_cycle": 1},
                watch={"url": prod.url, "interval_s": 0.3, "window_s": 1.5}, sampler=None,
                at={"workload.arrival.concurrency": 16, "workload.output_tokens.value": 32,
                    "workload.num_requests": 40})
    sd = tmp_path / "state"
    log = tmp_path / "daemon.log"
    proc = start_logged([sys.executable, "-m", "tuner.cli", "daemon", str(agent), "--state-dir", str(sd),
                         "--port", "-1"], log, REPO)
    cyc = sd / "watched" / "cycles.jsonl"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, output(log)
            if cyc.is_file() and len(cyc.read_text().splitlines()) >= 2:
                break
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out = finish(proc, log, 30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        prod.srv.shutdown()
    lines = [json.loads(x) for x in cyc.read_text().splitlines()]
    # the first cycle runs at start; the second (1 h schedule) only because production broke its SLO
    assert len(lines) >= 2, out[-3000:]
    anomalies = [json.loads(x) for x in (sd / "watched" / "anomalies.jsonl").read_text().splitlines()]
    assert anomalies and anomalies[0]["anomalies"][0]["kind"] == "slo"
    assert lines[1]["start_time"] >= anomalies[0]["time"] - 1
