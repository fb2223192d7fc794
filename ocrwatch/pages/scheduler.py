"""The page scheduler: one priority queue of pages across every active document.

It keeps the engine full without flooding it. Two bounds hold whatever arrives: at most
``max_inflight`` pages inside the engine, and at most ``render_ahead`` pages rendered (or rendering)
but not yet handed to the engine. A document that outranks every rendered page may overdraw that by
up to ``render_workers`` pages, so a one-page document arriving behind a large one waits for one
engine slot, not for one to free its render slot and then another; memory is bounded by
``render_ahead + render_workers`` page images. Rendering overlaps recognition.

The scheduler decides which page is rendered when, and which is recognised when; it does neither
itself. Both are asks to the layer above, answered with data: ``render_asks`` yields each page to
render (``RenderAsk``: the layer above holds each document's page maker and its render threads) and
``page_asks`` each page to recognise (``PageAsk``). Nothing of a higher layer is handed down.

Order: the inbox's priority lane first (higher lane wins outright), then the earliest *virtual
deadline*: ``detected_at + ageing_seconds * log2(1 + pages)``. Small documents get early deadlines,
so they overtake a large one in progress; but a large document's deadline is fixed at arrival, so
later arrivals eventually queue behind it and it is never starved. The decision logic
(``DocumentOrder``, ``Budget``) is pure.

Urgent work ahead of a backlog: order alone cannot make a page of a higher lane fast, because an
engine's step time grows with the pages inside it. While a document of a better lane is open, pages
of worse lanes are admitted only while fewer than ``backlog_cap`` (an eighth of ``max_inflight``) of
them are in flight, and pages of the better lane go to the engine even when worse lanes fill it; the
engine makes room and leaves the backlog beyond the cap out of its steps
(``engines.deepseek.lanes``, which reads the lane back from the priority with ``lane_of``). Up to
``max_inflight`` pages of the best lane may so join the backlog's.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import math
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from ocrwatch.engines.base import PageRequest, Sampling
from ocrwatch.errors import EngineDead, OcrwatchError, classify
from ocrwatch.pages.orientation import AS_RENDERED, Orientation

if TYPE_CHECKING:
    from ocrwatch.pages.render import RenderedPage

log = structlog.get_logger()

LANE_STRIDE = 10**8
"""``engine_priority`` is ``(lane + 100) * LANE_STRIDE`` plus a deadline below the stride."""
BACKLOG_SHARE = 8
"""While a better lane has work, worse lanes keep at most 1/BACKLOG_SHARE of the engine's pages in
flight."""


def lane_of(engine_priority: int) -> int:
    """The lane an ``engine_priority`` encodes; lower is more urgent, as the priority itself."""
    return engine_priority // LANE_STRIDE


def backlog_cap(max_inflight: int) -> int:
    """Pages of worse lanes kept in flight while a better lane has work: few enough that the
    engine's step, which grows with its batch, stays short for the urgent pages, enough that the
    backlog keeps moving."""
    return max(1, max_inflight // BACKLOG_SHARE)


def virtual_deadline(detected_at: float, pages: int, ageing_seconds: float) -> float:
    return detected_at + ageing_seconds * math.log2(1 + max(pages, 1))


@dataclass(frozen=True, order=True)
class DocumentOrder:
    """Sort key of a document: lane first (negated: higher priority sorts first), then deadline,
    then arrival."""

    lane: int
    deadline: float
    seq: int

    @classmethod
    def of(
        cls, priority: int, detected_at: float, pages: int, ageing_seconds: float, seq: int
    ) -> DocumentOrder:
        return cls(-priority, virtual_deadline(detected_at, pages, ageing_seconds), seq)

    def engine_priority(self, epoch: float) -> int:
        """An integer for the engine where lower runs first, preserving this order (lane, then
        deadline)."""
        return (self.lane + 100) * LANE_STRIDE + max(
            0, min(LANE_STRIDE - 1, int((self.deadline - epoch) * 10))
        )


def auto_render_workers(cpus: int) -> int:
    """``render_workers = "auto"``: half the CPUs, 2 to 16. Rendering a page takes 0.1-0.3 s of a
    core, so a fixed two would cap a GPU engine, which reads pages faster than two cores render
    them, on a many-core host; on a 2-core CPU machine Tesseract needs the cores more than rendering
    does (render is ~5 % of its time)."""
    return max(2, min(16, cpus // 2))


def auto_render_ahead(max_inflight: int) -> int:
    """``render_ahead = "auto"``: half the engine's pages in flight, at least 16. Pages of the same
    length finish together, so the engine asks for many at once; a small fixed buffer would leave a
    large engine waiting for each refill at the render rate. Costs one page image each (~6 MB at 144
    dpi)."""
    return max(16, max_inflight // 2)


def auto_active_documents(max_inflight: int) -> int:
    """``max_active_documents = "auto"``: as many documents as pages in flight, at least 64, so
    one-page documents can fill the engine: with fewer documents open than the engine has page
    slots, slots stay empty."""
    return max(64, max_inflight)


@dataclass
class Budget:
    """The two bounds and the backlog's share; pure counters so the decisions can be tested without
    I/O."""

    max_inflight: int
    render_ahead: int
    render_workers: int
    inflight: int = 0
    rendering: int = 0
    ready: int = 0
    inflight_lanes: Counter[int] = field(default_factory=Counter)

    @property
    def backlog_cap(self) -> int:
        return backlog_cap(self.max_inflight)

    def may_dispatch(self, lane: int = 0, best_lane: int | None = None) -> bool:
        """Room for a page of ``lane`` while ``best_lane`` is the best lane with an open document. A
        page of the best lane counts only its own lane's pages against ``max_inflight``: pages of
        worse lanes fill the engine, which makes room for it (``engines.deepseek.lanes``). A page of
        a worse lane also needs fewer than ``backlog_cap`` pages of worse lanes in flight."""
        if self.ready <= 0:
            return False
        if best_lane is None:
            return self.inflight < self.max_inflight
        if lane <= best_lane:
            return self.inflight_lanes[lane] < self.max_inflight
        backlog = self.inflight - self.inflight_lanes[best_lane]
        return self.inflight < self.max_inflight and backlog < self.backlog_cap

    def may_render(self) -> bool:
        return (
            self.rendering < self.render_workers and self.rendering + self.ready < self.render_ahead
        )

    def may_overdraw(self) -> bool:
        """Room for a page that outranks every rendered one, beyond ``render_ahead``."""
        buffered = self.rendering + self.ready
        return (
            self.rendering < self.render_workers
            and buffered < self.render_ahead + self.render_workers
        )


@dataclass
class PageOutcome:
    """A finished page: the rendered geometry, what the recognition layer returned, and what
    ``extract`` took from the page image while it was still held (the figures cut out of it)."""

    index: int
    width: int
    height: int
    dpi: float | None
    render_seconds: float
    result: Any
    figures: tuple[Any, ...] = ()
    dpi_from: str = "render"  # render.RenderedPage's
    orientation: Orientation = AS_RENDERED  # render.RenderedPage's: how it was turned to be read
    text_source: str = "ocr"  # "layer": the page's own text stood for its recognition
    text_check: dict[str, Any] | None = None  # pagetext.TextCheck.record(): why, where one ran
    source_dpi: tuple[float, float] | None = None  # render.RenderedPage's: an image's unequal ones


@dataclass(frozen=True)
class Checked:
    """A page whose own text was checked before it was rendered (``pagetext``): the check's record,
    and the image for the engine, or the finished page where its text stood for its recognition
    (``taken``: no image, no engine)."""

    check: dict[str, Any]
    page: RenderedPage | None = None
    taken: PageOutcome | None = None


@dataclass(eq=False)
class RenderAsk:
    """A page the scheduler asks the layer above to render: page ``index`` of ``doc``, the rendered
    page (or the page its text check finished, ``Checked``) into ``future``. The scheduler cancels
    the future when nobody waits for the page any more; the answerer then drops its work
    (``take``)."""

    doc: Document
    index: int
    future: asyncio.Future[RenderedPage | Checked]

    def take(self, work: asyncio.Future[RenderedPage | Checked]) -> None:
        """The answer ``work`` gave (its result, its exception, or that it was cancelled)."""
        _carry(work, self.future)


@dataclass(eq=False)
class PageAsk:
    """A page the scheduler asks the layer above to recognise: ``future`` takes the engine's result
    and the figures kept of the page image (it is let go right after). The scheduler cancels the
    future to abort the page; the answerer then stops its work (``take``)."""

    doc: Document
    request: PageRequest
    future: asyncio.Future[tuple[Any, tuple[Any, ...]]]

    def take(self, work: asyncio.Future[tuple[Any, tuple[Any, ...]]]) -> None:
        """The answer ``work`` gave (its result, its exception, or that it was cancelled)."""
        _carry(work, self.future)


def _carry(work: asyncio.Future[Any], future: asyncio.Future[Any]) -> None:
    """``work``'s ending, whichever it is, carried into ``future`` (unless that has ended)."""
    if future.done():
        return
    if work.cancelled():
        future.cancel()
    elif (error := work.exception()) is not None:
        future.set_exception(error)
    else:
        future.set_result(work.result())


@dataclass(eq=False)
class Document:
    """A document's pages inside the scheduler; its future resolves with every page, in order."""

    doc_id: str
    order: DocumentOrder
    pages: int
    prompt: str
    future: asyncio.Future[list[PageOutcome]]
    next_page: int = 0
    outcomes: dict[int, PageOutcome] = field(default_factory=dict)
    inflight: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    closed: bool = False
    retired: bool = False
    # when its pages came in: its rate, its ETA
    added: float = field(default_factory=time.monotonic)

    @property
    def unrendered(self) -> bool:
        return not self.closed and self.next_page < self.pages


@dataclass
class _Ready:
    doc: Document
    page: RenderedPage
    check: dict[str, Any] | None = None


class PageScheduler:
    """Drives render workers and engine requests for all documents. Runs on the daemon's event loop
    only."""

    def __init__(
        self, *, max_inflight: int, render_ahead: int, render_workers: int, ageing_seconds: float
    ) -> None:
        self._asks: asyncio.Queue[PageAsk] = asyncio.Queue()
        self._render_asks: asyncio.Queue[RenderAsk] = asyncio.Queue()
        self._deaths: asyncio.Queue[EngineDead] = asyncio.Queue()
        self.budget = Budget(max_inflight, max(render_ahead, 1), render_workers)
        self.ageing_seconds = ageing_seconds
        self._seq = itertools.count()
        self._epoch = 0.0
        self._ready: list[tuple[DocumentOrder, int, _Ready]] = []
        self._render_queue: list[tuple[DocumentOrder, Document]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._engine_ready = asyncio.Event()
        self._engine_ready.set()
        self._open_lanes: Counter[int] = Counter()

    # --- public surface ---------------------------------------------------------------------------

    def add(
        self,
        doc_id: str,
        *,
        priority: int,
        detected_at: float,
        pages: int,
        prompt: str,
    ) -> Document:
        """A document of ``pages`` pages, each asked to be rendered (``render_asks``) as its turn
        comes, then recognised (``page_asks``); its future resolves with every page."""
        if not self._epoch:
            self._epoch = detected_at
        order = DocumentOrder.of(priority, detected_at, pages, self.ageing_seconds, next(self._seq))
        doc = Document(doc_id, order, pages, prompt, asyncio.get_running_loop().create_future())
        self._open_lanes[order.lane] += 1
        heapq.heappush(self._render_queue, (order, doc))
        self._pump()
        return doc

    async def cancel(self, doc: Document) -> list[str]:
        """Stop a document: drop its queued pages and cancel its in-flight requests; returns their
        ids."""
        doc.closed = True
        self._retire(doc)
        dropped = [entry for entry in self._ready if entry[2].doc is doc]
        if dropped:
            self._ready = [entry for entry in self._ready if entry[2].doc is not doc]
            heapq.heapify(self._ready)
            self.budget.ready -= len(dropped)
        ids = list(doc.inflight)
        for task in list(doc.inflight.values()):
            task.cancel()
        if ids:
            await asyncio.gather(*doc.inflight.values(), return_exceptions=True)
        if not doc.future.done():
            doc.future.cancel()
        self._pump()
        return ids

    def pause_engine(self) -> None:
        self._engine_ready.clear()

    def resume_engine(self) -> None:
        self._engine_ready.set()
        self._pump()

    async def render_asks(self) -> AsyncIterator[RenderAsk]:
        """Each page to render, for the layer above to answer (``RenderAsk``) in one of its
        ``render_workers`` threads, as the bounds let it start."""
        while True:
            yield await self._render_asks.get()

    async def page_asks(self) -> AsyncIterator[PageAsk]:
        """Each page to recognise, for the layer above to answer (``PageAsk``), as dispatched."""
        while True:
            yield await self._asks.get()

    async def engine_deaths(self) -> AsyncIterator[EngineDead]:
        """Each death of the engine, for the layer above to rebuild it (then ``resume_engine``).
        Dispatch is paused when a page reports the death: the pages reporting it meanwhile are
        requeued without another."""
        while True:
            yield await self._deaths.get()

    def requeue_inflight(self) -> int:
        """After an engine death: cancel every in-flight request; each page goes back to the ready
        queue."""
        count = 0
        for task in list(self._tasks):
            if task.get_name().startswith("recognize:"):
                task.cancel()
                count += 1
        return count

    @property
    def depth(self) -> dict[str, int]:
        return {
            "render_queue": sum(
                doc.pages - doc.next_page for _, doc in self._render_queue if doc.unrendered
            ),
            "rendering": self.budget.rendering,
            "ready": self.budget.ready,
            "inflight": self.budget.inflight,
        }

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # --- the pump: every state change ends here ---------------------------------------------------

    def _pump(self) -> None:
        best = self._best_lane()
        while (
            self._engine_ready.is_set()
            and self._ready
            and self.budget.may_dispatch(self._ready[0][0].lane, best)
        ):
            _, _, ready = heapq.heappop(self._ready)
            self.budget.ready -= 1
            self._dispatch(ready)
        while (doc := self._next_to_render()) is not None and self._may_render(doc):
            heapq.heappop(self._render_queue)
            index = doc.next_page
            doc.next_page += 1
            if doc.unrendered:
                heapq.heappush(self._render_queue, (doc.order, doc))
            self.budget.rendering += 1
            self._spawn(self._render(doc, index), f"render:{doc.doc_id}:{index}")

    def _best_lane(self) -> int | None:
        """The best lane with an open document (work waiting, rendering or in flight)."""
        return min((lane for lane, count in self._open_lanes.items() if count > 0), default=None)

    def _retire(self, doc: Document) -> None:
        """A document leaves its lane once, whichever way it closes."""
        if not doc.retired:
            doc.retired = True
            self._open_lanes[doc.order.lane] -= 1

    def _next_to_render(self) -> Document | None:
        """The best document with pages left to render, left on its heap (finished and closed ones
        are dropped)."""
        while self._render_queue and not self._render_queue[0][1].unrendered:
            heapq.heappop(self._render_queue)
        return self._render_queue[0][1] if self._render_queue else None

    def _may_render(self, doc: Document) -> bool:
        if self.budget.may_render():
            return True
        return self.budget.may_overdraw() and (not self._ready or doc.order < self._ready[0][0])

    def _spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _render(self, doc: Document, index: int) -> None:
        """Page ``index`` of ``doc``, asked of the layer above; cancelling this task cancels the
        ask."""
        ask = RenderAsk(doc, index, asyncio.get_running_loop().create_future())
        self._render_asks.put_nowait(ask)
        try:
            page = await ask.future
        except Exception as exc:  # any failure of one page fails its document, never the scheduler
            self.budget.rendering -= 1
            self._fail(doc, classify(exc))
            self._pump()
            return
        except asyncio.CancelledError:
            self.budget.rendering -= 1
            raise
        self.budget.rendering -= 1
        if doc.closed:
            self._pump()
            return
        check = None
        if isinstance(page, Checked):
            if page.taken is not None:
                self._finish(doc, page.taken)
                self._pump()
                return
            assert page.page is not None
            check, page = page.check, page.page
        heapq.heappush(self._ready, (doc.order, index, _Ready(doc, page, check)))
        self.budget.ready += 1
        self._pump()

    def _dispatch(self, ready: _Ready) -> None:
        doc, page = ready.doc, ready.page
        request = PageRequest(
            request_id=f"{doc.doc_id}/p{page.index}",
            image=page.image,
            prompt=doc.prompt,
            priority=doc.order.engine_priority(self._epoch),
            sampling=Sampling(),
            page_index=page.index,
            script=page.orientation.script,
        )
        self.budget.inflight += 1
        self.budget.inflight_lanes[doc.order.lane] += 1
        task = self._spawn(self._recognize_page(doc, request), f"recognize:{request.request_id}")
        doc.inflight[request.request_id] = task
        task.add_done_callback(functools.partial(self._page_done, ready, request))

    async def _recognize_page(
        self, doc: Document, request: PageRequest
    ) -> tuple[Any, tuple[Any, ...]]:
        """Asked of the layer above; cancelling this task cancels the ask, and so the answer."""
        ask = PageAsk(doc, request, asyncio.get_running_loop().create_future())
        self._asks.put_nowait(ask)
        return await ask.future

    def _page_done(self, ready: _Ready, request: PageRequest, task: asyncio.Task[Any]) -> None:
        """Bookkeeping in a done-callback, so it also runs for a task cancelled before its first
        step."""
        doc, page = ready.doc, ready.page
        self.budget.inflight -= 1
        self.budget.inflight_lanes[doc.order.lane] -= 1
        doc.inflight.pop(request.request_id, None)
        requeue = False
        if task.cancelled():
            requeue = not doc.closed
        elif isinstance(error := task.exception(), EngineDead):
            requeue = True
            log.warning(
                "page_requeued",
                job_id=doc.doc_id,
                page=page.index + 1,
                kind=error.kind,
                error=error.message,
            )
            if self._engine_ready.is_set():  # one death however many pages report it
                self.pause_engine()
                self._deaths.put_nowait(error)
        elif error is not None:
            self._fail(doc, classify(error))
        else:
            result, figures = task.result()
            self._finish(
                doc,
                PageOutcome(
                    page.index,
                    page.width,
                    page.height,
                    page.dpi,
                    page.seconds,
                    result,
                    figures,
                    page.dpi_from,
                    page.orientation,
                    text_check=ready.check,
                    source_dpi=page.source_dpi,
                ),
            )
            request.image = None  # type: ignore[assignment]  # its pixels freed: the page is read
        if requeue and not doc.closed:
            heapq.heappush(self._ready, (doc.order, page.index, ready))
            self.budget.ready += 1
        self._pump()

    def _finish(self, doc: Document, outcome: PageOutcome) -> None:
        doc.outcomes[outcome.index] = outcome
        if len(doc.outcomes) == doc.pages and not doc.future.done():
            doc.closed = True
            self._retire(doc)
            doc.future.set_result([doc.outcomes[i] for i in range(doc.pages)])

    def _fail(self, doc: Document, error: OcrwatchError) -> None:
        if doc.future.done():
            return
        doc.closed = True
        self._retire(doc)
        doc.future.set_exception(error)
        for task in list(doc.inflight.values()):
            task.cancel()
