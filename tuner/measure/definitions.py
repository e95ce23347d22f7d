"""What each latency the tuner reports is, and what vLLM's, guidellm's and aiperf's benchmarks call it.

The same word means different things in different tools: aiperf's "inter_token_latency" is vLLM's TPOT,
guidellm's "time_per_output_token" includes the TTFT, and vLLM's ITL is a gap between streamed chunks (the
tuner splits a chunk of k tokens into k gaps). `tuner bench --json` carries this table (`tuner.definitions`),
and docs/metrics.md prints it (`markdown()`), so a figure is compared with the one that means the same.
Sources: vLLM's benchmarks (vllm/benchmarks/serve.py and lib/endpoint_request_func.py), guidellm 0.8's
GenerativeRequestStats and aiperf's metrics reference.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Definition:
    tuner: str  # the summary key stem (mean_/median_/pNN_<tuner>_ms)
    meaning: str
    vllm: str  # `vllm bench serve` --save-result key stem, or what comes closest
    guidellm: str
    aiperf: str


DEFINITIONS: tuple[Definition, ...] = (
    Definition(
        tuner="ttft",
        meaning="per request: from sending the request to the first streamed chunk with a choice, its text "
                "empty or not (a token whose bytes do not decode yet streams as empty text); a chat chunk with "
                "only the role does not count (not measured without streaming)",
        vllm="ttft (the same: the first chunk with a choice, empty text included)",
        guidellm="time_to_first_token (its first token iteration)",
        aiperf="time_to_first_token (skips responses with empty content: later when the first chunk is empty)",
    ),
    Definition(
        tuner="tpot",
        meaning="per request: (e2el - ttft) / (output_tokens - 1), output tokens from usage",
        vllm="tpot (the same)",
        guidellm="inter_token_latency (the same, to the last token rather than the end of the answer); NOT "
                 "guidellm's time_per_output_token, which is (last token - start) / output_tokens and includes "
                 "the TTFT",
        aiperf="inter_token_latency (the same)",
    ),
    Definition(
        tuner="itl",
        meaning="every gap between consecutive tokens over all requests; a chunk of k tokens has its gap split "
                "into k equal gaps (equal to vLLM's ITL when every chunk holds one token)",
        vllm="itl (gaps between chunks, a multi-token chunk is one gap)",
        guidellm="none (its inter_token_latency is the per-request TPOT above)",
        aiperf="inter_chunk_latency (gaps between chunks)",
    ),
    Definition(
        tuner="e2el",
        meaning="per request: from sending the request to the last streamed token chunk (the usage chunk and "
                "[DONE] after it do not count), or to the end of the answer when not streamed",
        vllm="e2el (the same)",
        guidellm="request_latency (the same)",
        aiperf="request_latency (the same)",
    ),
)


def as_json() -> dict[str, dict[str, str]]:
    """The table keyed by the tuner's name (for `tuner bench --json`)."""
    return {d.tuner: {k: v for k, v in asdict(d).items() if k != "tuner"} for d in DEFINITIONS}


def markdown() -> str:
    """The table as Markdown (docs/metrics.md holds its output)."""
    rows = ["| tuner | what it is | vLLM (`vllm bench serve`) | guidellm | aiperf |", "|---|---|---|---|---|"]
    for d in DEFINITIONS:
        rows.append(f"| `{d.tuner}` | {d.meaning} | {d.vllm} | {d.guidellm} | {d.aiperf} |")
    return "\n".join(rows) + "\n"
