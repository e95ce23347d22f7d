"""GpuPool: disjoint claims from many threads, at-once refusal of impossible claims, stop while waiting."""

from __future__ import annotations

import random
import threading
import time

import pytest

from tuner.errors import InfeasibleConfig, Interrupted
from tuner.placement.gpupool import Claim, GpuPool, overlaps

FAKE_GPUS = [0, 1, 2, 3, 4, 5, 6, 7]


def test_claims_of_1_2_4_8_from_threads_never_overlap() -> None:
    pool = GpuPool(FAKE_GPUS)
    rng = random.Random(7)
    sizes = [1, 2, 4, 8] * 6
    rng.shuffle(sizes)
    held_now: set[int] = set()
    lock = threading.Lock()
    seen_conflicts: list[str] = []
    max_in_use = [0]

    def job(i: int, n: int) -> None:
        with pool.claim(n, label=f"job-{i}") as gpus:
            assert len(gpus) == n and len(set(gpus)) == n
            with lock:
                if held_now & set(gpus):
                    seen_conflicts.append(f"job-{i} got {gpus} while {sorted(held_now)} held")
                held_now.update(gpus)
                max_in_use[0] = max(max_in_use[0], len(held_now))
            time.sleep(0.002 * rng.randint(1, 5))
            with lock:
                held_now.difference_update(gpus)

    threads = [threading.Thread(target=job, args=(i, n)) for i, n in enumerate(sizes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive()
    assert seen_conflicts == []
    assert len(pool.history) == len(sizes)
    assert sorted(len(c.gpus) for c in pool.history) == sorted(sizes)
    assert all(c.end_s is not None for c in pool.history)
    assert overlaps(pool.history) == []
    assert pool.free == tuple(FAKE_GPUS)
    assert max_in_use[0] > 1  # claims did run side by side


def test_overlaps_detects_a_real_overlap() -> None:
    # the checker itself must be able to fail
    a = Claim("a", (0, 1), 0.0, 2.0)
    b = Claim("b", (1, 2), 1.0, 3.0)
    c = Claim("c", (1,), 2.0, 4.0)  # starts exactly when a ends: no overlap
    assert overlaps([a, b, c]) == [(a, b), (b, c)]


def test_claim_larger_than_pool_is_infeasible_at_once() -> None:
    pool = GpuPool(FAKE_GPUS)
    with pytest.raises(InfeasibleConfig, match="needs 16 GPUs, the node has 8") as ei:
        with pool.claim(16):
            pass
    assert ei.value.cause == "infeasible_config"
    assert pool.history == []


def test_empty_pool_refuses_any_gpu_claim_but_allows_zero() -> None:
    pool = GpuPool([])
    assert pool.total == 0
    with pytest.raises(InfeasibleConfig, match="the node has 0"):
        with pool.claim(1):
            pass
    with pool.claim(0) as gpus:
        assert gpus == ()


def test_waiting_claim_blocks_until_release_and_gets_disjoint_gpus() -> None:
    pool = GpuPool(FAKE_GPUS)
    got: list[tuple[int, ...]] = []
    with pool.claim(6, label="big") as first:
        t = threading.Thread(target=lambda: got.append(_hold(pool, 4)))
        t.start()
        t.join(timeout=0.3)
        assert t.is_alive(), "a claim of 4 must wait while only 2 GPUs are free"
        assert got == []
    t.join(timeout=5)
    assert not t.is_alive()
    assert len(got[0]) == 4
    assert first == (0, 1, 2, 3, 4, 5)


def _hold(pool: GpuPool, n: int) -> tuple[int, ...]:
    with pool.claim(n, label=f"hold-{n}") as gpus:
        return gpus


def test_stop_event_interrupts_a_waiting_claim() -> None:
    pool = GpuPool(FAKE_GPUS)
    stop = threading.Event()
    errors: list[BaseException] = []

    def waiter() -> None:
        try:
            with pool.claim(4, stop, label="waiter"):
                pass
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    with pool.claim(8, label="all"):
        t = threading.Thread(target=waiter)
        t.start()
        time.sleep(0.1)
        stop.set()
        t.join(timeout=5)
        assert not t.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], Interrupted)
    assert [c.label for c in pool.history] == ["all"]


def test_big_claim_is_not_starved_by_small_ones() -> None:
    pool = GpuPool(FAKE_GPUS)
    stop = threading.Event()
    order: list[str] = []

    def small(i: int) -> None:
        while not stop.is_set():
            try:
                with pool.claim(1, stop, label=f"small-{i}"):
                    time.sleep(0.005)
            except Interrupted:
                return

    smalls = [threading.Thread(target=small, args=(i,)) for i in range(4)]
    for t in smalls:
        t.start()
    try:
        time.sleep(0.05)
        with pool.claim(8, label="big") as gpus:
            order.append("big")
            assert gpus == tuple(FAKE_GPUS)
    finally:
        stop.set()
        for t in smalls:
            t.join(timeout=5)
    assert order == ["big"]
    assert overlaps(pool.history) == []


def test_duplicate_ids_are_rejected() -> None:
    with pytest.raises(ValueError, match="distinct"):
        GpuPool([0, 0, 1])


def test_none_means_what_nvml_sees() -> None:
    pool = GpuPool(None)  # no GPU on a CPU box: empty; on a GPU box: every visible GPU
    assert list(pool.ids) == list(range(pool.total))
