"""The `tuner` command line. Thin: parse, call, print; maps TunerError to one line and an exit code."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from tuner.base.redact import redact_text
from tuner.base.textfmt import fmt
from tuner.cli import bench
from tuner.cli import fleet as cli_fleet
from tuner.cli import observe as cli_observe
from tuner.cli import ops as cli_ops
from tuner.cli import scenarios as cli_scenarios
from tuner.cli.common import AgentArg, StateDirOpt, _install_stop_handlers, app, console, err_console, fail
from tuner.engine import cli as engine_cli
from tuner.errors import TunerError
from tuner.report import cli as report_cli


# ---------------------------------------------------------------- run
@app.command()
def run(
    agent_path: AgentArg = None,
    trials: Annotated[int | None, typer.Option("--trials", "-n", min=1,
                                               help="Trials in this cycle (default: the agent's budget).")] = None,
    state_dir: StateDirOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="No progress: one JSON object (the cycle's trials, "
                                          "the baseline and the best) on stdout at the end.")] = False,
) -> None:
    """Run one cycle of tuning: baseline first, then Optuna's proposals, each deployed and measured.

    A workload with rate_per_s: auto is sized on the baseline first (once per study). Exit status: 0 when the
    study has a feasible trial, 3 when it has none (the nearest misses are printed), 2 for invalid input,
    4 when an auto rate could not be sized, 5 when the cycle stopped early because the baseline and the next
    two trials failed with one cause of the environment and one error (a port taken, a binary missing, a
    client error): the budget is not spent on a run that cannot tell anything."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tuner.context import open_context
    from tuner.loop import TrialOutcome, run_cycle
    from tuner.tracking.tracker import safe_url

    try:
        ctx = open_context(agent_path, state_dir)
        session = ctx.session(plan=True)  # the study the lineage names (as the daemon's cycles)
        sd = ctx.state_dir
        spec = ctx.agent.spec
        n = trials or (spec.budget.trials or 0)
        stop = threading.Event()
        _install_stop_handlers(stop)
        if not as_json:
            console.print(f"[bold]{spec.name}[/]: target [cyan]{spec.target.kind}[/], {n or 'unbounded'} "
                          f"trial(s), state in {sd}")
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.fields[last]}"), console=console if not as_json else err_console,
                      transient=False, disable=as_json) as progress:
            task = progress.add_task("trials", total=n or None, last="")

            def on_trial(o: TrialOutcome) -> None:
                if o.cause:
                    last = f"#{o.number}: {o.cause}"
                elif o.pruned:
                    last = f"#{o.number}: pruned"
                else:
                    last = f"#{o.number}: {spec.objectives[0].metric}={fmt(o.values[0])}" + (
                        "" if o.feasible else " (violates SLO)")
                progress.update(task, advance=1, last=last)

            def on_sizing_step(step: Any, runs: int) -> None:
                from tuner.study.sizing import step_line

                progress.console.print(step_line(step, runs), highlight=False)

            result = run_cycle(session, trials=trials, stop_event=stop, on_trial=on_trial,
                               on_sizing_step=on_sizing_step)
        from tuner.study.summary import EXIT_ENVIRONMENT, EXIT_NO_FEASIBLE, run_summary

        feasible = bool(session.study.best())
        if as_json:
            _print_run_json(session, result)
            if result.environment_stop:
                raise typer.Exit(EXIT_ENVIRONMENT)
            if not feasible:
                raise typer.Exit(EXIT_NO_FEASIBLE)
            return
        _print_best(session)
        for line in run_summary(session.study.trials(), session.agent.spec, feasible=feasible,
                                cycle_outcomes=result.outcomes):
            console.print(line, highlight=False, soft_wrap=True)
        if result.interrupted:
            console.print("[yellow]stopped early: the running trial was recorded as interrupted[/]")
        if result.environment_stop:
            console.print(f"[red]{result.environment_stop}[/]", highlight=False, soft_wrap=True)
        if result.run_id:
            console.print(f"MLflow: experiment [cyan]{session.tracker.experiment_name}[/], "
                          f"cycle run {result.run_id} ({safe_url(session.tracker.uri)}); `tuner ui` to browse")
    except TunerError as exc:
        raise fail(exc) from None
    if result.environment_stop:
        raise typer.Exit(EXIT_ENVIRONMENT)
    if not feasible:
        raise typer.Exit(EXIT_NO_FEASIBLE)


def _print_run_json(session: Any, result: Any) -> None:
    from tuner.study.study import trial_summary

    study = session.study
    out = {"agent": session.agent.name, "study": study.name, "cycle": result.cycle, "run_id": result.run_id,
           "interrupted": result.interrupted, "wall_s": round(result.wall_s, 3),
           "environment_stop": result.environment_stop,
           "trials": [{"number": o.number, "params": o.params, "values": o.values if o.cause is None else None,
                       "feasible": o.feasible, "cause": o.cause, "error": o.error, "metrics": o.metrics,
                       "duration_s": round(o.duration_s, 3), "pruned": o.pruned, "capacity_search": o.capacity}
                      for o in result.outcomes],
           "baseline": trial_summary(study.baseline()), "best": [trial_summary(t) for t in study.best()]}
    typer.echo(json.dumps(out, default=str))


def _print_best(session: Any) -> None:
    study = session.study
    spec = session.agent.spec
    base = study.baseline()
    best = study.best()
    table = Table(title=f"baseline and best feasible trial(s) of {study.name}")
    table.add_column("trial", justify="right")
    for o in spec.objectives:
        table.add_column(f"{o.metric} ({o.direction[:3]})", justify="right")
    table.add_column("vs baseline", justify="right")
    table.add_column("params (changed from the baseline)")
    from tuner.study.objectives import improvement

    rows = ([base] if base else []) + [b for b in best if not base or b.number != base.number]
    noise = study.noise_report()
    from tuner.study.study import same_as_baseline

    for t in rows[:8]:
        vs = ""
        base_measured = base is not None and base.values and "cause" not in base.user_attrs
        if base_measured and t.values and t is not base:
            if same_as_baseline(t, base):
                vs = "none (the baseline's configuration)"
            else:
                vs = f"{improvement(t.values[0], base.values[0], spec.objectives[0].direction):+.1%}"
                if noise and noise.get("within_noise") and noise.get("best", {}).get("number") == t.number:
                    vs += " (within the noise)"
        label = f"{t.number}{' (baseline)' if t.user_attrs.get('baseline') else ''}"
        if base is not None and t is not base:  # only what differs from the baseline
            params = ", ".join(f"{k}={v}" for k, v in t.params.items() if base.params.get(k) != v)
        else:
            params = "defaults"
        if "cause" in t.user_attrs:  # a failed baseline: its values are the study's placeholders
            table.add_row(label, *["-" for _ in t.values], vs, f"{params} (failed: {t.user_attrs['cause']})")
        else:
            table.add_row(label, *[fmt(v) for v in t.values], vs, params)
    from tuner.study.sizing import recorded

    sizing = recorded(study)
    if sizing is not None:
        table.caption = f"workload rate {sizing.describe()}"
    elif isinstance(spec.workload.arrival.rate_per_s, float):
        table.caption = f"workload rate {spec.workload.arrival.rate_per_s:.3g} req/s (fixed by the agent)"
    if not best:
        console.print("[yellow]no feasible trial yet (every trial failed or broke an SLO)[/]")
    console.print(table)
    _print_noise(noise)


def _print_noise(noise: dict[str, Any] | None) -> None:
    """The best with its interval, and whether its gain over the baseline is within the noise."""
    if noise is None:
        return
    if noise["cv"] is None:
        console.print("noise: not estimated yet (no trial measured twice)")
        return
    pct = int(round(noise["confidence"] * 100))
    line = f"noise: run-to-run CV {noise['cv']:.1%} from {noise['repeated_trials']} repeated trial(s)"
    if "best" in noise:
        b = noise["best"]
        line += (f"; best trial {b['number']}: {b['mean']:.4g} over {b['n']} run(s), "
                 f"{pct}% interval [{b['low']:.4g}, {b['high']:.4g}]")
    console.print(line)
    if noise.get("within_noise"):
        console.print("[yellow]the best's gain over the baseline is within the noise (their intervals "
                      "overlap): the A/B verification decides[/]")


# ---------------------------------------------------------------- validate
@app.command()
def validate(
    agent_paths: Annotated[list[Path], typer.Argument(help="Agent spec YAML files.", show_default=False)],
    show_command: Annotated[bool, typer.Option("--show-command",
                                               help="Print the argv and environment of the baseline trial.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per file: ok, or the error.")] = False,
) -> None:
    """Validate agent specs and everything `run` checks before its first trial (the target's check of the space
    and of its command template, the schedule): exit 0, or exit 2 with the located error. Opens no store."""
    from tuner.agent import load_agent, preflight
    from tuner.daemon.scheduler import check_schedule

    for p in agent_paths:
        try:
            agent = load_agent(p)
            preflight(agent)
            check_schedule(agent)
            if show_command and not as_json:
                from tuner.agent import show_command as _show

                console.print(_show(agent), highlight=False, soft_wrap=True)
        except TunerError as exc:
            if as_json:
                typer.echo(json.dumps({"file": str(p), "ok": False, "error": str(exc),
                                       "field": getattr(exc, "field", None), "line": getattr(exc, "line", None)}))
                raise typer.Exit(exc.exit_code) from None
            raise fail(exc) from None
        if as_json:
            typer.echo(json.dumps({"file": str(p), "ok": True, "agent": agent.name,
                                   "target": agent.spec.target.kind, "parameters": len(agent.space.params),
                                   "constraints": len(agent.space.constraints)}))
            continue
        console.print(f"[green]ok[/] {p}: agent {agent.name!r}, target {agent.spec.target.kind}, "
                      f"{len(agent.space.params)} parameter(s), {len(agent.space.constraints)} constraint(s)")


# ---------------------------------------------------------------- metrics
@app.command()
def metrics() -> None:
    """The metric catalog: every metric an objective or an SLO may name."""
    from tuner import catalog

    stats = "|".join(catalog.LATENCY_STATS)
    table = Table(title=f"metrics (a latency takes a statistic: NAME.<{stats}>)")
    table.add_column("metric", no_wrap=True)
    for col in ("unit", "better", "source", "what"):
        table.add_column(col)
    for m in [*catalog.CATALOG.values(), *catalog.FAMILIES.values()]:
        table.add_row(f"{m.name}.<stat>" if m.latency else m.name, m.unit, m.better, m.source,
                      m.doc + (" (needs a latency SLO)" if m.needs_latency_slo else ""))
    console.print(table)


# ---------------------------------------------------------------- status
@app.command()
def status(
    agent_path: AgentArg = None,
    state_dir: StateDirOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Trial counts, the baseline, the best feasible trial(s), the champion and any pending candidate."""
    from tuner.context import open_context
    from tuner.promotion.audit import champion_summary, pending_summary
    from tuner.study.study import trial_summary

    try:
        ctx = open_context(agent_path, state_dir, create=False)  # reads only: creates no store
        agent, sd = ctx.agent, ctx.state_dir
        study = ctx.read_study()
        if study is None and agent.spec.scenarios:  # the study of the scenario in service
            from tuner.scenarios.table import scenario_study

            ctx.study_name = scenario_study(agent, sd) or ctx.study_name
            study = ctx.read_study()
        counts = study.counts() if study is not None else dict.fromkeys(
            ("COMPLETE", "FEASIBLE", "INFEASIBLE", "FAIL", "RUNNING", "WAITING", "PRUNED"), 0)
        if study is not None:
            study.reap_stale()  # a trial whose worker went away (on any host) is shown failed, not running
        data: dict[str, Any] = {
            "agent": agent.name,
            "study": ctx.study_name,
            "trials": counts,
            "baseline": trial_summary(study.baseline()) if study else None,
            "best": [trial_summary(t) for t in study.best()] if study else [],
            "champion": None,
            "pending": None,
            "last_cycle": study.study.user_attrs.get("last_cycle") if study else None,
            "workload_rate": study.study.user_attrs.get("workload_rate") if study else None,
        }
        if ctx.has_state() or study is not None:
            from tuner.champions.db import champion_store_for

            store = champion_store_for(agent, sd, study)  # in the shared database for a fleet
            data["champion"] = champion_summary(sd, agent.name, store)
            data["pending"] = pending_summary(sd, agent.name, store)
            from tuner.scenarios.table import scenario_rows

            data["scenarios"] = scenario_rows(agent, sd)
    except TunerError as exc:
        raise fail(exc) from None
    if as_json:
        console.print_json(json.dumps(data, default=str))
        return
    from tuner.cli.status_view import print_status

    if study is None:
        console.print(f"[bold]{agent.name}[/]: no study {ctx.study_name!r} in {redact_text(ctx.storage_url)} yet "
                      "(`tuner run` starts one)", highlight=False)

    print_status(console, data)


# ---------------------------------------------------------------- ui
@app.command()
def ui(
    state_dir: StateDirOpt = None,
    port: Annotated[int, typer.Option(help="Port of the MLflow UI.")] = 5000,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    workers: Annotated[int, typer.Option(min=1, help="MLflow server worker processes.")] = 2,
) -> None:
    """Start the MLflow UI on the tuner's tracking store; print its URL once it answers."""
    from tuner.cli.ui import serve
    from tuner.context import state_dir_for
    from tuner.tracking.tracker import resolve_tracking_uri, safe_url

    sd = state_dir_for(state_dir)
    uri = resolve_tracking_uri(None, sd)
    err_console.print(f"starting the MLflow UI on {host}:{port} (store {safe_url(uri)}) ...", highlight=False)
    try:
        rc = serve(sd, uri, host=host, port=port, workers=workers,
                   announce=lambda line: console.print(line, highlight=False, soft_wrap=True))
    except TunerError as exc:
        raise fail(exc) from None
    raise typer.Exit(rc)


# ---------------------------------------------------------------- commands from other modules
bench.register(app)
engine_cli.register(app)
cli_ops.register(app)
report_cli.register(app)
cli_fleet.register(app)
cli_observe.register(app)
cli_scenarios.register(app)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
