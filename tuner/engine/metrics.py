"""The reference engine's Prometheus metrics, on a private registry.

Series that mean what vLLM's mean carry vLLM's names (the tuner's scraper reads them the same way from either
server): the queue, KV usage, TTFT/ITL/end-to-end and queue-time histograms, the prompt and generation
length histograms per finished request (vLLM's 1-2-5 buckets up to the context length), token counters (as
vLLM counts them: a prompt's tokens at its admission, its prefill; generated tokens per step), preemptions and
prefix-cache queries/hits. The engine pre-allocates one KV slot per running sequence and has no prefix cache, so
it never preempts and never hits: those counters stay at 0 and say so. The engine's own series are prefixed
`tuner_engine_`. No `_created` series.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

from tuner.engine.engine import EngineStats

disable_created_metrics()

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
               0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
               50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
# vLLM's request-length buckets (vllm/v1/metrics/loggers.py build_1_2_5_buckets(max_model_len)): 1, 2, 5, 10, ...
TOKEN_BUCKETS = tuple(float(m * 10**e) for e in range(6) for m in (1, 2, 5))
QUEUE_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                 120.0, 300.0, 600.0)


class PromStats(EngineStats):
    """The engine's metrics in a private Prometheus registry."""

    def __init__(self, model_name: str, max_model_len: int | None = None) -> None:
        self.registry = CollectorRegistry()
        lab = ["model_name"]
        r = self.registry
        self.running = Gauge("vllm:num_requests_running", "Requests in the running batch", lab, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled", lab, registry=r)
        self.kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache pool usage, fraction 0-1", lab, registry=r)
        self.ttft_h = Histogram("vllm:time_to_first_token_seconds", "Time to first token", lab,
                                buckets=TTFT_BUCKETS, registry=r)
        self.itl_h = Histogram("vllm:inter_token_latency_seconds", "Inter-token latency", lab,
                               buckets=ITL_BUCKETS, registry=r)
        self.e2e_h = Histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency", lab,
                               buckets=E2E_BUCKETS, registry=r)
        self.queue_h = Histogram("vllm:request_queue_time_seconds", "Time a request waited for a KV slot", lab,
                                 buckets=QUEUE_BUCKETS, registry=r)
        len_buckets = tuple(b for b in TOKEN_BUCKETS if max_model_len is None or b <= max_model_len)
        self.prompt_len_h = Histogram("vllm:request_prompt_tokens", "Prompt tokens per finished request", lab,
                                      buckets=len_buckets, registry=r)
        self.gen_len_h = Histogram("vllm:request_generation_tokens", "Generated tokens per finished request", lab,
                                   buckets=len_buckets, registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prefill tokens processed", lab, registry=r)
        self.gen_tokens = Counter("vllm:generation_tokens", "Generation tokens produced", lab, registry=r)
        self.success = Counter("vllm:request_success", "Finished requests", ["model_name", "finished_reason"],
                               registry=r)
        self.preemptions = Counter("vllm:num_preemptions", "Preemptions (never: one KV slot per running "
                                   "sequence is reserved at admission)", lab, registry=r)
        self.prefix_queries = Counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix "
                                      "cache", lab, registry=r)
        self.prefix_hits = Counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache (none: "
                                   "the engine has no prefix cache)", lab, registry=r)
        self.aborted_reqs = Counter("tuner_engine_aborted_requests", "Sequences aborted before they finished "
                                    "(their client went away)", lab, registry=r)
        self.phase = Gauge("tuner_engine_startup_phase_seconds", "Seconds spent in each start-up phase",
                           ["model_name", "phase"], registry=r)
        self.ready = Gauge("tuner_engine_ready", "1 once the engine serves", lab, registry=r)
        self.model_name = model_name
        for c in (self.preemptions, self.prefix_queries, self.prefix_hits, self.aborted_reqs):
            c.labels(model_name)  # exported at 0 from the start, as vLLM does

    def queue(self, running: int, waiting: int, kv_usage: float) -> None:
        self.running.labels(self.model_name).set(running)
        self.waiting.labels(self.model_name).set(waiting)
        self.kv.labels(self.model_name).set(kv_usage)

    def admitted(self, req: Any, queue_s: float) -> None:
        self.queue_h.labels(self.model_name).observe(max(0.0, queue_s))
        self.prefix_queries.labels(self.model_name).inc(len(req.prompt))
        self.prompt_tokens.labels(self.model_name).inc(len(req.prompt))  # at its prefill, as vLLM counts them

    def ttft(self, seconds: float) -> None:
        self.ttft_h.labels(self.model_name).observe(seconds)

    def itl(self, seconds: float) -> None:
        self.itl_h.labels(self.model_name).observe(seconds)

    def generated(self, tokens: int) -> None:
        """Tokens made by one step, counted as they are made (vLLM's generation_tokens), not at the end."""
        self.gen_tokens.labels(self.model_name).inc(tokens)

    def finished(self, req: Any, reason: str, e2e_s: float) -> None:
        self.e2e_h.labels(self.model_name).observe(e2e_s)
        self.prompt_len_h.labels(self.model_name).observe(len(req.prompt))
        self.gen_len_h.labels(self.model_name).observe(req.emitted)
        self.success.labels(self.model_name, reason).inc()

    def aborted(self, req: Any) -> None:
        self.aborted_reqs.labels(self.model_name).inc()
