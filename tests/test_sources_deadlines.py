"""The settle deadlines: many keys in one heap, stepped when their time comes, a few at once, never
one key twice at once, and nothing left behind once a key is done or dropped."""

from __future__ import annotations

import asyncio
import time

from ocrwatch.sources.deadlines import COMPACT_SLACK, Deadlines


async def eventually(check: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "not reached in time"
        await asyncio.sleep(0.01)


async def test_each_key_is_stepped_until_done_at_most_limit_at_once() -> None:
    """Every key is stepped its number of times, never over ``limit`` at once, nor twice at once."""
    steps: dict[int, int] = {}
    running: set[int] = set()
    most = 0

    async def step(key: int) -> float | None:
        nonlocal most
        assert key not in running
        running.add(key)
        most = max(most, len(running))
        await asyncio.sleep(0.001)
        running.discard(key)
        steps[key] = steps.get(key, 0) + 1
        return 0.01 if steps[key] < 3 else None

    deadlines: Deadlines[int] = Deadlines(step, limit=4)
    deadlines.start()
    try:
        for key in range(200):
            deadlines.add(key)
            deadlines.add(key)  # followed already: no second line of steps
        await eventually(lambda: len(deadlines) == 0)
    finally:
        await deadlines.stop()
    assert steps == {key: 3 for key in range(200)}
    assert most == 4


async def test_a_nudge_brings_the_next_step_forward_even_during_a_step() -> None:
    """A key waiting an hour is stepped at once when nudged; nudged while it is being stepped, it
    is stepped again at once after, rather than at the deadline that step returned."""
    stepped: list[float] = []
    release = asyncio.Event()

    async def step(key: str) -> float | None:
        stepped.append(time.monotonic())
        if len(stepped) == 2:
            await release.wait()
        return 3600.0 if len(stepped) < 3 else None

    deadlines: Deadlines[str] = Deadlines(step, limit=1)
    deadlines.start()
    try:
        deadlines.add("file")
        await eventually(lambda: len(stepped) == 1)
        deadlines.nudge("file")
        await eventually(lambda: len(stepped) == 2)
        deadlines.nudge("file")  # during the second step
        release.set()
        await eventually(lambda: len(stepped) == 3)
        await eventually(lambda: "file" not in deadlines)
    finally:
        await deadlines.stop()


async def test_a_discarded_key_is_stepped_no_more_and_its_step_is_cancelled() -> None:
    cancelled = asyncio.Event()
    calls: list[str] = []

    async def step(key: str) -> float | None:
        calls.append(key)
        if key == "busy":
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.set()
                raise
        return 0.05

    deadlines: Deadlines[str] = Deadlines(step, limit=2)
    deadlines.start()
    try:
        deadlines.add("busy")
        deadlines.add("waiting")
        await eventually(lambda: calls.count("waiting") >= 1 and "busy" in calls)
        deadlines.discard("busy")
        deadlines.discard("waiting")
        await asyncio.wait_for(cancelled.wait(), 5)
        seen = len(calls)
        await asyncio.sleep(0.2)
        assert len(calls) == seen
        assert len(deadlines) == 0
    finally:
        await deadlines.stop()


async def test_nudges_do_not_grow_the_heap_without_bound() -> None:
    """Each nudge of a waiting key leaves a stale entry; the heap is rebuilt before they pile up."""

    async def step(key: int) -> float | None:
        return 3600.0

    deadlines: Deadlines[int] = Deadlines(step, limit=8)
    deadlines.start()
    try:
        for key in range(10):
            deadlines.add(key)
        await eventually(lambda: len(deadlines._due) == 10)
        for _ in range(1000):
            for key in range(10):
                deadlines.nudge(key)
            await asyncio.sleep(0)
        assert len(deadlines._heap) <= 2 * 10 + COMPACT_SLACK + 1
    finally:
        await deadlines.stop()


async def test_a_step_whose_wait_is_over_goes_no_further_once_stop_has_returned() -> None:
    """The settler lets go of its outbox right after ``stop`` returns, and awaits what it returned
    later, beside other tasks: a step whose wait was already over must not run on meanwhile (one
    did, and found the outbox gone)."""
    entered, release = asyncio.Event(), asyncio.Event()
    went_on: list[int] = []

    async def step(key: int) -> float | None:
        entered.set()
        await release.wait()
        went_on.append(key)
        return None

    deadlines: Deadlines[int] = Deadlines(step, limit=1)
    deadlines.start()
    deadlines.add(1)
    await entered.wait()
    release.set()  # the step would go on at the loop's next turn
    await asyncio.gather(deadlines.stop())  # as LocalSource.stop awaits it
    assert went_on == []
    assert len(deadlines) == 0
