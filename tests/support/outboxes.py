"""A source under test puts its jobs into an ``Outbox``; ``fed`` answers them with the test's own
``submit``, ``reject`` and ``lapsed``, through the same ``intake.serve`` the daemon runs."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from ocrwatch.jobs import intake
from ocrwatch.sources.base import ADMITTED, Answer, Job, Outbox, Quarantine, Reject

_SERVING: set[asyncio.Task[None]] = set()


def fed(
    submit: Callable[[Job], Awaitable[Answer | None]],
    reject: Reject,
    lapsed: Callable[[Job], bool] = lambda job: False,
    set_aside: list[Quarantine] | None = None,
) -> Outbox:
    """An outbox whose jobs go to ``submit`` (and ``reject``) until the test's loop ends; a
    ``submit`` that says nothing admits each job. A source's question is answered by asking
    ``lapsed`` of each job; the moves it asks for are kept in ``set_aside``."""

    async def admit(job: Job) -> Answer:
        answer = await submit(job)
        return ADMITTED if answer is None else answer

    async def lapsed_of(jobs: list[Job]) -> list[Job]:
        return [job for job in jobs if await asyncio.to_thread(lapsed, job)]

    async def keep(request: Quarantine) -> None:
        if set_aside is not None:
            set_aside.append(request)

    outbox = Outbox()
    serving = intake.serve(outbox, admit, reject, lapsed_of, keep)
    task = asyncio.get_running_loop().create_task(serving)
    _SERVING.add(task)
    task.add_done_callback(_SERVING.discard)
    return outbox
