"""Urgent pages ahead of a backlog: a one-page document of a better lane dropped while a 300-page
document fills the engine. The engine is a test double of vLLM's continuous batching (at most
INFLIGHT sequences, a waiting queue in priority order) whose step time grows with the pages it
decodes, on a virtual clock (the figures are steps, not wall time); with ``lanes`` it makes room and
leaves worse lanes out of its steps as ``engines.deepseek.experimental.lanes`` makes vLLM do."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from PIL import Image

from ocrwatch.engines.base import PageRequest
from ocrwatch.engines.deepseek.experimental.lanes import held_back, make_room
from ocrwatch.pages.scheduler import Budget, DocumentOrder, PageScheduler, backlog_cap, lane_of
from tests.support.pages import added, answered
from tests.test_scheduler import FakePage

TOKENS = 40
BASE = 1.0
PER_PAGE = 0.3
INFLIGHT = 32
URGENT, BACKLOG = 90, 50


def render(index: int) -> FakePage:
    return FakePage(index, Image.new("L", (4, 4)))


@dataclass
class _Run:
    request_id: str
    priority: int
    remaining: int
    future: asyncio.Future[float]


@dataclass
class BatchEngine:
    """Every running page advances one token a step; a step costs BASE + PER_PAGE × the pages in it.
    A preempted page starts over (pessimistic: vLLM only recomputes its prefill)."""

    lanes: bool
    clock: float = 0.0
    running: list[_Run] = field(default_factory=list)
    waiting: list[_Run] = field(default_factory=list)
    finished: dict[str, float] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, doc: object, request: PageRequest) -> str:
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.waiting.append(_Run(request.request_id, request.priority, TOKENS, future))
        self.wake.set()
        self.finished[request.request_id] = await future
        return request.request_id

    def admit(self) -> set[int]:
        """One scheduling decision: make room, hold back, admit; returns the positions left out of
        the step."""
        self.waiting.sort(key=lambda run: run.priority)  # stable: arrival order among equals
        head = self.waiting[0].priority if self.waiting else None
        held: set[int] = set()
        if self.lanes:
            victim = make_room([run.priority for run in self.running], head, INFLIGHT)
            if victim is not None:
                preempted = self.running.pop(victim)
                preempted.remaining = TOKENS
                self.waiting.insert(0, preempted)
                self.waiting.sort(key=lambda run: run.priority)
            held = set(
                held_back([run.priority for run in self.running], head, backlog_cap(INFLIGHT))
            )
        while self.waiting and len(self.running) < INFLIGHT:
            self.running.append(self.waiting.pop(0))
        return held

    async def run(self, scheduler: PageScheduler, on_step: Callable[[], None]) -> None:
        while True:
            await settle(scheduler)
            if not self.running and not self.waiting:
                self.wake.clear()
                await self.wake.wait()
                continue
            held = self.admit()
            batch = [run for position, run in enumerate(self.running) if position not in held]
            self.clock += BASE + PER_PAGE * len(batch)
            for run in batch:
                run.remaining -= 1
                if run.remaining == 0:
                    self.running.remove(run)
                    run.future.set_result(self.clock)
            on_step()


async def settle(scheduler: PageScheduler) -> None:
    """Let the scheduler render and dispatch everything it may before the next step, so the virtual
    clock does not depend on how fast this machine renders."""
    for _ in range(3):
        for _ in range(8):
            await asyncio.sleep(0)
        while scheduler.budget.rendering:
            await asyncio.sleep(0.001)


async def scenario(*, big_pages: int, urgent_after: int | None, lanes: bool) -> dict[str, float]:
    """Virtual seconds: the urgent document from its drop to its page's end, and the big document's
    run."""
    engine = BatchEngine(lanes=lanes)
    sized = PageScheduler(
        max_inflight=INFLIGHT, render_ahead=16, render_workers=2, ageing_seconds=30
    )
    scheduler = answered(sized, engine)
    now = time.time()
    out: dict[str, float] = {}
    urgent: list[object] = []

    def on_step() -> None:
        done = sum(1 for key in engine.finished if key.startswith("big/"))
        if urgent_after is not None and not urgent and done >= urgent_after:
            out["urgent_dropped"] = engine.clock
            urgent.append(
                added(
                    scheduler,
                    "urgent",
                    priority=URGENT,
                    detected_at=now + 1,
                    pages=1,
                    prompt="p",
                    render=render,
                )
            )

    stepper = asyncio.ensure_future(engine.run(scheduler, on_step))
    try:
        if big_pages:
            big = added(
                scheduler,
                "big",
                priority=BACKLOG,
                detected_at=now,
                pages=big_pages,
                prompt="p",
                render=render,
            )
            await asyncio.wait_for(big.future, 120)
            out["big"] = engine.clock
            if urgent_after is None:
                return out
        else:
            out["urgent_dropped"] = 0.0
            urgent.append(
                added(
                    scheduler,
                    "urgent",
                    priority=URGENT,
                    detected_at=now,
                    pages=1,
                    prompt="p",
                    render=render,
                )
            )
        await asyncio.wait_for(urgent[0].future, 120)  # type: ignore[attr-defined]
        out["urgent"] = engine.finished["urgent/p0"] - out["urgent_dropped"]
    finally:
        stepper.cancel()
        await scheduler.close()
    return out


async def test_an_urgent_page_takes_at_most_thrice_its_time_alone_and_the_backlog_keeps_pace() -> (
    None
):
    alone = (await scenario(big_pages=0, urgent_after=None, lanes=True))["urgent"]
    assert alone == pytest.approx(TOKENS * (BASE + PER_PAGE))
    baseline = (await scenario(big_pages=300, urgent_after=None, lanes=True))["big"]
    loaded = await scenario(big_pages=300, urgent_after=40, lanes=True)
    assert loaded["urgent"] <= 3 * alone, (loaded, alone)
    assert loaded["big"] <= 1.10 * baseline, (loaded, baseline)


async def test_without_the_engine_making_room_the_urgent_page_decodes_in_the_full_batch() -> None:
    """Why the engine takes part: the scheduler alone cannot shorten the steps of the pages already
    inside."""
    alone = TOKENS * (BASE + PER_PAGE)
    loaded = await scenario(big_pages=300, urgent_after=40, lanes=False)
    assert loaded["urgent"] > 3 * alone


def test_a_worse_lane_is_held_to_an_eighth_while_a_better_one_has_work_and_that_one_gets_in() -> (
    None
):
    budget = Budget(max_inflight=32, render_ahead=16, render_workers=2, ready=1)
    urgent, backlog = (
        DocumentOrder.of(URGENT, 0, 1, 30, 1).lane,
        DocumentOrder.of(BACKLOG, 0, 300, 30, 2).lane,
    )
    budget.inflight, budget.inflight_lanes[backlog] = 10, 10
    assert budget.may_dispatch(backlog, best_lane=backlog)
    assert not budget.may_dispatch(backlog, best_lane=urgent)
    assert budget.may_dispatch(urgent, best_lane=urgent)
    budget.inflight, budget.inflight_lanes[backlog] = 3, 3
    assert budget.may_dispatch(backlog, best_lane=urgent)
    budget.inflight, budget.inflight_lanes[backlog] = 32, 32
    assert budget.may_dispatch(urgent, best_lane=urgent)  # the engine makes room
    assert not budget.may_dispatch(backlog, best_lane=backlog)
    budget.inflight, budget.inflight_lanes[urgent] = 64, 32
    assert not budget.may_dispatch(urgent, best_lane=urgent)


def test_held_back_keeps_the_better_lane_and_the_first_of_the_rest() -> None:
    epoch = 0.0
    urgent = DocumentOrder.of(URGENT, 0, 1, 30, 1).engine_priority(epoch)
    backlog = DocumentOrder.of(BACKLOG, 0, 300, 30, 2).engine_priority(epoch)
    assert lane_of(urgent) < lane_of(backlog)
    assert held_back([backlog] * 5, None, cap=2) == []
    assert held_back([backlog, backlog, urgent, backlog, backlog], None, cap=2) == [3, 4]
    assert held_back([backlog] * 4, urgent, cap=1) == [1, 2, 3]
    assert held_back([backlog] * 4, backlog, cap=1) == []
    assert held_back([], None, cap=1) == []
