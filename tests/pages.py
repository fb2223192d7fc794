"""A scheduler under test asks for its pages (``PageScheduler.page_asks``); ``answered`` answers
them with the test's own ``recognize``, as the pipeline answers them with the engine."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from ocrwatch.engines.base import PageRequest
from ocrwatch.pages.scheduler import Document, PageAsk, PageScheduler

_ANSWERING: set[asyncio.Task[Any]] = set()


Recognize = Callable[[Document, PageRequest], Awaitable[Any]]


def answered(scheduler: PageScheduler, recognize: Recognize) -> PageScheduler:
    """``scheduler``, its pages recognised by ``recognize`` (no figures) while the test runs."""

    async def answer(ask: PageAsk) -> tuple[Any, tuple[Any, ...]]:
        return await recognize(ask.doc, ask.request), ()

    async def serve() -> None:
        async for ask in scheduler.page_asks():
            task = asyncio.create_task(answer(ask))
            _ANSWERING.add(task)
            task.add_done_callback(_ANSWERING.discard)
            task.add_done_callback(ask.take)
            ask.future.add_done_callback(lambda _, task=task: task.cancel())

    loop = asyncio.get_running_loop().create_task(serve())
    _ANSWERING.add(loop)
    return scheduler
