"""Processes that open the same new SQLite store at once (a `tuner status` or a promote next to a starting
`tuner run` or daemon): each open creates the tables of a new file, and without tuner.coord.sqlite.init_lock the
losers of that race failed with "table ... already exists" (7 of 10 rounds of 4 processes did)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest

PROCESSES = 4


def _open_study(url: str, barrier: Any) -> None:
    from tuner.study.study import open_storage

    barrier.wait()
    open_storage(url)


def _open_tracking(url: str, barrier: Any) -> None:
    from tuner.tracking.tracker import Tracker

    barrier.wait()
    Tracker(url, "race").client  # noqa: B018 - the property opens the store


@pytest.mark.parametrize(("opener", "rounds"), [(_open_study, 6), (_open_tracking, 3)], ids=["optuna", "mlflow"])
def test_processes_opening_a_new_store_at_once_all_succeed(tmp_path: Path, opener: Any, rounds: int) -> None:
    # forkserver: each opener is forked from a fresh server process, not from this pytest worker, whose other
    # tests' threads (a lease heartbeat, a logging lock) a fork would copy mid-hold (a CI run hung so)
    ctx = multiprocessing.get_context("forkserver")
    for r in range(rounds):
        url = f"sqlite:///{tmp_path / f'round-{r}.db'}"
        barrier = ctx.Barrier(PROCESSES)
        procs = [ctx.Process(target=opener, args=(url, barrier)) for _ in range(PROCESSES)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        hung = [p for p in procs if p.is_alive()]
        for p in hung:
            p.kill()
        assert not hung, f"round {r}: {len(hung)} of {PROCESSES} openers still at it after 60 s"
        assert [p.exitcode for p in procs] == [0] * PROCESSES, f"round {r}"


def test_a_store_whose_lock_file_cannot_be_made_still_opens(tmp_path: Path) -> None:
    """A reader without write access to the state dir (say, `tuner status` as another user) cannot make the
    lock file: it opens the store without the lock. Stood in for, even as root, by a folder in its place."""
    from tuner.coord.sqlite import init_lock
    from tuner.study.study import open_storage

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    open_storage(url)  # made by its owner
    lock = tmp_path / "optuna.db.init.lock"
    lock.unlink()
    lock.mkdir()
    with init_lock(url):
        pass
    assert open_storage(url).get_all_studies() == []
