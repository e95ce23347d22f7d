"""`tuner serve-engine`: the reference engine's server, with the same options as
`python -m tuner.engine.server` (every argument is passed through to its parser; see --help).
`tuner make-model`: a Hugging Face checkpoint of a preset with random weights (tuner/engine/checkpoint.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tuner.errors import TunerError


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

    @app.command("make-model")
    def make_model(
        out_dir: Annotated[Path, typer.Argument(help="Directory to write (created; must be empty).")],
        preset: Annotated[str, typer.Option(help="Model shapes: a preset of the reference engine.")] = "tiny",
        seed: Annotated[int, typer.Option(help="Seed of the random weights (the engine's own draw).")] = 0,
        dtype: Annotated[str, typer.Option(help="Dtype of the stored weights: float32, bfloat16, float16.")
                         ] = "float32",
        max_model_len: Annotated[int | None, typer.Option(help="Context length (default: the preset's).")
                                 ] = None,
        force: Annotated[bool, typer.Option(help="Overwrite the files of a non-empty directory.")] = False,
    ) -> None:
        """Write a Hugging Face Llama checkpoint (config, safetensors, tokenizer with a chat template) of a
        preset with random weights. vLLM, the reference engine and any HF-compatible server load it."""
        from tuner.engine.checkpoint import write_checkpoint

        try:
            out = write_checkpoint(out_dir, preset, seed=seed, dtype=dtype, max_model_len=max_model_len,
                                   force=force)
        except TunerError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(exc.exit_code) from None
        typer.echo(f"wrote {out} (preset {preset}, seed {seed}, {dtype})")
