"""A scheduler under test asks for its pages to be rendered (``PageScheduler.render_asks``) and
recognised (``page_asks``); ``answered`` answers them, with the page maker ``added`` gave each
document and the test's own ``recognize``, as the pipeline's ``Recognition`` answers them with each
document's ``pagetext.Pages`` and the engine."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from ocrwatch.engines.base import PageRequest
from ocrwatch.pages.scheduler import Document, PageAsk, PageScheduler, RenderAsk

_ANSWERING: set[asyncio.Task[Any]] = set()
_MAKERS: dict[tuple[int, str], Callable[[int], Any]] = {}  # by scheduler and document


Recognize = Callable[[Document, PageRequest], Awaitable[Any]]


def added(
    scheduler: PageScheduler, doc_id: str, *, render: Callable[[int], Any], **order: Any
) -> Document:
    """``scheduler.add(doc_id, **order)``, its pages made by ``render`` when the scheduler asks."""
    _MAKERS[id(scheduler), doc_id] = render
    return scheduler.add(doc_id, **order)


def answered(scheduler: PageScheduler, recognize: Recognize) -> PageScheduler:
    """``scheduler``, its pages rendered by the makers ``added`` gave (in threads) and recognised
    by ``recognize`` (no figures) while the test runs."""

    async def answer(ask: PageAsk) -> tuple[Any, tuple[Any, ...]]:
        return await recognize(ask.doc, ask.request), ()

    async def make(ask: RenderAsk) -> Any:
        return await asyncio.to_thread(_MAKERS[id(scheduler), ask.doc.doc_id], ask.index)

    def hold(task: asyncio.Task[Any], ask: PageAsk | RenderAsk) -> None:
        _ANSWERING.add(task)
        task.add_done_callback(_ANSWERING.discard)
        task.add_done_callback(ask.take)
        ask.future.add_done_callback(lambda _, task=task: task.cancel())

    async def serve() -> None:
        async for ask in scheduler.page_asks():
            hold(asyncio.create_task(answer(ask)), ask)

    async def render() -> None:
        async for ask in scheduler.render_asks():
            hold(asyncio.create_task(make(ask)), ask)

    for loop in (serve(), render()):
        _ANSWERING.add(asyncio.get_running_loop().create_task(loop))
    return scheduler
