"""The retry rule for a job's attempts: which failures are tried again, how often, and how long
apart.

A fault of the document is tried again up to ``[retry] attempts`` times; a fault of the place (disk
full, a folder that cannot be written) uses none of them and is tried for as long as it lasts, at
most ``backoff_max_seconds`` apart; an engine death is neither (its pages are requeued). A stop cuts
the pause short: the job has nothing in progress then, stays unfinished in the ledger and resumes at
the next start.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_exponential_jitter

from ocrwatch.config import RetryConfig
from ocrwatch.errors import EngineDead, PlaceFault, classify
from ocrwatch.infra.metrics import Metrics

log = structlog.get_logger()


def is_transient(exc: BaseException) -> bool:
    return (
        isinstance(exc, Exception) and classify(exc).retryable and not isinstance(exc, EngineDead)
    )


def is_place_fault(exc: BaseException | None) -> bool:
    return isinstance(exc, Exception) and isinstance(classify(exc), PlaceFault)


def attempts_of_a_job(
    retry: RetryConfig, metrics: Metrics, stopping: asyncio.Event
) -> AsyncRetrying:
    """The attempts of one job; ``stopping`` set ends a pause between them with
    ``CancelledError``."""
    spent = 0

    def stop(state: RetryCallState) -> bool:
        nonlocal spent
        if state.outcome is None or not is_place_fault(state.outcome.exception()):
            spent += 1
        return spent >= retry.attempts

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        error = classify(exc) if exc is not None else None
        place = exc is not None and is_place_fault(exc)
        metrics.retries.labels(stage="place" if place else "document").inc()
        log.warning(
            "job_retry",
            attempt=state.attempt_number,
            kind=error.kind if error else None,
            error=error.message if error else None,
            hint=error.hint if place and error else None,
            counts=not place,
            wait=round(state.upcoming_sleep, 2),
        )

    async def backoff(seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stopping.wait(), seconds)
        if stopping.is_set():
            raise asyncio.CancelledError

    return AsyncRetrying(
        stop=stop,
        wait=wait_exponential_jitter(
            multiplier=retry.backoff_initial_seconds, max=retry.backoff_max_seconds
        ),
        retry=retry_if_exception(is_transient),
        before_sleep=before_sleep,
        sleep=backoff,
        reraise=True,
    )
