from __future__ import annotations

from typer.testing import CliRunner

from tuner import __version__
from tuner.cli.main import app


def test_version_prints_and_exits_0() -> None:
    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0, r.output
    assert r.output.strip() == f"tuner {__version__}"
