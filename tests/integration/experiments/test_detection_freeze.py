"""The detection experiment's outside slowdown (experiments/detection/freeze.py) and record_vllm.py's process
lookup, on real processes: a process held stopped the asked share of the time, always continued at the end."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DETECTION = ROOT / "experiments" / "detection"
sys.path.insert(0, str(DETECTION))

import freeze  # noqa: E402
import record_vllm  # noqa: E402

pytestmark = pytest.mark.process

SPIN = "import time\nwhile True:\n    time.sleep(0.001)\n"


def state(pid: int) -> str:
    """The process's one-letter state (R, S, T: stopped, ...)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    p = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        yield p
    finally:
        p.kill()
        p.wait(10)


def test_the_stopped_share_stretches_work_by_the_slowdown() -> None:
    for frac in (0.0, 0.3, 1.0):
        assert 1 / (1 - freeze.stopped_share(frac)) == pytest.approx(1 + frac)
    with pytest.raises(ValueError, match="slowdown_frac must be >= 0"):
        freeze.stopped_share(-0.1)
    with pytest.raises(ValueError, match="at least one process"):
        freeze.Freezer([], 0.3)


def test_a_process_is_held_stopped_the_share_asked_and_continued_after(child: subprocess.Popen[bytes]) -> None:
    seen: set[str] = set()
    with freeze.Freezer([child.pid], 0.3, period_s=0.05) as fz:
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            seen.add(state(child.pid))
            time.sleep(0.003)
    assert "T" in seen, seen  # it was stopped at times
    assert seen - {"T"}, seen  # and ran at others
    assert fz.share_held() == pytest.approx(fz.share, abs=0.05)
    time.sleep(0.05)
    assert state(child.pid) != "T"


def test_the_process_is_continued_whatever_ends_the_block(child: subprocess.Popen[bytes]) -> None:
    with pytest.raises(RuntimeError), freeze.Freezer([child.pid], 3.0, period_s=0.5):
        time.sleep(0.2)  # inside a stop: 3/4 of each half second
        raise RuntimeError("the load failed")
    time.sleep(0.05)
    assert state(child.pid) != "T"
    assert child.poll() is None


def test_no_slowdown_never_stops_and_a_gone_process_is_no_error(child: subprocess.Popen[bytes]) -> None:
    with freeze.Freezer([child.pid], 0.0) as fz:
        for _ in range(50):
            assert state(child.pid) != "T"
            time.sleep(0.002)
    assert fz.share_held() == 0.0
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(10)
    with freeze.Freezer([gone.pid], 0.3, period_s=0.02):
        time.sleep(0.1)


def test_the_servers_processes_are_found_below_it(tmp_path: Path) -> None:
    # a parent whose child starts a grandchild: both below it; none of them is a vLLM engine core
    script = ("import subprocess, sys, time\n"
              "subprocess.Popen([sys.executable, '-c', "
              "\"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
              " time.sleep(60)\"])\n"
              "time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 20
        while len(record_vllm.descendants(p.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        below = record_vllm.descendants(p.pid)
        assert len(below) == 2 and p.pid not in below
        assert record_vllm.engine_core(p.pid) == p.pid  # no engine core: the server itself
    finally:
        for pid in [*record_vllm.descendants(p.pid), p.pid]:
            subprocess.run(["kill", "-9", str(pid)], check=False)
        p.wait(10)
