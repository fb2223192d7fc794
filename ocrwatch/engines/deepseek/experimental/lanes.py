"""Urgent pages ahead of a backlog inside vLLM's engine core.

vLLM's priority policy orders its waiting queue and preempts only when the KV cache runs out: a page
of a better lane waits for a free sequence slot (with pages of one length, the end of a whole wave)
and then decodes inside the full batch, whose every step takes about ten times a lone page's.
``install()`` wraps the scheduler's ``schedule()``, before vLLM's own logic runs each step:

- ``make_room``: when the waiting queue's head is of a better lane (``scheduler.lane_of`` of its
  priority) and every slot is taken, one request of the worst lane is preempted as vLLM preempts
  (its KV blocks freed, back to the waiting queue, its prompt and tokens so far recomputed when it
  resumes: one page's prefill);
- ``held_back``: while a better lane is running or waiting, only ``backlog_cap`` requests of worse
  lanes are scheduled; the others stay in the running list with their KV cache, unscheduled (as when
  a step's token budget runs out), and go on where they were once the better lane is gone. The total
  of running requests never exceeds ``max_num_seqs``.

The plugin installs it in vLLM's engine core when ``OCRWATCH_LANES`` is on (the engine sets it);
``held_back`` is the pure decision, shared with the scheduler's tests.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ocrwatch.pages.scheduler import backlog_cap, lane_of


def held_back(priorities: Sequence[int], waiting: int | None, cap: int) -> list[int]:
    """Positions (in running order) of the requests to leave out of the next step: beyond the first
    ``cap`` requests of worse lanes, while a better lane is running or waiting (``waiting``: the
    priority of the waiting queue's head, if any)."""
    lanes = [lane_of(priority) for priority in priorities]
    best = min([*lanes, *([lane_of(waiting)] if waiting is not None else [])], default=None)
    held: list[int] = []
    kept = 0
    for position, lane in enumerate(lanes):
        if lane == best:
            continue
        if kept < cap:
            kept += 1
        else:
            held.append(position)
    return held


def make_room(priorities: Sequence[int], waiting: int | None, limit: int) -> int | None:
    """Position of the running request to preempt so that ``waiting`` (the waiting queue head's
    priority) of a better lane can start: the worst priority, the latest among equals; None when a
    slot is free or no running request is of a worse lane."""
    if waiting is None or len(priorities) < limit or not priorities:
        return None
    worst = max(range(len(priorities)), key=lambda position: (priorities[position], position))
    return worst if lane_of(priorities[worst]) > lane_of(waiting) else None


def install() -> None:
    """Wrap ``vllm.v1.core.sched.scheduler.Scheduler.schedule`` (also ``AsyncScheduler``'s);
    idempotent."""
    from vllm.v1.core.sched.scheduler import Scheduler

    if getattr(Scheduler, "_ocrwatch_lanes", False):
        return
    original = Scheduler.schedule

    def schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        head = self.waiting.peek_request() if len(self.waiting) else None
        waiting = head.priority if head is not None else None
        victim = make_room(
            [request.priority for request in self.running], waiting, self.max_num_running_reqs
        )
        if victim is not None:
            self._preempt_request(self.running.pop(victim), time.monotonic())
        running = self.running
        cap = backlog_cap(self.scheduler_config.max_num_seqs)
        held = held_back([request.priority for request in running], waiting, cap)
        if not held:
            return original(self, *args, **kwargs)
        positions = set(held)
        paused = [request for position, request in enumerate(running) if position in positions]
        limit = self.max_num_running_reqs
        self.running = [
            request for position, request in enumerate(running) if position not in positions
        ]
        self.max_num_running_reqs = limit - len(paused)
        try:
            return original(self, *args, **kwargs)
        finally:
            self.running.extend(paused)
            self.max_num_running_reqs = limit

    Scheduler.schedule = schedule  # type: ignore[method-assign]
    Scheduler._ocrwatch_lanes = True  # type: ignore[attr-defined]
