"""What every command module of the `tuner` command line shares: the typer app, the consoles, the agent and
state-dir arguments, the one error line (`fail`) and the stop handlers. Command modules import this one, and
`tuner.cli.main` imports them all and registers them."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from tuner import __version__
from tuner.base.logs import configure_logging
from tuner.base.redact import redact_text
from tuner.base.textfmt import console_width
from tuner.errors import TunerError

app = typer.Typer(
    name="tuner",
    help="Auto-tuning agent for LLM serving stacks: Optuna proposes, the target measures, MLflow records.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# in a pipe or a file, tables are not cut at rich's default 80 columns (COLUMNS still wins); no emoji codes:
# an error on line 100 printed as `spec.yaml:100:` must not become `spec.yaml💯`
console = Console(stderr=False, width=console_width(sys.stdout), emoji=False)
err_console = Console(stderr=True, width=console_width(sys.stderr), emoji=False)

AgentArg = Annotated[Path | None, typer.Argument(
    help="Agent spec YAML (see agents/). Default: the one agent the state dir holds.", show_default=False)]
StateDirOpt = Annotated[
    Path | None,
    typer.Option("--state-dir", help="State directory (Optuna and MLflow stores, logs). "
                 "Default: $TUNER_STATE_DIR or .tuner/", show_default=False),
]


def fail(exc: TunerError) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {escape(redact_text(str(exc)))}", highlight=False, soft_wrap=True)
    return typer.Exit(exc.exit_code)


def _print_version(value: bool) -> None:
    """--version is eager: it answers before a command is required."""
    if value:
        console.print(f"tuner {__version__}", highlight=False)
        raise typer.Exit(0)


@app.callback()
def _main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.", is_eager=True,
                                          callback=_print_version)] = False,
) -> None:
    configure_logging(verbose, rich_console=err_console)


def _install_stop_handlers(stop: threading.Event) -> None:
    import signal

    def handler(signum: int, _frame: Any) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        err_console.print("[yellow]stopping: no new trials; tearing the running deployment down[/]")
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)
