"""The page retry ladder: a page whose output loops or runs out of tokens is tried again on the next
rung.

This is the content-retry layer, engine-agnostic, and the only place that sets per-attempt
sampling: the rungs (each a ``Sampling``) and the judge of each output are the engine's own, its
``EngineSpec``'s ``rungs`` and ``judge``; an engine uses the sampling it is given. An attempt that
fails on its own (``EngineFailed``, or no answer within the page timeout, which aborts the request)
counts as a failed rung too. ``EngineDead`` is not handled here: it propagates so the daemon
rebuilds the engine and requeues the page. A page that fails every rung is ``failed``; its document
becomes ``partial``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

import structlog

from ocrwatch.engines.base import Engine, Judge, PageRequest, Recognition
from ocrwatch.engines.sampling import Sampling
from ocrwatch.errors import EngineFailed, PageFailed, PageTimeout

log = structlog.get_logger()


@dataclass
class PageResult:
    """What the ladder made of one page: the last output obtained, every attempt, and the
    verdict."""

    status: Literal["ok", "failed"]
    recognition: Recognition | None
    attempts: list[dict[str, Any]]
    error: dict[str, Any] | None = None


async def recognize_page(
    engine: Engine,
    request: PageRequest,
    rungs: Sequence[Sampling],
    timeout_s: float,
    judge: Judge,
    *,
    sampled: bool = True,
) -> PageResult:
    """Run one attempt per rung (request id ``{request_id}/a{n}``) until one is good or the rungs
    run out. ``sampled``: the engine samples as its rung says (``EngineSpec.prompted``), so each
    try records its sampling."""
    attempts: list[dict[str, Any]] = []
    last: Recognition | None = None
    for number, sampling in enumerate(rungs):
        page = replace(request, request_id=f"{request.request_id}/a{number}", sampling=sampling)
        attempt: dict[str, Any] = {"rung": number, "request_id": page.request_id}
        if sampled:
            attempt["sampling"] = asdict(sampling)
        attempts.append(attempt)
        started = time.monotonic()
        try:
            rec = await _attempt(engine, page, timeout_s)
        except (EngineFailed, PageTimeout) as exc:
            attempt.update(
                outcome=exc.kind, seconds=round(time.monotonic() - started, 4), error=exc.as_dict()
            )
            log.warning(
                "page_attempt_failed",
                request_id=page.request_id,
                rung=number,
                kind=exc.kind,
                error=exc.message,
            )
            continue
        reason = await asyncio.to_thread(judge, rec)
        attempt.update(
            outcome=reason or "ok",
            seconds=round(time.monotonic() - started, 4),
            prompt_tokens=rec.prompt_tokens,
            completion_tokens=rec.completion_tokens,
            finish_reason=rec.finish_reason,
        )
        last = rec
        if reason is None:
            return PageResult("ok", rec, attempts)
        if number + 1 < len(rungs):
            log.warning(
                "page_retry",
                request_id=page.request_id,
                rung=number,
                reason=reason,
                next=asdict(rungs[number + 1]),
            )
    outcomes = ", ".join(str(attempt.get("outcome")) for attempt in attempts) or "no rungs"
    error = PageFailed(f"{request.request_id}: every rung of the retry ladder failed ({outcomes})")
    log.warning(
        "page_failed", request_id=request.request_id, attempts=len(attempts), outcomes=outcomes
    )
    return PageResult("failed", last, attempts, error.as_dict())


async def _attempt(engine: Engine, page: PageRequest, timeout_s: float) -> Recognition:
    """One attempt under the page timeout; on expiry the engine request is aborted, then
    ``PageTimeout``."""
    try:
        return await asyncio.wait_for(_recognize(engine, page), timeout_s)
    except asyncio.TimeoutError:
        await engine.abort(page.request_id)
        raise PageTimeout(f"{page.request_id}: no answer within {timeout_s:g} s") from None


async def _recognize(engine: Engine, page: PageRequest) -> Recognition:
    """The engine's own timeout, told apart from the page timeout before ``wait_for`` sees it (the
    two ``TimeoutError``s are one class from Python 3.11 on, two before)."""
    try:
        return await engine.recognize(page)
    except (TimeoutError, asyncio.TimeoutError) as exc:
        raise EngineFailed(f"{page.request_id}: engine timed out internally: {exc}") from exc
