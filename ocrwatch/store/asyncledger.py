"""The ledger and the hook deliveries as async code calls them: one typed facade each, whose
methods are the blocking store's, each run in a worker thread by ``_in_thread``.

A ledger call may wait up to its lock budget while another process holds SQLite's write lock; on
the event loop that would stall every inbox and document. So async code never calls ``Ledger`` or
``Deliveries`` itself (``tests/test_structure.py`` checks it): it awaits these, and ``_in_thread``
is the one way out of the loop for them, ``asyncio.to_thread`` (the default pool, and the caller's
context, so its log lines keep the job's id). Code that already runs in a thread (a fingerprint,
whether a done job's sidecars lapsed) calls ``blocking``, the store itself.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar

from ocrwatch.sources.base import Job
from ocrwatch.store.deliveries import Deliveries, HookDelivery
from ocrwatch.store.ledger import UNFINISHED, Fingerprint, JobRow, Ledger, State

P = ParamSpec("P")
T = TypeVar("T")


async def _in_thread(call: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """The one hop off the loop for a store's call: in a thread, with the caller's context."""
    return await asyncio.to_thread(call, *args, **kwargs)


class AsyncLedger:
    """``Ledger``'s calls awaited, each in a thread; ``blocking`` is the ledger itself, for code in
    a thread already and for the stores that share its file (the record of outputs, hook
    deliveries)."""

    def __init__(self, ledger: Ledger) -> None:
        self.blocking = ledger

    async def close(self) -> None:
        """For its owner, at its stop: closing waits for a transaction another thread is in."""
        await _in_thread(self.blocking.close)

    async def admit(self, job: Job, fingerprint: Fingerprint) -> bool:
        return await _in_thread(self.blocking.admit, job, fingerprint)

    async def known(self, key: str) -> JobRow | None:
        return await _in_thread(self.blocking.known, key)

    async def twins(self, job: Job, sha256: str, limit: int = 8) -> list[Job]:
        return await _in_thread(self.blocking.twins, job, sha256, limit)

    async def set_state(self, key: str, state: State, **fields: int) -> None:
        await _in_thread(self.blocking.set_state, key, state, **fields)

    async def record_attempt(self, key: str, error: dict[str, Any] | None) -> int:
        return await _in_thread(self.blocking.record_attempt, key, error)

    async def release_attempt(self, key: str) -> None:
        await _in_thread(self.blocking.release_attempt, key)

    async def park(self, key: str, error: dict[str, Any]) -> int:
        return await _in_thread(self.blocking.park, key, error)

    async def mark_done(self, key: str) -> None:
        await _in_thread(self.blocking.mark_done, key)

    async def mark_failed(self, key: str, error: dict[str, Any]) -> None:
        await _in_thread(self.blocking.mark_failed, key, error)

    async def unfinished(self, states: Collection[State] = UNFINISHED) -> list[JobRow]:
        return await _in_thread(self.blocking.unfinished, states)

    async def waiting(
        self, limit: int, sources: Collection[str], running: Collection[str]
    ) -> list[JobRow]:
        return await _in_thread(self.blocking.waiting, limit, sources, running)

    async def waiting_by(
        self, sources: Collection[str], running: Collection[str], place: Callable[[Job], str]
    ) -> Counter[str]:
        return await _in_thread(self.blocking.waiting_by, sources, running, place)

    async def backlog(
        self, sources: Collection[str], running: Collection[str]
    ) -> tuple[int, float | None]:
        return await _in_thread(self.blocking.backlog, sources, running)

    async def retry(self, selectors: list[str] | None = None) -> int:
        return await _in_thread(self.blocking.retry, selectors)

    async def summary(
        self, errors: int = 10, waiting: Collection[State] = UNFINISHED
    ) -> dict[str, Any]:
        return await _in_thread(self.blocking.summary, errors, waiting)


class AsyncDeliveries:
    """``Deliveries``' calls awaited, each in a thread; ``blocking`` is the store itself."""

    def __init__(self, deliveries: Deliveries) -> None:
        self.blocking = deliveries

    async def hold(
        self,
        token: str,
        key: str,
        status: str,
        source: str,
        json: str,
        md: str,
        payload: bytes,
        hooks: Sequence[str],
    ) -> int:
        return await _in_thread(
            self.blocking.hold, token, key, status, source, json, md, payload, hooks
        )

    async def release(self, event: int, moved: Mapping[str, str] | None = None) -> list[str]:
        return await _in_thread(self.blocking.release, event, moved)

    async def relocate(self, key: str, moved: Mapping[str, str]) -> None:
        await _in_thread(self.blocking.relocate, key, moved)

    async def drop(self, event: int) -> None:
        await _in_thread(self.blocking.drop, event)

    async def held_elsewhere(self, token: str) -> list[tuple[int, str, str]]:
        return await _in_thread(self.blocking.held_elsewhere, token)

    async def pending(self) -> list[tuple[str, int]]:
        return await _in_thread(self.blocking.pending)

    async def load(self, event: int, hook: str) -> HookDelivery | None:
        return await _in_thread(self.blocking.load, event, hook)

    async def start_attempt(self, event: int, hook: str) -> int:
        return await _in_thread(self.blocking.start_attempt, event, hook)

    async def give_back(self, event: int, hook: str) -> None:
        await _in_thread(self.blocking.give_back, event, hook)

    async def finish(self, event: int, hook: str, state: str, error: str | None) -> None:
        await _in_thread(self.blocking.finish, event, hook, state, error)
