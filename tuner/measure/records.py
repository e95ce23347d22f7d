"""Per-request records: what the load generator (and the simulator) produce for each request."""

from __future__ import annotations

from dataclasses import dataclass, field

from tuner import catalog

# Error kinds, counted apart in the summary.
ERROR_KINDS = catalog.ERROR_KINDS  # each is also a metric: errors_<kind>


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

    `token_times_s` holds the arrival time of every streamed token, first token included (a chunk of k
    tokens counts k: see tuner.measure.stream). A request that was not streamed has no token times, and its
    TTFT, TPOT and ITL are not measured (None), never 0.
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
    streamed: bool = True
    chunks: int = 0  # streamed chunks that carried text
    multi_token_chunks: int = 0  # of those, chunks that carried several tokens (their gap was split)
    stream_end: str = ""  # "done" ([DONE] seen), "eof_after_finish" (no [DONE]), "" (not streamed or broken)
    requested_prompt_tokens: int | None = None  # what the client meant to send (prompt_tokens: the server's)
    server_prompt_tokens: int | None = None  # what the server reported in usage (None: not reported)
    generated_text: str | None = None  # kept only when asked (bench --json)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ttft_ms(self) -> float | None:
        if self.first_token_s is None or not self.streamed:
            return None
        return (self.first_token_s - self.sent_s) * 1000.0

    @property
    def e2el_ms(self) -> float:
        """To the last streamed token (as vllm bench serve: the usage chunk and [DONE] after it do not count),
        or to the end of the answer when not streamed."""
        end = self.token_times_s[-1] if self.streamed and self.token_times_s else self.done_s
        return (end - self.sent_s) * 1000.0

    @property
    def tpot_ms(self) -> float | None:
        """Per-request TPOT: (latency - ttft) / (output_tokens - 1), as vllm bench serve defines it."""
        ttft = self.ttft_ms
        if ttft is None or self.output_tokens <= 1:
            return None
        return (self.e2el_ms - ttft) / (self.output_tokens - 1)

    @property
    def itls_ms(self) -> list[float]:
        """Gaps between consecutive tokens (token-gap ITL; not vLLM's per-request TPOT)."""
        t = self.token_times_s
        return [(t[i] - t[i - 1]) * 1000.0 for i in range(1, len(t))]
