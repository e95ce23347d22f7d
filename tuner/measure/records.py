"""Per-request records: what the load generator (and the simulator) produce for each request."""

from __future__ import annotations

from dataclasses import dataclass, field

# Error kinds, counted apart in the summary.
ERROR_KINDS = ("connect", "timeout", "http_4xx", "http_5xx", "overload_503", "stream_broken", "rejected")


@dataclass(frozen=True, slots=True)
class RequestPlan:
    """One request to send: when (seconds from the run's start) and what."""

    index: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prompt: str | list[int] | None = None  # text or token ids; None lets the sender synthesise one
    task: str = "generation"
    warmup: bool = False
    priority: int = 0


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What happened to one request. Times are seconds from the run's start (monotonic clock).

    `token_times_s` holds the arrival time of every streamed token (or chunk), first token included.
    """

    index: int
    scheduled_s: float
    sent_s: float
    first_token_s: float | None
    done_s: float
    prompt_tokens: int
    output_tokens: int
    token_times_s: tuple[float, ...] = field(default=())
    status: int | None = 200
    error: str | None = None  # one of ERROR_KINDS, None when ok
    error_detail: str = ""
    warmup: bool = False
    prompt_tokens_exact: bool = True

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ttft_ms(self) -> float | None:
        if self.first_token_s is None:
            return None
        return (self.first_token_s - self.sent_s) * 1000.0

    @property
    def e2el_ms(self) -> float:
        return (self.done_s - self.sent_s) * 1000.0

    @property
    def tpot_ms(self) -> float | None:
        """(latency - ttft) / (output_tokens - 1), as vllm bench serve defines it."""
        ttft = self.ttft_ms
        if ttft is None or self.output_tokens <= 1:
            return None
        return (self.e2el_ms - ttft) / (self.output_tokens - 1)

    @property
    def itls_ms(self) -> list[float]:
        t = self.token_times_s
        return [(t[i] - t[i - 1]) * 1000.0 for i in range(1, len(t))]
