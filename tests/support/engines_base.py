"""The part every test engine shares: a name, a geometry, a capacity, and requests it can abort.

A test engine subclasses ``StubEngine`` and writes ``_work`` (one page) and, where it has settings
worth recording, ``describe``. Built from keyword arguments only, so a configuration can name it
as a plugin::

    [engine]
    kind = "plugin"
    plugin = "tests.support.fault_engines:CrashingEngine"
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from ocrwatch.engines.base import PageRequest, Recognition
from ocrwatch.pages.render import Geometry


class Requests:
    """In-flight recognitions by request id, so ``abort`` cancels a request and its ladder
    attempts."""

    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Task[Recognition]] = {}
        self.seen: list[str] = []
        self.aborted: list[str] = []

    async def run(self, request_id: str, work: Coroutine[Any, Any, Recognition]) -> Recognition:
        self.seen.append(request_id)
        task = asyncio.ensure_future(work)
        self._tasks[request_id] = task
        try:
            return await task
        finally:
            if self._tasks.get(request_id) is task:
                del self._tasks[request_id]

    def abort(self, request_id: str) -> None:
        for key, task in list(self._tasks.items()):
            if key == request_id or key.startswith(f"{request_id}/"):
                self.aborted.append(key)
                task.cancel()

    async def cancel_all(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @property
    def inflight(self) -> int:
        return len(self._tasks)


class StubEngine:
    """The ``Engine`` protocol with nothing to load or free: each page runs ``_work`` in a task of
    its own."""

    name = "stub"

    def __init__(self, *, max_concurrency: int = 4, dpi: int = 100) -> None:
        self.max_concurrency = max_concurrency
        self.geometry = Geometry(dpi=dpi)
        self.requests = Requests()
        self.closed = False

    async def start(self) -> None:
        """Nothing to load."""

    async def recognize(self, page: PageRequest) -> Recognition:
        return await self.requests.run(page.request_id, self._work(page))

    async def _work(self, page: PageRequest) -> Recognition:
        raise NotImplementedError

    async def abort(self, request_id: str) -> None:
        self.requests.abort(request_id)

    def release(self) -> None:
        """Nothing cached."""

    async def close(self) -> None:
        await self.requests.cancel_all()
        self.closed = True

    def describe(self) -> dict[str, Any]:
        return {"name": self.name}
