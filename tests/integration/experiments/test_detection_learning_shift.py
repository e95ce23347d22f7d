"""A change inside a baseline's learning windows (MonitorConfig.learning_shift) on the committed real-vLLM recordings
of a closed loop at its capacity whose users doubled and came back inside the relearning their drift started
(experiments/detection's vllm13: 4 users at capacity 4 for 20 windows; vllm14: 3 at 3 for 16), replayed in their
recorded order from starts in their lead stretch: the return a drift within 2 windows from each, and vllm13's
slowdown after it an anomaly; with the rule off the return is not found and vllm13's slowdown is called a drift."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DETECTION = ROOT / "experiments" / "detection"
sys.path.insert(0, str(DETECTION))

import run  # noqa: E402

from tuner.monitor.config import MonitorConfig  # noqa: E402

CONFIG = MonitorConfig(interval_s=15.0)
STREAMS = {"vllm13": "recorded-vllm-capacity4.jsonl.gz", "vllm14": "recorded-vllm-capacity3-return.jsonl.gz"}
STARTS = (0, 4, 7)


def _life(name: str) -> tuple[list[run.Window], list[tuple[int, int, str]]]:
    _, _, order = run.load_stream(DETECTION / STREAMS[name])
    assert order is not None
    return [w for _, w in order], run.changes_of(order)


def _first(events: list[run.Ev], at: int, within: int) -> tuple[int, str] | None:
    return next(((i - at + 1, kind) for i, kind, _, _ in events if at <= i < at + within
                 and kind not in ("recovery", "saturation")), None)


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_users_back_inside_the_relearning_are_a_drift(name: str) -> None:
    windows, changes = _life(name)
    expect = run.expectation(DETECTION.parent / "sim-calibration" / "model-cpu.json")
    back = next(a for a, _, change in changes if change == run.RETURN)
    slow = next(a for a, _, change in changes if change == run.SLOW)
    for s in STARTS:
        ev = run.replay(windows[s:], CONFIG, run.Gpu(0.0, s), expect)
        ev = [(i + s, *rest) for i, *rest in ev]
        assert _first(ev, back, run.GRACE_WINDOWS) in ((1, "drift"), (2, "drift")), (name, s, ev)
        if name == "vllm13":  # its slowdown comes 20 windows after the return: judged against the base load
            assert _first(ev, slow, 12) in ((1, "anomaly"), (2, "anomaly"), (3, "anomaly")), (name, s, ev)
        off = run.replay(windows[s:], replace(CONFIG, learning_shift=False), run.Gpu(0.0, s), expect)
        off = [(i + s, *rest) for i, *rest in off]
        assert _first(off, back, 12) is None, (name, s, off)
        if name == "vllm13":
            assert _first(off, slow, 12) == (2, "drift"), (name, s, off)
