"""`tuner report AGENT`: write the HTML report and its Markdown summary. `register(app)` adds the command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from tuner.errors import TunerError


def build(agent_path: Path, state_dir: Path | None, out: Path, md_out: Path | None,
          scenario: str | None = None) -> tuple[Path, Path]:
    """Gather, render and write both files; returns their paths. `scenario`: that scenario's study (without
    it, the agent's own study, else the study of the scenario in service or of the first one that has one)."""
    from tuner.context import open_context
    from tuner.report.data import gather
    from tuner.report.render import html, markdown
    from tuner.scenarios.table import scenario_study

    ctx = open_context(agent_path, state_dir, create=False)  # the study the lineage names; creates nothing
    agent, sd = ctx.agent, ctx.state_dir
    study = ctx.read_study() if scenario is None else None
    if study is None:
        ctx.study_name = scenario_study(agent, sd, scenario) or ctx.study_name
        study = ctx.read_study()
    if study is None:
        raise TunerError(f"no study of {agent.name} in {sd}: run `tuner run {agent_path}` first")
    if not study.trials():
        raise TunerError(f"study {study.name} of {agent.name} has no trial yet: run `tuner run {agent_path}` first")
    data = gather(agent, sd, study)
    md_path = md_out or out.with_suffix(".md")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html(data), encoding="utf-8")
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text(markdown(data), encoding="utf-8")
    return out, md_path


def report(
    agent_path: Annotated[Path, typer.Argument(help="Agent spec YAML.", show_default=False)],
    out: Annotated[Path, typer.Option("--out", "-o", help="The HTML report (self-contained).")] = Path("report.html"),
    md_out: Annotated[Path | None, typer.Option("--markdown", help="The Markdown summary (default: the HTML "
                                                "file's name with .md).", show_default=False)] = None,
    state_dir: Annotated[Path | None, typer.Option("--state-dir", help="State directory (default "
                                                   "$TUNER_STATE_DIR or .tuner/).", show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the written paths as JSON.")] = False,
    scenario: Annotated[str | None, typer.Option("--scenario", help="Report this scenario's study (default: the "
                                                 "agent's, else the scenario in service).",
                                                 show_default=False)] = None,
) -> None:
    """Write one self-contained HTML report (baseline, champion, best, scenarios, plots, trials, failures,
    verdicts) and a Markdown summary for a pull request or a ticket."""
    try:
        html_path, md_path = build(agent_path, state_dir, out, md_out, scenario)
    except TunerError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(exc.exit_code) from None
    if as_json:
        typer.echo(json.dumps({"html": str(html_path), "markdown": str(md_path)}))
    else:
        typer.echo(f"report: {html_path}\nsummary: {md_path}")


def register(app: typer.Typer) -> None:
    app.command("report")(report)
