"""`tuner bench`: drive a workload against an OpenAI-compatible endpoint and print vllm-bench-serve metrics.

`register(app)` adds the command to a Typer app (tuner/cli/main.py calls it).
"""

from __future__ import annotations

import json
import logging
import math
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tuner.base.redact import redact_text, redact_url
from tuner.errors import ConfigError, TunerError
from tuner.measure import definitions
from tuner.measure.measurement import Measurement
from tuner.measure.metrics import GOODPUT_KEYS, LATENCY_METRICS, PERCENTILES, first_errors
from tuner.spec import Arrival, LengthDist, WorkloadSpec

log = logging.getLogger(__name__)


def parse_goodput(items: list[str]) -> dict[str, float]:
    """`ttft:200 tpot:50` (repeated flags, spaces or commas) -> {"ttft": 200.0, "tpot": 50.0}."""
    out: dict[str, float] = {}
    for item in items:
        for part in item.replace(",", " ").split():
            key, sep, val = part.partition(":")
            if not sep or key not in GOODPUT_KEYS:
                raise ConfigError(f"--goodput {part!r}: expected KEY:MS with KEY one of {', '.join(GOODPUT_KEYS)}")
            try:
                ms = float(val)
            except ValueError:
                raise ConfigError(f"--goodput {part!r}: {val!r} is not a number of milliseconds") from None
            if not ms > 0:
                raise ConfigError(f"--goodput {part!r}: the limit must be > 0 ms")
            out[key] = ms
    return out


def parse_extra_body(text: str) -> dict[str, Any]:
    """--extra-body: a JSON object."""
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"--extra-body: not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise ConfigError(f"--extra-body: must be a JSON object, got {type(body).__name__}")
    return body


def check_url(url: str, option: str = "--url") -> str:
    """An http(s) base URL with a host, no spaces or control characters, a valid port; else a ConfigError."""
    from urllib.parse import urlsplit

    if not url or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        raise ConfigError(f"{option} {redact_url(url)!r}: a URL may not contain spaces or control characters")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
    except ValueError as exc:
        raise ConfigError(f"{option} {redact_url(url)!r}: not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{option} {redact_url(url)!r}: must be an http:// or https:// URL with a host")
    return url


def first_model(url: str, timeout_s: float = 10.0) -> str:
    """The first model the server lists at /v1/models."""
    where = f"{redact_url(url.rstrip('/'))}/v1/models"
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=timeout_s) as r:
            data = json.loads(r.read())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--model not given and {where} gave no model: {redact_text(str(exc))}") from None
    models = data.get("data") if isinstance(data, dict) else None
    if not isinstance(models, list) or not models or not isinstance(models[0], dict) or "id" not in models[0]:
        raise ConfigError(f"--model not given and {where} did not list a model (expected "
                          f'{{"data": [{{"id": ...}}]}}, got {json.dumps(data)[:120]})')
    return str(models[0]["id"])


def load_workload(path: Path) -> WorkloadSpec:
    from tuner.base.yamlio import load_yaml, pydantic_to_config_error

    data, lines = load_yaml(path)
    prefix: tuple[str, ...] = ()
    if isinstance(data, dict) and "workload" in data and isinstance(data["workload"], dict):
        data, prefix = data["workload"], ("workload",)  # an agent spec: take its workload
    try:
        return WorkloadSpec.model_validate(data)
    except ValidationError as exc:
        raise pydantic_to_config_error(exc, str(path), lines, prefix=prefix) from None


def build_workload(base: WorkloadSpec | None, *, endpoint: str | None, concurrency: int | None,
                   rate: float | None, arrival: str, burstiness: float, requests: int | None,
                   duration_s: float | None, prompt_tokens: int | None, output_tokens: int | None,
                   warmup_requests: int | None, timeout_s: float | None, seed: int | None,
                   stream: bool | None = None, ignore_eos: bool | None = None,
                   extra_body: dict[str, Any] | None = None, prompt_format: str | None = None) -> WorkloadSpec:
    """The workload from the file (if any) with the command-line options on top."""
    if requests is not None and duration_s is not None:
        raise ConfigError("give --requests or --duration-s, not both")
    upd: dict[str, Any] = {}
    if rate is not None:  # open loop; with --concurrency too, that caps requests in flight (as vllm's)
        if arrival not in ("poisson", "constant", "gamma"):
            raise ConfigError(f"--arrival {arrival!r}: must be poisson, constant or gamma")
        upd["arrival"] = Arrival(kind=arrival, rate_per_s=rate, burstiness=burstiness,  # type: ignore[arg-type]
                                 concurrency=concurrency)
    elif concurrency is not None:
        upd["arrival"] = Arrival(kind="closed", concurrency=concurrency)
    if requests is not None:
        upd.update(num_requests=requests, duration_s=None)
    if duration_s is not None:
        upd.update(duration_s=duration_s, num_requests=None)
    if prompt_tokens is not None:
        upd["prompt_tokens"] = LengthDist(dist="fixed", value=prompt_tokens)
    if output_tokens is not None:
        upd["output_tokens"] = LengthDist(dist="fixed", value=output_tokens)
    for key, val in (("endpoint", endpoint), ("warmup_requests", warmup_requests), ("timeout_s", timeout_s),
                     ("seed", seed), ("stream", stream), ("ignore_eos", ignore_eos), ("extra_body", extra_body),
                     ("prompt_format", prompt_format)):
        if val is not None:
            upd[key] = val
    data = (base.model_dump() if base is not None else {"num_requests": 100})
    for k, v in upd.items():
        data[k] = v.model_dump() if hasattr(v, "model_dump") else v
    try:
        return WorkloadSpec.model_validate(data)
    except ValidationError as exc:
        e = exc.errors()[0]
        raise ConfigError(f"{'.'.join(str(x) for x in e['loc']) or 'workload'}: {e['msg']}") from None


_VLLM_INTS = ("completed", "failed", "total_input_tokens", "total_output_tokens", "max_concurrent_requests")


def _finite(v: Any) -> Any:
    """JSON has no NaN: a figure not measured is null."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def vllm_result(m: Measurement, *, url: str, model: str, workload: WorkloadSpec, tokenizer: str | None,
                goodput: dict[str, float]) -> dict[str, Any]:
    """A `vllm bench serve --save-result --save-detailed`-shaped dict, the tuner's own keys under `tuner`.

    Per-request lists are parallel to the measured requests, failed ones included (as vLLM's): a value not
    measured (a failed request's TTFT, any TTFT without streaming) is null, never 0."""
    a = workload.arrival
    recs = [r for r in m.records if not r.warmup]
    s = m.summary
    streamed = workload.stream
    out: dict[str, Any] = {
        "date": datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": "openai-chat" if workload.endpoint == "chat" else "openai",
        "backend": "openai-chat" if workload.endpoint == "chat" else "openai",
        "label": None, "model_id": model, "tokenizer_id": tokenizer,
        "num_prompts": len(recs),
        "request_rate": a.rate_per_s if a.rate_per_s is not None else "inf",
        "burstiness": a.burstiness,
        "max_concurrency": a.concurrency,
    }
    for key in ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                "request_throughput"):
        v = s.get(key, math.nan)
        out[key] = int(v) if key in _VLLM_INTS else _finite(v)
    out["request_goodput"] = _finite(s.get("request_goodput")) if goodput else None
    out["output_throughput"] = _finite(s.get("output_throughput"))
    out["total_token_throughput"] = _finite(s.get("total_token_throughput"))
    out["input_lens"] = [r.prompt_tokens for r in recs]
    out["output_lens"] = [r.output_tokens if r.ok else 0 for r in recs]
    out["ttfts"] = [(r.ttft_ms / 1000.0) if (r.ok and r.ttft_ms is not None) else None for r in recs]
    out["itls"] = [[x / 1000.0 for x in r.itls_ms] if (r.ok and streamed) else [] for r in recs]
    out["latencies"] = [r.e2el_ms / 1000.0 if r.ok else None for r in recs]
    out["start_times"] = [r.sent_s for r in recs]
    out["queue_times"] = [r.sent_s - r.scheduled_s for r in recs]
    out["generated_texts"] = [r.generated_text or "" for r in recs]
    out["errors"] = [f"{r.error}: {r.error_detail}" if not r.ok else "" for r in recs]
    out["max_output_tokens_per_s"] = _finite(s.get("max_output_tokens_per_s"))
    out["max_concurrent_requests"] = int(s.get("max_concurrent_requests", 0))
    out["rtfx"] = 0.0
    for metric in LATENCY_METRICS:
        for stat in ("mean", "median", "std"):
            out[f"{stat}_{metric}_ms"] = _finite(s.get(f"{stat}_{metric}_ms"))
        for p in PERCENTILES:
            out[f"p{p}_{metric}_ms"] = _finite(s.get(f"p{p}_{metric}_ms"))
    if a.concurrency is not None:  # vLLM reports the client-side queue only with --max-concurrency
        q = [(r.sent_s - r.scheduled_s) * 1000.0 for r in recs if r.ok]
        _stat_block(out, "client_queue_time", q)
        if a.rate_per_s is not None:
            _stat_block(out, "e2el_including_client_queue",
                        [r.e2el_ms + (r.sent_s - r.scheduled_s) * 1000.0 for r in recs if r.ok])
    vllm_keys = set(out) | {f"{st}_{mt}_ms" for mt in LATENCY_METRICS for st in ("mean", "median", "std")}
    errors = first_errors(recs)
    out["tuner"] = {k: _finite(v) for k, v in s.items() if k not in vllm_keys}
    out["tuner"].update({
        "request": {"url": url, "endpoint": workload.endpoint, "stream": streamed, "ignore_eos": workload.ignore_eos,
                    "prompt_format": workload.prompt_format, "extra_body": dict(workload.extra_body)},
        "definitions": definitions.as_json(),
        "prompt_lengths": dict(m.prompt_lengths),
        "clock_origin_s": m.clock_origin_s,  # start_times + this = time.perf_counter(), as vLLM's start_times
        "not_measured": [] if streamed else ["ttft", "tpot", "itl"],
        "error_details": {k: {"count": n, "first_detail": d} for k, (n, d) in errors.items()},
        "scheduled_times": [r.scheduled_s for r in recs],
        "stream_ends": [r.stream_end for r in recs],
        "chunks": [r.chunks for r in recs],
        "multi_token_chunks": [r.multi_token_chunks for r in recs],
        "telemetry": m.telemetry,
        "notes": list(m.notes),
    })
    return out


def _stat_block(out: dict[str, Any], name: str, values_ms: list[float]) -> None:
    arr = np.asarray(values_ms, dtype=float)
    ok = arr.size > 0
    out[f"mean_{name}_ms"] = float(arr.mean()) if ok else None
    out[f"median_{name}_ms"] = float(np.median(arr)) if ok else None
    out[f"std_{name}_ms"] = float(arr.std()) if ok else None
    for p in PERCENTILES:
        out[f"p{p}_{name}_ms"] = float(np.percentile(arr, p)) if ok else None


# (what a refusal's message mentions, the option that leaves it out)
_HINTS = (("ignore_eos", "the server refuses ignore_eos: pass --no-ignore-eos (workload ignore_eos: false)"),
          ("stream_options", 'the server refuses stream_options: --extra-body \'{"stream_options": null}\''),
          ("max_completion_tokens", 'the server refuses max_completion_tokens: use --endpoint completions'))


def error_lines(m: Measurement, workload: WorkloadSpec | None = None) -> list[str]:
    """One line per error kind: how many, and the first one's detail (the server's message); then a hint
    when the message names a field the client sent that can be left out."""
    errors = first_errors(m.records)
    lines = [f"errors: {kind} {n} (first: {detail or 'no detail'})" for kind, (n, detail) in sorted(errors.items())]
    refused = " ".join(d for k, (_, d) in errors.items() if k == "http_4xx")
    for word, hint in _HINTS:
        if word in refused:
            lines.append(f"hint: {hint}")
    if refused and workload is not None and workload.prompt_format == "token_ids" and "prompt" in refused:
        lines.append("hint: the server may take text prompts only: --prompt-format text")
    return lines


def summary_table(m: Measurement) -> Table:
    s = m.summary
    t = Table(title="Serving benchmark result", show_header=True)
    t.add_column("metric")
    t.add_column("value", justify="right")

    def row(label: str, key: str, fmt: str = "{:.2f}") -> None:
        v = s.get(key)
        if v is not None and not (isinstance(v, float) and math.isnan(v)):
            t.add_row(label, fmt.format(v))

    row("Successful requests", "completed", "{:.0f}")
    row("Failed requests", "failed", "{:.0f}")
    for kind, (n, _) in sorted(first_errors(m.records).items()):
        t.add_row(f"  errors: {kind}", str(n))
    row("Benchmark duration (s)", "duration")
    row("Total input tokens", "total_input_tokens", "{:.0f}")
    row("Total generated tokens", "total_output_tokens", "{:.0f}")
    row("Request throughput (req/s)", "request_throughput")
    row("Request goodput (req/s)", "request_goodput")
    row("Output token throughput (tok/s)", "output_throughput")
    row("Total token throughput (tok/s)", "total_token_throughput")
    row("Peak output tokens/s", "max_output_tokens_per_s", "{:.0f}")
    row("Peak concurrent requests", "max_concurrent_requests", "{:.0f}")
    streamed = s.get("streamed", 1.0) >= 1.0
    for metric, label in (("ttft", "TTFT"), ("tpot", "TPOT (per request)"), ("itl", "ITL (token gaps)"),
                          ("e2el", "E2EL")):
        if not streamed and metric != "e2el":
            t.add_row(f"{label} (ms)", "not measured (stream off)")
            continue
        row(f"Mean {label} (ms)", f"mean_{metric}_ms")
        row(f"Median {label} (ms)", f"median_{metric}_ms")
        row(f"P99 {label} (ms)", f"p99_{metric}_ms")
    for k, v in sorted(m.telemetry.items()):
        t.add_row(k, f"{v:.4g}")
    return t


def prompt_length_line(info: dict[str, Any]) -> str:
    """How the prompt lengths were made, and how far the server's counts were from the asked ones."""
    line = f"prompt lengths: {info.get('method', 'unknown')}"
    if info.get("probes"):
        line += f" ({info['probes']} probes)"
    if info.get("counted_by_server"):
        line += (f"; asked {info['asked_median']:.0f} tokens (median), the server counted "
                 f"{info['server_median']:.0f}, {info['within_2pct_frac'] * 100:.0f}% of requests within 2%")
    return line


def register(app: typer.Typer) -> None:
    """Add the `bench` command to `app`."""

    @app.command("bench")
    def bench(
        url: Annotated[str, typer.Option("--url", help="Base URL of the server, e.g. http://127.0.0.1:8000")],
        model: Annotated[str | None, typer.Option("--model", help="Model name (default: first of /v1/models)")]
        = None,
        endpoint: Annotated[str | None, typer.Option("--endpoint", help="completions or chat")] = None,
        concurrency: Annotated[int | None, typer.Option(
            "--concurrency", min=1, help="Closed loop: requests in flight (with --rate: the cap on them)")] = None,
        rate: Annotated[float | None, typer.Option("--rate", min=0.0, help="Open loop: requests per second")]
        = None,
        arrival: Annotated[str, typer.Option("--arrival", help="Open-loop process: poisson, constant, gamma")]
        = "poisson",
        burstiness: Annotated[float, typer.Option("--burstiness", help="Gamma shape (1 = Poisson)")] = 1.0,
        requests: Annotated[int | None, typer.Option("--requests", min=1, help="Measured requests")] = None,
        duration_s: Annotated[float | None, typer.Option("--duration-s", help="Measured seconds")] = None,
        prompt_tokens: Annotated[int | None, typer.Option("--prompt-tokens", min=1)] = None,
        output_tokens: Annotated[int | None, typer.Option("--output-tokens", min=1)] = None,
        warmup_requests: Annotated[int | None, typer.Option("--warmup-requests", min=0)] = None,
        timeout_s: Annotated[float | None, typer.Option("--timeout-s", help="Per-request timeout")] = None,
        workload_file: Annotated[Path | None, typer.Option("--workload", help="Workload YAML (WorkloadSpec, "
                                                           "or an agent spec's workload)")] = None,
        tokenizer: Annotated[str | None, typer.Option("--tokenizer", help="byte, or a local HF tokenizer dir "
                                                      "(default: prompts fitted to the asked lengths with the "
                                                      "server's /tokenize or its usage counts; approx: not "
                                                      "fitted)")] = None,
        metrics_url: Annotated[str | None, typer.Option("--metrics-url", help="Prometheus /metrics to scrape")]
        = None,
        gpus: Annotated[str | None, typer.Option("--gpus", help="GPU indices to sample, e.g. 0,1")] = None,
        goodput: Annotated[list[str] | None, typer.Option("--goodput", help="SLO for goodput, KEY:MS "
                                                          "(ttft, tpot, e2el); repeat or comma-separate")]
        = None,
        seed: Annotated[int | None, typer.Option("--seed")] = None,
        stream: Annotated[bool | None, typer.Option("--stream/--no-stream", help="Stream the answers (default: "
                                                    "on; off measures only end-to-end latency)")] = None,
        ignore_eos: Annotated[bool | None, typer.Option(
            "--ignore-eos/--no-ignore-eos",
            help="Send ignore_eos (default: auto, sent unless the server refuses the field)")] = None,
        extra_body: Annotated[str | None, typer.Option("--extra-body", help="JSON object merged into every "
                                                       "request body (a null value removes a field)")] = None,
        prompt_format: Annotated[str | None, typer.Option("--prompt-format", help="text (default) or token_ids "
                                                          "(completions, with --tokenizer)")] = None,
        json_path: Annotated[Path | None, typer.Option("--json", help="Write the vllm-compatible result here")]
        = None,
    ) -> None:
        """Benchmark an OpenAI-compatible endpoint (vllm bench serve metrics)."""
        from tuner.measure.loadgen import measure_endpoint

        console = Console(emoji=False)
        err = Console(stderr=True, emoji=False)
        try:
            if endpoint is not None and endpoint not in ("completions", "chat"):
                raise ConfigError(f"--endpoint {endpoint!r}: must be completions or chat")
            if prompt_format is not None and prompt_format not in ("text", "token_ids"):
                raise ConfigError(f"--prompt-format {prompt_format!r}: must be text or token_ids")
            body = parse_extra_body(extra_body) if extra_body is not None else None
            base = load_workload(workload_file) if workload_file is not None else None
            w = build_workload(base, endpoint=endpoint, concurrency=concurrency, rate=rate, arrival=arrival,
                               burstiness=burstiness, requests=requests, duration_s=duration_s,
                               prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                               warmup_requests=warmup_requests, timeout_s=timeout_s, seed=seed, stream=stream,
                               ignore_eos=ignore_eos, extra_body=body, prompt_format=prompt_format)
            check_url(url)
            if metrics_url is not None:
                check_url(metrics_url, "--metrics-url")
            gp = parse_goodput(goodput or [])
            if not w.stream and set(gp) & {"ttft", "tpot"}:
                raise ConfigError(f"--goodput {sorted(set(gp) & {'ttft', 'tpot'})[0]}: not measured without "
                                  "streaming (use e2el, or --stream)")
            gpu_idx = [int(x) for x in gpus.split(",") if x.strip()] if gpus else []
            name = model or first_model(url)
            unit = "requests" if w.num_requests is not None else "s"
            with Progress(TextColumn("[bold]bench[/]"), BarColumn(), MofNCompleteColumn(),
                          TextColumn(unit), TimeElapsedColumn(), console=err, transient=True) as bar:
                task = bar.add_task("bench", total=None)

                def progress(done: int, total: int) -> None:
                    bar.update(task, completed=done, total=total)

                m = measure_endpoint(url, model=name, workload=w, goodput_ms=gp, seed=w.seed,
                                     base_dir=workload_file.parent if workload_file else Path.cwd(),
                                     tokenizer=tokenizer, metrics_url=metrics_url, gpu_indices=gpu_idx,
                                     progress=progress, keep_text=json_path is not None,
                                     fit_prompt_lengths=True)
        except (TunerError, ValueError) as exc:
            err.print(f"[bold red]error:[/] {escape(redact_text(str(exc)))}", highlight=False, soft_wrap=True)
            raise typer.Exit(exc.exit_code if isinstance(exc, TunerError) else 2) from None
        except Exception as exc:  # noqa: BLE001 - one line, never a traceback (-v logs it)
            log.debug("bench failed", exc_info=True)
            err.print(f"[bold red]error:[/] {type(exc).__name__}: {escape(redact_text(str(exc)))}", highlight=False,
                      soft_wrap=True)
            raise typer.Exit(1) from None
        console.print(summary_table(m))
        for line in error_lines(m, w):
            console.print(line, highlight=False, soft_wrap=True)
        for note in m.notes:
            console.print(f"note: {note}", highlight=False)
        console.print(prompt_length_line(m.prompt_lengths), highlight=False, soft_wrap=True)
        if json_path is not None:
            res = vllm_result(m, url=redact_url(url), model=name, workload=w, tokenizer=tokenizer, goodput=gp)
            json_path.parent.mkdir(parents=True, exist_ok=True)
            json_path.write_text(json.dumps(res, indent=1, default=str) + "\n")
            console.print(f"wrote {json_path}")
        if m.summary.get("completed", 0) == 0:
            raise typer.Exit(1)
