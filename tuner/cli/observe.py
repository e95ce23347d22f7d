"""`tuner observe`: the workload production serves, from a live /metrics, a Prometheus server or a trace file,
written as a WorkloadSpec with the observed statistics and the error of the fit (tuner.observe).

`register(app)` adds the command to a Typer app (tuner/cli/main.py calls it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from tuner.base.textfmt import fmt
from tuner.cli.common import console, err_console, fail
from tuner.errors import ConfigError, TunerError


def _table(title: str, values: dict[str, float]) -> Table:
    t = Table(title=title, title_justify="left", show_header=False)
    t.add_column("key")
    t.add_column("value", justify="right")
    for k, v in values.items():
        t.add_row(k, fmt(v))
    return t


def register(app: typer.Typer) -> None:
    """Add the `observe` command to `app`."""

    @app.command("observe")
    def observe(
        out: Annotated[Path | None, typer.Option("--out", help="Write the workload YAML here (a replay also "
                                                 "writes OUT's stem + .trace.jsonl next to it)")] = None,
        metrics: Annotated[str | None, typer.Option("--metrics", help="A live server's /metrics URL, scraped "
                                                    "for --window-s seconds", rich_help_panel="Source")] = None,
        prometheus: Annotated[str | None, typer.Option("--prometheus", help="A Prometheus server's base URL; "
                                                       "the --window-s seconds before now are queried",
                                                       rich_help_panel="Source")] = None,
        trace: Annotated[Path | None, typer.Option("--trace", help="A request log: Azure LLM trace CSV, "
                                                   "BurstGPT CSV, Mooncake JSONL or the tuner's trace JSONL",
                                                   rich_help_panel="Source")] = None,
        window_s: Annotated[float | None, typer.Option("--window-s", min=0.001, help="Window length (--metrics, "
                                                       "--prometheus)")] = None,
        interval_s: Annotated[float, typer.Option("--interval-s", min=0.01, help="--metrics: seconds between "
                                                  "scrapes")] = 1.0,
        selector: Annotated[str, typer.Option("--selector", help='--prometheus: label matchers of the servers, '
                                              'e.g. job="vllm" (matching replicas are summed)')] = "",
        end: Annotated[float | None, typer.Option("--end", help="--prometheus: the window's end, unix seconds "
                                                  "(default now)")] = None,
        step_s: Annotated[float | None, typer.Option("--step-s", min=0.001, help="--prometheus: resolution of "
                                                     "the gauges and burstiness (default window/60, >= 2 s)")]
        = None,
        trace_format: Annotated[str, typer.Option("--format", help="--trace: auto (from the header or keys), "
                                                  "azure, burstgpt, mooncake or tuner")] = "auto",
        replay: Annotated[bool, typer.Option("--replay", help="--trace: replay the exact arrivals and lengths "
                                             "instead of fitting distributions")] = False,
        limit: Annotated[int | None, typer.Option("--limit", min=1, help="--trace: the first N requests only")]
        = None,
        arrival: Annotated[str, typer.Option("--arrival", help="Arrival process: auto (closed loop when the "
                                             "requests in the server stay level, else by the burstiness), "
                                             "closed, poisson, gamma or constant")] = "auto",
        requests: Annotated[int | None, typer.Option("--requests", min=1, help="num_requests of the workload "
                                                     "(default: as many as the window saw)")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print the observation as JSON instead of "
                                              "tables")] = False,
    ) -> None:
        """Observe the workload a server serves; write it as a WorkloadSpec with the fit error.

        Exactly one source:

        --metrics URL --window-s N: a live vLLM or `tuner serve-engine`, scraped.

        --prometheus URL --window-s N [--selector ...]: the same series by PromQL.

        --trace FILE [--format ...] [--replay]: a request log, fitted or replayed.

        The --out file's `workload:` is an agent's workload (copy the mapping);
        `tuner bench --workload FILE` runs it. Its `observation:` holds the
        window, the source, the observed statistics and the fit error (relative
        error of the mean; largest gap of the cumulative distributions at the
        observed bucket bounds). A missing or malformed series is an error that
        names it.
        """
        from tuner.observe import observe_metrics, observe_prometheus, observe_trace

        try:
            given = [n for n, v in (("--metrics", metrics), ("--prometheus", prometheus), ("--trace", trace))
                     if v is not None]
            if len(given) != 1:
                raise ConfigError("give exactly one source: --metrics URL, --prometheus URL or --trace FILE"
                                  + (f" (got {', '.join(given)})" if given else ""))
            if trace is None and window_s is None:
                raise ConfigError(f"{given[0]} needs --window-s (how many seconds to observe)")
            if trace is not None and (window_s is not None or selector or end is not None):
                raise ConfigError("--trace takes no --window-s, --selector or --end (use --limit)")
            if trace is None and (replay or limit is not None or trace_format != "auto"):
                raise ConfigError("--replay, --limit and --format are for --trace")
            if metrics is not None:
                from tuner.cli.bench import check_url

                assert window_s is not None
                check_url(metrics, "--metrics")
                if not as_json:
                    err_console.print(f"observing for {window_s:g} s ...", highlight=False)
                obs = observe_metrics(metrics, window_s, interval_s=interval_s, arrival=arrival,
                                      num_requests=requests)
            elif prometheus is not None:
                from tuner.cli.bench import check_url

                assert window_s is not None
                check_url(prometheus, "--prometheus")
                obs = observe_prometheus(prometheus, window_s, selector=selector, end_s=end, step_s=step_s,
                                         arrival=arrival, num_requests=requests)
            else:
                assert trace is not None
                obs = observe_trace(trace, trace_format, replay=replay, arrival=arrival, limit=limit)
                if requests is not None:
                    obs.workload = obs.workload.model_copy(update={"num_requests": requests})
            written = obs.save(out) if out is not None else []
        except TunerError as exc:
            raise fail(exc) from None
        except OSError as exc:
            raise fail(ConfigError(f"--out {out}: cannot write: {exc.strerror or exc}")) from None
        if as_json:
            console.print_json(json.dumps(obs.to_dict(), default=str))
            return
        d = obs.to_dict()
        console.print(f"source {obs.source}, window {d['observation']['start']} .. {d['observation']['end']} "
                      f"({obs.window_s:.1f} s)", highlight=False, soft_wrap=True)
        console.print(_table("observed", obs.stats))
        if obs.fit_error:
            console.print(_table("fit error", obs.fit_error))
        a = obs.workload.arrival
        how = {"closed": f"closed loop, concurrency {a.concurrency}", "trace": "replay of the trace"}.get(
            a.kind, f"{a.kind} at {fmt(a.rate_per_s)} req/s" + (f", shape {fmt(a.burstiness)}"
                                                                 if a.kind == "gamma" else ""))
        console.print(f"workload: {how}; prompt {_dist(obs.workload.prompt_tokens)}; output "
                      f"{_dist(obs.workload.output_tokens)}; {obs.workload.num_requests} requests",
                      highlight=False, soft_wrap=True)
        for note in obs.notes:
            console.print(f"note: {note}", highlight=False, soft_wrap=True)
        for p in written:
            console.print(f"wrote {p}", highlight=False)


def _dist(d: object) -> str:
    from tuner.spec import LengthDist

    assert isinstance(d, LengthDist)
    body = {"fixed": f"{d.value}", "uniform": f"{d.low}..{d.high}", "normal": f"mean {d.mean} std {d.std}",
            "lognormal": f"mean {d.mean} sigma {d.sigma}"}[d.dist]
    return f"{d.dist} {body}"
