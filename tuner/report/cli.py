"""`tuner report AGENT`: write the HTML report and its Markdown summary. `register(app)` adds the command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from tuner.errors import TunerError


def build(agent_path: Path, state_dir: Path | None, out: Path, md_out: Path | None) -> tuple[Path, Path]:
    """Gather, render and write both files; returns their paths."""
    from tuner.agent import load_agent
    from tuner.loop import state_dir_for
    from tuner.report.data import gather
    from tuner.report.render import html, markdown
    from tuner.study import TunerStudy, default_storage

    agent = load_agent(agent_path)
    sd = state_dir_for(state_dir)
    storage = agent.spec.storage or default_storage(sd)
    if storage.startswith("sqlite:") and not Path(storage.split("sqlite:///", 1)[-1]).is_file():
        raise TunerError(f"no study of {agent.name} in {sd}: run `tuner run {agent_path}` first")
    study = TunerStudy(agent.spec, agent.space, storage_url=storage, study_name=_study_name(sd, agent.name))
    if not study.trials():
        raise TunerError(f"study {study.name} of {agent.name} has no trial yet: run `tuner run {agent_path}` first")
    data = gather(agent, sd, study)
    md_path = md_out or out.with_suffix(".md")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html(data), encoding="utf-8")
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text(markdown(data), encoding="utf-8")
    return out, md_path


def _study_name(state_dir: Path, agent_name: str) -> str:
    from tuner.lineage import current_study_name

    return current_study_name(state_dir, agent_name)


def report(
    agent_path: Annotated[Path, typer.Argument(help="Agent spec YAML.", show_default=False)],
    out: Annotated[Path, typer.Option("--out", "-o", help="The HTML report (self-contained).")] = Path("report.html"),
    md_out: Annotated[Path | None, typer.Option("--markdown", help="The Markdown summary (default: the HTML "
                                                "file's name with .md).", show_default=False)] = None,
    state_dir: Annotated[Path | None, typer.Option("--state-dir", help="State directory (default "
                                                   "$TUNER_STATE_DIR or .tuner/).", show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the written paths as JSON.")] = False,
) -> None:
    """Write one self-contained HTML report (baseline, champion, best, plots, trials, failures, verdicts)
    and a Markdown summary for a pull request or a ticket."""
    try:
        html_path, md_path = build(agent_path, state_dir, out, md_out)
    except TunerError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(exc.exit_code) from None
    if as_json:
        typer.echo(json.dumps({"html": str(html_path), "markdown": str(md_path)}))
    else:
        typer.echo(f"report: {html_path}\nsummary: {md_path}")


def register(app: typer.Typer) -> None:
    app.command("report")(report)
