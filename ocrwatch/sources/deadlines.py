"""Many timers, one loop: when each file waiting in an inbox is to be looked at next, in one heap.

A backlog dropped at once (100,000 files) cost a task and an ``asyncio.Event`` per file while it
settled, about 1.5 KB each, and the heap that a burst grows stays grown. Here a waiting key costs a
heap entry and a dict entry; a task exists only while a key is being looked at, ``limit`` at most at
once, so a burst is worked through at the pace of the ledger rather than all of it held in flight.

Concurrency: every method is called from the event loop that ``start`` ran on.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

COMPACT_SLACK = 64
"""Stale heap entries (a key nudged or dropped before its time) allowed beyond the live ones before
the heap is rebuilt, so that a storm of nudges cannot grow it without bound."""


class Deadlines(Generic[K]):
    """Steps each key when its time comes: ``step(key)`` returns how many seconds until the next
    step, or None when the key is done. One key is never stepped twice at once."""

    def __init__(self, step: Callable[[K], Awaitable[float | None]], limit: int) -> None:
        self._step = step
        self._limit = limit
        self._heap: list[tuple[float, int, K]] = []
        # The one live deadline of each waiting key; heap entries may be stale.
        self._due: dict[K, float] = {}
        self._running: dict[K, asyncio.Task[None]] = {}
        self._nudged: set[K] = set()  # nudged while being stepped: stepped again at once
        self._order = itertools.count()
        self._wake = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None

    def __contains__(self, key: object) -> bool:
        return key in self._due or key in self._running

    def __len__(self) -> int:
        return len(self._due) + len(self._running)

    def start(self) -> None:
        """Begin stepping keys on the running loop."""
        self._runner = asyncio.create_task(self._run(), name="settle-deadlines")

    def stop(self) -> Awaitable[object]:
        """Stop stepping and forget every key. The steps in flight are cancelled at once, before
        this returns, so none goes on past its next ``await`` once the caller has moved on; what is
        returned ends when they have ended."""
        tasks = [*self._running.values(), *([self._runner] if self._runner is not None else [])]
        self._runner = None
        self._heap.clear()
        self._due.clear()
        self._nudged.clear()
        self._running.clear()
        for task in tasks:
            task.cancel()
        return asyncio.gather(*tasks, return_exceptions=True)

    def add(self, key: K) -> None:
        """Step ``key`` as soon as a place is free, unless it is followed already."""
        if key not in self:
            self._schedule(key, 0.0)

    def nudge(self, key: K) -> None:
        """Step a followed ``key`` now rather than at its deadline (again, if being stepped)."""
        if key in self._running:
            self._nudged.add(key)
        elif key in self._due:
            self._schedule(key, 0.0)

    def discard(self, key: K) -> None:
        """Follow ``key`` no more; a step in flight is cancelled."""
        self._due.pop(key, None)
        self._nudged.discard(key)
        task = self._running.pop(key, None)
        if task is not None:
            task.cancel()

    def _schedule(self, key: K, delay: float) -> None:
        when = asyncio.get_running_loop().time() + delay
        self._due[key] = when
        heapq.heappush(self._heap, (when, next(self._order), key))
        if len(self._heap) > 2 * len(self._due) + COMPACT_SLACK:
            self._heap = [entry for entry in self._heap if self._due.get(entry[2]) == entry[0]]
            heapq.heapify(self._heap)
        self._wake.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()
            now = loop.time()
            heap = self._heap
            while heap and len(self._running) < self._limit:
                when, _, key = heap[0]
                if self._due.get(key) != when:  # nudged or dropped since: a later entry stands
                    heapq.heappop(heap)
                    continue
                if when > now:
                    break
                heapq.heappop(heap)
                del self._due[key]
                self._running[key] = asyncio.create_task(self._one(key))
            timer = None
            if heap and len(self._running) < self._limit:
                timer = loop.call_at(heap[0][0], self._wake.set)
            try:
                await self._wake.wait()
            finally:
                if timer is not None:
                    timer.cancel()

    async def _one(self, key: K) -> None:
        task = asyncio.current_task()
        delay: float | None = None
        try:
            delay = await self._step(key)
        finally:
            if self._running.get(key) is task:  # not discarded meanwhile
                del self._running[key]
                nudged = key in self._nudged
                self._nudged.discard(key)
                if delay is not None:
                    self._schedule(key, 0.0 if nudged else delay)
            self._wake.set()
