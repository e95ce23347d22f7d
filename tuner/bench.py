"""`tuner bench`: drive a workload against an OpenAI-compatible endpoint and print vllm-bench-serve metrics.

`register(app)` adds the command to a Typer app (tuner/cli.py calls it).
"""

from __future__ import annotations

import json
import math
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tuner.errors import ConfigError, TunerError
from tuner.measure.measurement import Measurement
from tuner.measure.metrics import GOODPUT_KEYS, LATENCY_METRICS, PERCENTILES
from tuner.spec import Arrival, LengthDist, WorkloadSpec


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


def first_model(url: str, timeout_s: float = 10.0) -> str:
    """The first model the server lists at /v1/models."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=timeout_s) as r:
            data = json.loads(r.read())
        return str(data["data"][0]["id"])
    except (OSError, ValueError, KeyError, IndexError) as exc:
        raise ConfigError(f"--model not given and {url}/v1/models gave no model: {exc}") from None


def load_workload(path: Path) -> WorkloadSpec:
    from tuner.yamlio import load_yaml, pydantic_to_config_error

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
                   warmup_requests: int | None, timeout_s: float | None, seed: int | None) -> WorkloadSpec:
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
                     ("seed", seed)):
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


def vllm_result(m: Measurement, *, url: str, model: str, workload: WorkloadSpec, tokenizer: str | None,
                goodput: dict[str, float]) -> dict[str, Any]:
    """A `vllm bench serve --save-result --save-detailed`-compatible dict (plus the tuner's extra keys)."""
    a = workload.arrival
    recs = [r for r in m.records if not r.warmup]
    ok = [r for r in recs if r.ok]
    s = m.summary
    out: dict[str, Any] = {
        "date": datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S"),
        "backend": "openai-chat" if workload.endpoint == "chat" else "openai",
        "endpoint_type": "openai-chat" if workload.endpoint == "chat" else "openai",
        "label": None, "base_url": url, "model_id": model, "tokenizer_id": tokenizer,
        "num_prompts": len(recs),
        "request_rate": a.rate_per_s if a.rate_per_s is not None else "inf",
        "burstiness": a.burstiness,
        "max_concurrency": a.concurrency,
    }
    for key in ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                "request_throughput", "output_throughput", "total_token_throughput", "max_output_tokens_per_s",
                "max_concurrent_requests"):
        v = s.get(key, math.nan)
        out[key] = int(v) if key in ("completed", "failed", "total_input_tokens", "total_output_tokens",
                                     "max_concurrent_requests") else v
    out["request_goodput"] = s.get("request_goodput") if goodput else None
    for metric in LATENCY_METRICS:
        for stat in ("mean", "median", "std"):
            out[f"{stat}_{metric}_ms"] = s.get(f"{stat}_{metric}_ms")
        for p in PERCENTILES:
            out[f"p{p}_{metric}_ms"] = s.get(f"p{p}_{metric}_ms")
    out["input_lens"] = [r.prompt_tokens for r in ok]
    out["output_lens"] = [r.output_tokens for r in ok]
    out["ttfts"] = [((r.ttft_ms or 0.0) / 1000.0) for r in ok]
    out["itls"] = [[x / 1000.0 for x in r.itls_ms] for r in ok]
    out["latencies"] = [r.e2el_ms / 1000.0 for r in ok]
    out["start_times"] = [r.sent_s for r in ok]
    out["errors"] = [f"{r.error}: {r.error_detail}" for r in recs if not r.ok]
    out["tuner"] = {k: v for k, v in s.items() if isinstance(v, float) and math.isfinite(v)}
    out["telemetry"] = m.telemetry
    out["notes"] = list(m.notes)
    return out


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
    for kind in ("connect", "timeout", "http_4xx", "http_5xx", "overload_503", "stream_broken"):
        if s.get(f"errors_{kind}", 0) > 0:
            row(f"  errors: {kind}", f"errors_{kind}", "{:.0f}")
    row("Benchmark duration (s)", "duration")
    row("Total input tokens", "total_input_tokens", "{:.0f}")
    row("Total generated tokens", "total_output_tokens", "{:.0f}")
    row("Request throughput (req/s)", "request_throughput")
    row("Request goodput (req/s)", "request_goodput")
    row("Output token throughput (tok/s)", "output_throughput")
    row("Total token throughput (tok/s)", "total_token_throughput")
    row("Peak output tokens/s", "max_output_tokens_per_s", "{:.0f}")
    row("Peak concurrent requests", "max_concurrent_requests", "{:.0f}")
    for metric, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2EL")):
        row(f"Mean {label} (ms)", f"mean_{metric}_ms")
        row(f"Median {label} (ms)", f"median_{metric}_ms")
        row(f"P99 {label} (ms)", f"p99_{metric}_ms")
    for k, v in sorted(m.telemetry.items()):
        t.add_row(k, f"{v:.4g}")
    return t


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
                                                      "(default: approximate prompt lengths)")] = None,
        metrics_url: Annotated[str | None, typer.Option("--metrics-url", help="Prometheus /metrics to scrape")]
        = None,
        gpus: Annotated[str | None, typer.Option("--gpus", help="GPU indices to sample, e.g. 0,1")] = None,
        goodput: Annotated[list[str] | None, typer.Option("--goodput", help="SLO for goodput, KEY:MS "
                                                          "(ttft, tpot, e2el); repeat or comma-separate")]
        = None,
        seed: Annotated[int | None, typer.Option("--seed")] = None,
        json_path: Annotated[Path | None, typer.Option("--json", help="Write the vllm-compatible result here")]
        = None,
    ) -> None:
        """Benchmark an OpenAI-compatible endpoint (vllm bench serve metrics)."""
        from tuner.measure.loadgen import measure_endpoint

        console = Console()
        err = Console(stderr=True)
        try:
            if endpoint is not None and endpoint not in ("completions", "chat"):
                raise ConfigError(f"--endpoint {endpoint!r}: must be completions or chat")
            base = load_workload(workload_file) if workload_file is not None else None
            w = build_workload(base, endpoint=endpoint, concurrency=concurrency, rate=rate, arrival=arrival,
                               burstiness=burstiness, requests=requests, duration_s=duration_s,
                               prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                               warmup_requests=warmup_requests, timeout_s=timeout_s, seed=seed)
            gp = parse_goodput(goodput or [])
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
                                     progress=progress)
        except (TunerError, ValueError) as exc:
            err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(exc.exit_code if isinstance(exc, TunerError) else 2) from None
        console.print(summary_table(m))
        for note in m.notes:
            console.print(f"note: {note}", highlight=False)
        if json_path is not None:
            res = vllm_result(m, url=url, model=name, workload=w, tokenizer=tokenizer, goodput=gp)
            json_path.parent.mkdir(parents=True, exist_ok=True)
            json_path.write_text(json.dumps(res, indent=1, default=str) + "\n")
            console.print(f"wrote {json_path}")
        if m.summary.get("completed", 0) == 0:
            raise typer.Exit(1)
