"""Shared fixtures: `agent_file` writes a valid sim agent (tests/support/agents.py), changed by keyword."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.support.agents import write_agent

# The CLI's tables take COLUMNS where it is set (tuner.base.textfmt.console_width), and the tests read its output
# as a pipe sees it, with none: pytest-xdist's workers set COLUMNS to the controller's terminal width (80 off a
# terminal), which wrapped `tuner status` and `tuner observe` tables there
os.environ.pop("COLUMNS", None)


@pytest.fixture
def agent_file(tmp_path: Path) -> Callable[..., Path]:
    """`agent_file(name="x", at={"workload.num_requests": 20}, file="x.yaml")` -> the written agent's path."""

    def make(at: Mapping[str, Any] | None = None, *, file: str | None = None, **changes: Any) -> Path:
        name = changes.get("name", "agent")
        return write_agent(tmp_path / (file or f"{name}.yaml"), at, **changes)

    return make
