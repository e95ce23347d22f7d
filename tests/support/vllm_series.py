"""vLLM's production series (names as vLLM 0.32 exports them) on a private prometheus_client registry, moved by
the test: requests finished with their lengths and latencies, the queue gauges. For the monitor's tests.

As vLLM does, the token counters count a prompt when it is prefilled and an output token when it is made
(`start()`: a request prefilled and partly generated, not finished), the per-request length histograms and
request_success when it finishes."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class VllmSeries:
    """One server's series; `finish()` adds finished requests, `text()` is its /metrics."""

    def __init__(self, histograms: bool = True, e2e: bool = False) -> None:
        """`e2e`: the end-to-end latency histogram too (each request's TTFT plus its inter-token latencies)."""
        r = self.registry = CollectorRegistry()
        lab = ["model_name"]
        self.running = Gauge("vllm:num_requests_running", "", lab, registry=r).labels("m")
        self.waiting = Gauge("vllm:num_requests_waiting", "", lab, registry=r).labels("m")
        self.kv = Gauge("vllm:kv_cache_usage_perc", "", lab, registry=r).labels("m")
        self.prompt = Counter("vllm:prompt_tokens", "", lab, registry=r).labels("m")
        self.gen = Counter("vllm:generation_tokens", "", lab, registry=r).labels("m")
        self.ok = Counter("vllm:request_success", "", ["model_name", "finished_reason"], registry=r)
        self.pre = Counter("vllm:num_preemptions", "", lab, registry=r).labels("m")
        self.ttft = self.itl = self.prompt_h = self.gen_h = self.e2e = None
        if e2e:
            self.e2e = Histogram("vllm:e2e_request_latency_seconds", "", lab, registry=r,
                                 buckets=(0.1, 0.5, 1.0, 5.0)).labels("m")
        if histograms:
            self.prompt_h = Histogram("vllm:request_prompt_tokens", "", lab, registry=r,
                                      buckets=(1, 10, 100, 1000, 10000)).labels("m")
            self.gen_h = Histogram("vllm:request_generation_tokens", "", lab, registry=r,
                                   buckets=(1, 10, 100, 1000, 10000)).labels("m")
            self.ttft = Histogram("vllm:time_to_first_token_seconds", "", lab, registry=r,
                                  buckets=(0.01, 0.05, 0.1, 0.5, 1.0)).labels("m")
            self.itl = Histogram("vllm:inter_token_latency_seconds", "", lab, registry=r,
                                 buckets=(0.005, 0.01, 0.02, 0.05)).labels("m")

    def finish(self, n: int, prompt: int, out: int, ttft_s: float = 0.04, itl_s: float = 0.008,
               reason: str = "length") -> None:
        for _ in range(n):
            self.prompt.inc(prompt)
            self.gen.inc(out)
            self.ok.labels("m", reason).inc()
            if self.prompt_h is not None and self.gen_h is not None:
                self.prompt_h.observe(prompt)
                self.gen_h.observe(out)
            if self.ttft is not None and self.itl is not None:
                self.ttft.observe(ttft_s)
                for _ in range(out - 1):
                    self.itl.observe(itl_s)
            if self.e2e is not None:
                self.e2e.observe(ttft_s + (out - 1) * itl_s)

    def start(self, n: int, prompt: int, out_so_far: int) -> None:
        """`n` requests prefilled and `out_so_far` tokens into their outputs, none finished: vLLM's token counters
        move, its request counters and length histograms do not."""
        self.prompt.inc(n * prompt)
        self.gen.inc(n * out_so_far)

    def text(self) -> str:
        return generate_latest(self.registry).decode()
