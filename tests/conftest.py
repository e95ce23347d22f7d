"""Shared fixtures: `agent_file` writes a valid sim agent (tests/support/agents.py), changed by keyword."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.support.agents import write_agent


@pytest.fixture
def agent_file(tmp_path: Path) -> Callable[..., Path]:
    """`agent_file(name="x", at={"workload.num_requests": 20}, file="x.yaml")` -> the written agent's path."""

    def make(at: Mapping[str, Any] | None = None, *, file: str | None = None, **changes: Any) -> Path:
        name = changes.get("name", "agent")
        return write_agent(tmp_path / (file or f"{name}.yaml"), at, **changes)

    return make
