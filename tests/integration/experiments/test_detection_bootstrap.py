"""The detection experiment's replayed streams (experiments/detection/run.py's bootstrap): the learning stretch a
replayed monitor learns from holds no window twice, as a live one's never does; the rest is a block bootstrap."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "experiments" / "detection"))

import run  # noqa: E402


def _windows(n: int) -> list[dict[str, float]]:
    return [{"i": float(i)} for i in range(n)]


@pytest.mark.parametrize(("length", "block"), [(60, 1), (60, 8), (32, 8), (120, 8), (30, 5)])
def test_the_learning_stretch_holds_no_window_twice(length: int, block: int) -> None:
    windows = _windows(length)
    repeated = 0
    for seed in range(200):
        out = run.bootstrap(windows, 500, block, random.Random(seed), distinct=20)
        assert len(out) == 500
        first = [w["i"] for w in out[:20]]
        assert len(set(first)) == 20, (seed, first)
        # within a block the windows follow each other as recorded
        starts = range(0, 20, block)
        for s in starts:
            run_ = first[s:min(s + block, 20)]
            assert run_ == [run_[0] + k for k in range(len(run_))]
        repeated += len({w["i"] for w in out}) < len(out)
    assert repeated == 200  # after it, windows repeat as a bootstrap's do


def test_without_distinct_a_learning_stretch_may_repeat_a_window() -> None:
    """The draws the old replay made: 20 of 60 windows drawn with replacement repeat one in most streams."""
    windows = _windows(60)
    repeats = sum(len({w["i"] for w in run.bootstrap(windows, 20, 1, random.Random(seed))}) < 20
                  for seed in range(200))
    assert repeats > 150


def test_a_stream_too_short_for_distinct_windows_still_ends() -> None:
    out = run.bootstrap(_windows(10), 40, 4, random.Random(0), distinct=20)
    assert len(out) == 40
