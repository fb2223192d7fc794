"""The C heap's free memory goes back to the system, a wave of callers trims it only once, and the
decode budget bounds the full-size images that render workers hold at once."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ocrwatch.infra import memory
from ocrwatch.infra.memory import HeapTrimmer, trim_heap


def rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(memory._MALLOC_TRIM is None, reason="not glibc: malloc_trim is absent")
def test_trim_heap_returns_the_holes_freed_buffers_leave() -> None:
    """Every other 64 KiB buffer freed: below glibc's mmap threshold, so the holes stay in the heap
    (and in RSS) until malloc_trim releases them."""
    trim_heap()
    kept, freed = [], []
    for i in range(4000):
        (kept if i % 2 else freed).append(bytearray(b"\x01" * 65536))
    del freed
    before = rss_bytes()
    trim_heap()
    after = rss_bytes()
    assert before - after > 64 * 2**20, (before, after)
    assert len(kept) == 2000


def test_the_heap_is_trimmed_at_most_once_per_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    trims: list[float] = []
    now = [100.0]
    monkeypatch.setattr(memory, "trim_heap", lambda: trims.append(now[0]))
    trimmer = HeapTrimmer(interval=10.0, clock=lambda: now[0])
    assert trimmer() is True
    now[0] = 109.9
    assert trimmer() is False
    now[0] = 110.0
    assert trimmer() is True
    assert trims == [100.0, 110.0]


# --- the decode budget ----------------------------------------------------------------------------


def _holding(
    budget: memory.DecodeBudget, nbytes: int, entered: threading.Event, leave: threading.Event
) -> threading.Thread:
    """A worker that holds ``nbytes`` of the budget until ``leave`` is set."""

    def work() -> None:
        with budget.hold(nbytes):
            entered.set()
            leave.wait(60)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread


def _wait_for(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def test_requests_that_fit_together_are_held_together() -> None:
    budget = memory.DecodeBudget(100)
    leave = threading.Event()
    entered = [threading.Event() for _ in range(3)]
    threads = [_holding(budget, 30, event, leave) for event in entered]
    for event in entered:
        assert event.wait(30)
    assert (budget.held, budget.holders, budget.waits) == (90, 3, 0)
    leave.set()
    for thread in threads:
        thread.join(30)
    assert (budget.held, budget.holders, budget.peak, budget.peak_holders, budget.granted) == (
        0,
        0,
        90,
        3,
        3,
    )


def test_a_request_waits_until_it_fits_and_one_over_the_limit_runs_alone() -> None:
    budget = memory.DecodeBudget(100)
    first_in, first_out = threading.Event(), threading.Event()
    big_in, big_out = threading.Event(), threading.Event()
    first = _holding(budget, 60, first_in, first_out)
    assert first_in.wait(30)
    # more than the whole budget: waits until nothing is held
    big = _holding(budget, 500, big_in, big_out)
    _wait_for(lambda: budget.waits == 1, "the large request to wait")
    assert not big_in.is_set()
    first_out.set()
    assert big_in.wait(30)
    assert (budget.held, budget.holders) == (100, 1)  # charged as the whole budget
    big_out.set()
    for thread in (first, big):
        thread.join(30)
    assert budget.peak == 100 and budget.peak_holders == 1


def test_requests_are_served_in_arrival_order() -> None:
    """A small request that would fit does not pass a large one waiting ahead of it, which would
    otherwise wait for ever behind a stream of small ones."""
    budget = memory.DecodeBudget(100)
    first_in, first_out = threading.Event(), threading.Event()
    large_in, large_out = threading.Event(), threading.Event()
    small_in, small_out = threading.Event(), threading.Event()
    first = _holding(budget, 50, first_in, first_out)
    assert first_in.wait(30)
    large = _holding(budget, 80, large_in, large_out)
    _wait_for(lambda: budget.waits == 1, "the large request to queue")
    # would fit beside the first, but the large one is ahead
    small = _holding(budget, 10, small_in, small_out)
    _wait_for(lambda: budget.waits == 2, "the small request to queue")
    assert not small_in.is_set()
    first_out.set()
    assert large_in.wait(30)
    assert small_in.wait(30)  # 80 + 10 fit: it follows at once
    large_out.set()
    small_out.set()
    for thread in (first, large, small):
        thread.join(30)
    assert budget.peak == 90


def test_an_interrupted_waiter_leaves_the_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    budget = memory.DecodeBudget(100)

    def interrupted(predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        raise KeyboardInterrupt

    with budget.hold(100), monkeypatch.context() as patch:
        patch.setattr(budget._cond, "wait_for", interrupted)
        with pytest.raises(KeyboardInterrupt), budget.hold(10):
            pass
    # had the interrupted ticket stayed at the head, this would block for ever
    with budget.hold(10):
        assert budget.holders == 1


def test_a_large_hold_trims_the_heap_when_it_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    trims: list[int] = []
    budget = memory.DecodeBudget(memory.TRIM_AFTER_BYTES * 2)
    monkeypatch.setattr(memory, "trim_heap", lambda: trims.append(budget.holders))
    with budget.hold(memory.TRIM_AFTER_BYTES - 1):
        pass
    assert trims == []
    with budget.hold(memory.TRIM_AFTER_BYTES):
        pass
    # before the budget is given back, so the next decode starts on a trimmed heap
    assert trims == [1]


def test_image_bytes_follow_pillows_storage() -> None:
    assert memory.image_bytes("L", 10, 10) == 100
    assert memory.image_bytes("1", 10, 10) == 100
    assert memory.image_bytes("I;16", 10, 10) == 200
    assert memory.image_bytes("RGB", 10, 10) == 400  # Pillow stores RGB in 32 bits
    assert memory.image_bytes("RGBA", 10, 10) == 400
