"""`tuner serve-engine`: the reference engine's server, with the same options as
`python -m tuner.engine.server` (every argument is passed through to its parser; see --help)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command(
        "serve-engine",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        add_help_option=False,
        help="Serve the reference PyTorch engine over the OpenAI API (options: tuner serve-engine --help).",
    )
    def serve_engine(ctx: typer.Context) -> None:
        from tuner.engine.server import main

        raise typer.Exit(main(list(ctx.args)))
