"""The jobs the sources put into their ``Outbox``, taken and handed to the pipeline.

Control flows one way: a source returns the jobs it produces and never holds a callable of the
pipeline; this loop, at the pipeline's rank, answers each one with data: ``submit``'s ``Answer``
(admitted, or settled with nothing run), which the source acts on itself, the jobs whose sidecars
lapsed for a source's question, and the move a source asks for a document that failed before
(``SetAside``: its ``submit`` answered ``failed``). Each is answered in a task of its own, so a slow
admission (the ledger locked by another process) holds up no other source.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from ocrwatch.sources.base import (
    Answer,
    Handoff,
    Lapsed,
    Outbox,
    Question,
    Reject,
    SetsAside,
    Submit,
)

T = TypeVar("T", contravariant=True)


class Asker(Protocol[T]):
    """What a source put in and waits on (a ``Handoff``, a ``Question``, a ``SetAside``): one
    helper answers each."""

    def answer(self, exc: BaseException | None = None, said: T | None = None) -> None: ...


async def serve(
    outbox: Outbox, submit: Submit, reject: Reject, lapsed: Lapsed, set_aside: SetsAside
) -> None:
    """Answer every job, question and move put into ``outbox`` until cancelled (which cancels those
    being answered)."""
    answering: set[asyncio.Task[None]] = set()
    try:
        while True:
            taken = await outbox.get()
            if isinstance(taken, Handoff):
                answer = _forward(taken, functools.partial(_handled, taken, submit, reject))
            elif isinstance(taken, Question):
                answer = _forward(taken, functools.partial(lapsed, taken.jobs))
            else:
                answer = _forward(taken, functools.partial(set_aside, taken.request))
            task = asyncio.create_task(answer, name="intake")
            answering.add(task)
            task.add_done_callback(answering.discard)
    finally:
        for task in answering:
            task.cancel()
        await asyncio.gather(*answering, return_exceptions=True)


async def _forward(asked: Asker[T], answering: Callable[[], Awaitable[T]]) -> None:
    """What ``answering()`` says goes back to the source that put ``asked`` in, and so does what it
    raises (a cancellation too, which then goes on)."""
    try:
        said = await answering()
    except BaseException as exc:
        asked.answer(exc)
        if isinstance(exc, asyncio.CancelledError):
            raise
        return
    asked.answer(said=said)


async def _handled(delivery: Handoff, submit: Submit, reject: Reject) -> Answer | None:
    """One job admitted (``submit``'s answer) or given up (None)."""
    if delivery.error is None:
        return await submit(delivery.job)
    await reject(delivery.job, delivery.error, delivery.attempts)
    return None
