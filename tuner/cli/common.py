"""What every command module of the `tuner` command line shares: the typer app, the consoles, the agent and
state-dir arguments, the one error line (`fail`) and the stop handlers. Command modules import this one, and
`tuner.cli.main` imports them all and registers them."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from tuner import __version__
from tuner.base.files import state_fault
from tuner.base.logs import configure_logging
from tuner.base.redact import redact_text
from tuner.base.textfmt import console_width
from tuner.errors import TunerError


def state_dir_of(args: list[str]) -> Path:
    """The state dir a command line names (--state-dir), else $TUNER_STATE_DIR, else .tuner: where a command
    writes, for the error line of a full or read-only disk."""
    for i, a in enumerate(args):
        if a == "--state-dir" and i + 1 < len(args):
            return Path(args[i + 1])
        if a.startswith("--state-dir="):
            return Path(a.split("=", 1)[1])
    return Path(os.environ.get("TUNER_STATE_DIR") or ".tuner")


class _Commands(TyperGroup):
    """The command group: a full or read-only disk under any command (Optuna's commit, SQLite, a file write)
    is one error line naming the directory and exit 4, never a traceback (tuner.base.files.state_fault)."""

    def invoke(self, ctx: Any) -> Any:
        args = [str(a) for a in (*(getattr(ctx, "protected_args", None) or getattr(ctx, "_protected_args", [])),
                                 *ctx.args)]  # before the subcommand consumes them
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, TunerError):
            raise
        except Exception as exc:
            fault = state_fault(exc, state_dir_of(args))
            if fault is None:
                raise
            raise fail(fault) from None


app = typer.Typer(
    cls=_Commands,
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
