"""`tuner scenarios`: the scenario table (`show`) and the cross-evaluation (`evaluate`: every scenario champion
and the baseline measured on every scenario's workload; tuner.scenarios.matrix)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Annotated

import typer

from tuner.cli.common import AgentArg, StateDirOpt, _install_stop_handlers, console, fail
from tuner.errors import TunerError

scenarios_app = typer.Typer(help="Scenarios: the table, and the cross-evaluation of their champions.",
                            no_args_is_help=True)


def _print(agent_path: Path | None, state_dir: Path | None, as_json: bool) -> None:
    from tuner.cli.status_view import print_scenarios
    from tuner.context import open_context
    from tuner.scenarios.table import scenario_rows

    ctx = open_context(agent_path, state_dir, create=False)
    rows = scenario_rows(ctx.agent, ctx.state_dir)
    if as_json:
        console.print_json(json.dumps(rows, default=str))
    elif not rows:
        console.print(f"{ctx.name} declares no scenario and the daemon proposed none", highlight=False)
    else:
        print_scenarios(console, rows)


@scenarios_app.command("show")
def show(agent_path: AgentArg = None, state_dir: StateDirOpt = None,
         as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False) -> None:
    """Each scenario's region, champion, the traffic its study tunes and its gains from the last evaluation."""
    try:
        _print(agent_path, state_dir, as_json)
    except TunerError as exc:
        raise fail(exc) from None


@scenarios_app.command("evaluate")
def evaluate(agent_path: AgentArg = None, state_dir: StateDirOpt = None,
             runs: Annotated[int, typer.Option(min=2, help="Measurements of each configuration on each "
                                               "scenario's workload (interleaved rounds).")] = 3,
             as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False) -> None:
    """Measure every scenario's champion and the baseline on every scenario's workload (deploys them)."""
    from tuner.context import open_context
    from tuner.scenarios.matrix import cross_evaluate

    stop = threading.Event()
    _install_stop_handlers(stop)
    try:
        cross_evaluate(open_context(agent_path, state_dir), runs=runs, stop=stop)
        _print(agent_path, state_dir, as_json)
    except TunerError as exc:
        raise fail(exc) from None


def register(app: typer.Typer) -> None:
    app.add_typer(scenarios_app, name="scenarios")
