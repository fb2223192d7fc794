"""The jobs the sources put into their ``Outbox``, taken and handed to the pipeline.

Control flows one way: a source returns the jobs it produces and never holds a callable of the
pipeline; this loop, at the pipeline's rank, answers each one with data: ``submit``'s ``Answer``
(admitted, or settled with nothing run), which the source acts on itself, and the jobs whose
sidecars lapsed for a source's question. Each is answered in a task of its own, so a slow admission
(the ledger locked by another process) holds up no other source.
"""

from __future__ import annotations

import asyncio

from ocrwatch.sources.base import Handoff, Lapsed, Outbox, Question, Reject, Submit


async def serve(outbox: Outbox, submit: Submit, reject: Reject, lapsed: Lapsed) -> None:
    """Answer every job and question put into ``outbox`` until cancelled (which cancels those being
    answered)."""
    answering: set[asyncio.Task[None]] = set()
    try:
        while True:
            taken = await outbox.get()
            answer = (
                _answer(taken, submit, reject)
                if isinstance(taken, Handoff)
                else _reply(taken, lapsed)
            )
            task = asyncio.create_task(answer, name="intake")
            answering.add(task)
            task.add_done_callback(answering.discard)
    finally:
        for task in answering:
            task.cancel()
        await asyncio.gather(*answering, return_exceptions=True)


async def _answer(delivery: Handoff, submit: Submit, reject: Reject) -> None:
    """One job admitted or given up; what that raised goes back to the source that put it in."""
    try:
        if delivery.error is None:
            said = await submit(delivery.job)
        else:
            await reject(delivery.job, delivery.error, delivery.attempts)
            said = None
    except BaseException as exc:
        delivery.answer(exc)
        if isinstance(exc, asyncio.CancelledError):
            raise
        return
    delivery.answer(said=said)


async def _reply(question: Question, lapsed: Lapsed) -> None:
    """Which of the question's jobs lapsed; what that raised goes back to the source that asked."""
    try:
        said = await lapsed(question.jobs)
    except BaseException as exc:
        question.answer(exc)
        if isinstance(exc, asyncio.CancelledError):
            raise
        return
    question.answer(said=said)
