"""The jobs the sources put into their ``Outbox``, taken and handed to the pipeline.

Control flows one way: a source returns the jobs it produces and never holds a callable of the
pipeline; this loop, at the pipeline's rank, answers each one. Each job is answered in a task of its
own, so a slow admission (the ledger locked by another process) holds up no other source.
"""

from __future__ import annotations

import asyncio

from ocrwatch.sources.base import Delivery, Outbox, Reject, Submit


async def serve(outbox: Outbox, submit: Submit, reject: Reject) -> None:
    """Answer every job put into ``outbox`` until cancelled (which cancels those being answered)."""
    answering: set[asyncio.Task[None]] = set()
    try:
        while True:
            delivery = await outbox.get()
            task = asyncio.create_task(_answer(delivery, submit, reject), name="intake")
            answering.add(task)
            task.add_done_callback(answering.discard)
    finally:
        for task in answering:
            task.cancel()
        await asyncio.gather(*answering, return_exceptions=True)


async def _answer(delivery: Delivery, submit: Submit, reject: Reject) -> None:
    """One job admitted or given up; what that raised goes back to the source that put it in."""
    try:
        if delivery.error is None:
            await submit(delivery.job)
        else:
            await reject(delivery.job, delivery.error, delivery.attempts)
    except BaseException as exc:
        delivery.answer(exc)
        if isinstance(exc, asyncio.CancelledError):
            raise
        return
    delivery.answer()
