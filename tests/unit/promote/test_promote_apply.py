"""Review: an apply command that times out is killed with everything it started (its process group)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tuner.errors import PromotionError
from tuner.promotion.act import run_apply

pytestmark = pytest.mark.process  # starts processes: not in `make test-fast`


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_a_timed_out_apply_leaves_no_child_applying(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    # a script whose own child (say, `kubectl rollout status`) hangs
    cmd = ["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"]
    with pytest.raises(PromotionError, match="timed out"):
        run_apply(cmd, champion_file=tmp_path / "champion.yaml", agent="a", action="promote", cwd=tmp_path,
                  timeout_s=1.0)
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert not _alive(child), "the apply command's child still runs after the timeout"
    finally:
        if _alive(child):
            os.kill(child, 9)
