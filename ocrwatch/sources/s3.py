"""S3 as a source, SQS transport: object-created events delivered to an SQS queue, long-polled.

A message is deleted only once every job it announced is finished (sidecars written or given up);
while a job runs, a heartbeat keeps the message invisible; a job finished with ``retry`` leaves its
message to reappear when the visibility timeout lapses. SQS is a distributed work queue: several
daemons may consume one queue, each message goes to one of them. A message delivered more than
``max_receives`` times is given up: its jobs go to ``reject`` (the pipeline writes their error
sidecars), or the message is left to the queue's dead-letter policy.

The SQS client is made when the source starts, never at import; its long poll runs in the source's
own threads, which never delay shutdown. The polling loop itself never gives up
(``s3_unreachable``, then ``s3_reachable``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_never,
    wait_exponential,
    wait_random,
)

from ocrwatch.config import LimitsConfig, S3Config
from ocrwatch.errors import OcrwatchError, PermanentError
from ocrwatch.infra.s3client import READ_TIMEOUT, acall, error_code, is_transient, new_client
from ocrwatch.sources.base import Job, Outbox, Outcome, Reject, S3Object
from ocrwatch.sources.s3events import S3EventSource, finished_by, parse

log = structlog.get_logger()


class TooManyDeliveries(PermanentError):
    """The queue delivered the same event more than ``max_receives`` times: processing it keeps
    failing."""

    kind = "too_many_deliveries"
    hint = (
        "the document failed every delivery; see the log for why, then upload it again or run "
        "ocrwatch retry"
    )


@dataclass
class _Delivery:
    """One SQS message in flight here: its latest receipt, its heartbeat, and the jobs it still
    waits for."""

    message_id: str
    receipt_handle: str
    pending: dict[str, Job]
    heartbeat: asyncio.Task[None] | None = None
    retry: bool = False


class S3Source(S3EventSource):
    """A ``Source`` for one ``[[s3]]`` table with ``transport = "sqs"``.

    At most ``max_inflight`` SQS messages are held (invisible to other consumers) at once, so
    several daemons share a queue by their capacity.

    Concurrency: every method is called from the event loop. A message is deleted once all its jobs
    are finished; ``finish`` for a job also finishes the other jobs in flight here for the same
    ledger key and content (a duplicate delivery the daemon folded into a running job gets no
    ``finish`` of its own).
    """

    def __init__(
        self,
        cfg: S3Config,
        *,
        name: str = "s3",
        limits: LimitsConfig | None = None,
        max_inflight: int = 64,
    ) -> None:
        super().__init__(cfg, name=name, limits=limits)
        self.max_inflight = max_inflight
        self._sqs: Any = None
        self._reject: Reject | None = None
        self._poller: asyncio.Task[None] | None = None
        self._deliveries: dict[str, _Delivery] = {}
        self._room = asyncio.Event()
        self._unreachable_since: float | None = None

    # -- lifecycle

    async def start(self, outbox: Outbox) -> None:
        self._submit, self._reject = outbox.submit, outbox.reject
        read_timeout = self.cfg.wait_time_seconds + READ_TIMEOUT
        self._sqs = await asyncio.to_thread(new_client, self.cfg, "sqs", read_timeout=read_timeout)
        self._poller = asyncio.get_running_loop().create_task(
            self._poll(), name=f"{self.name}:poll"
        )
        log.info("s3_source_started", source=self.name, transport="sqs", queue=self.cfg.queue_url)

    async def stop(self) -> None:
        """Stop taking events. Jobs in flight keep their heartbeat until ``finish``; nothing is
        deleted here."""
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        log.info("s3_source_stopped", source=self.name, in_flight=len(self._deliveries))

    # -- jobs

    async def finish(self, job: Job, outcome: Outcome, kind: str | None = None) -> None:
        """Delete the messages announcing this job once all their jobs are done or failed; on
        ``retry`` (or for a job of the same key whose content differs: it was never processed) let
        them reappear instead."""
        for delivery in finished_by(self._deliveries.values(), job, outcome):
            await self._finish_delivery(delivery)

    async def _finish_delivery(self, delivery: _Delivery) -> None:
        self._forget(delivery)
        if delivery.retry:
            log.info(
                "s3_message_left", source=self.name, message_id=delivery.message_id, reason="retry"
            )
            return
        await self._delete(delivery.message_id, delivery.receipt_handle)

    def _forget(self, delivery: _Delivery) -> None:
        self._deliveries.pop(delivery.message_id, None)
        self._room.set()
        if delivery.heartbeat is not None:
            delivery.heartbeat.cancel()

    async def _delete(self, message_id: str, receipt_handle: str) -> None:
        try:
            await acall(
                self._sqs.delete_message,
                executor=self.executor,
                QueueUrl=self.cfg.queue_url,
                ReceiptHandle=receipt_handle,
            )
        except Exception as exc:  # a later redelivery is recognised as done by the sidecar's ETag
            log.error(
                "s3_delete_failed", source=self.name, message_id=message_id, error=error_code(exc)
            )
        else:
            log.debug("s3_message_deleted", source=self.name, message_id=message_id)

    # -- polling

    async def _poll(self) -> None:
        """Receive messages for as long as the source runs, through any outage, within
        ``max_inflight``."""
        while True:
            room = self.max_inflight - len(self._deliveries)
            if room <= 0:
                self._room.clear()
                await self._room.wait()
                continue
            for message in await self._receive(min(10, room)):
                try:
                    await self._handle(message)
                except Exception as exc:  # the message reappears after its visibility timeout
                    log.exception(
                        "s3_message_failed",
                        source=self.name,
                        message_id=message.get("MessageId"),
                        error=error_code(exc),
                    )

    async def _receive(self, count: int) -> list[dict[str, Any]]:
        """One long poll, in a thread of the source's pool (daemon threads: a poll pending at
        shutdown holds nothing; its messages, if any, reappear), tried again through any outage."""
        loop = asyncio.get_running_loop()
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(Exception),
            wait=wait_exponential(multiplier=1.0, max=self.cfg.receive_backoff_max_seconds)
            + wait_random(0, 1.0),
            stop=stop_never,
            before_sleep=self._log_outage,
        )
        async for attempt in retrying:
            with attempt:
                response = await loop.run_in_executor(
                    self.executor,
                    functools.partial(
                        self._sqs.receive_message,
                        QueueUrl=self.cfg.queue_url,
                        MaxNumberOfMessages=count,
                        WaitTimeSeconds=self.cfg.wait_time_seconds,
                        VisibilityTimeout=self.cfg.visibility_timeout_seconds,
                        MessageSystemAttributeNames=["ApproximateReceiveCount"],
                    ),
                )
        if self._unreachable_since is not None:
            outage = round(time.monotonic() - self._unreachable_since, 1)
            log.info("s3_reachable", source=self.name, outage_seconds=outage)
            self._unreachable_since = None
        return list(response.get("Messages", []))

    def _log_outage(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        if self._unreachable_since is None:
            self._unreachable_since = time.monotonic()
        event = "s3_unreachable" if exc is not None and is_transient(exc) else "s3_poll_failed"
        log.warning(
            event,
            source=self.name,
            queue=self.cfg.queue_url,
            attempt=state.attempt_number,
            error=error_code(exc) if exc else None,
            retry_in=round(state.upcoming_sleep, 1),
        )

    async def _handle(self, message: dict[str, Any]) -> None:
        message_id, receipt = message["MessageId"], message["ReceiptHandle"]
        # redelivered while still in flight here: keep the newest receipt
        if message_id in self._deliveries:
            self._deliveries[message_id].receipt_handle = receipt
            return
        try:
            objects = self._accepted(parse(message["Body"]))
        except ValueError as exc:
            log.warning(
                "s3_message_ignored", source=self.name, message_id=message_id, reason=str(exc)
            )
            objects = []
        if not objects:
            await self._delete(message_id, receipt)
            return
        receives = int(message.get("Attributes", {}).get("ApproximateReceiveCount", "1"))
        if receives <= self.cfg.max_receives:
            await self._hold(message_id, receipt, objects, self._submit_job)
            return
        log.warning(
            "s3_max_receives",
            source=self.name,
            message_id=message_id,
            receives=receives,
            action=self.cfg.on_max_receives,
            uris=[obj.uri for obj in objects],
        )
        if self.cfg.on_max_receives == "dead_letter":
            return
        error = TooManyDeliveries(
            f"delivered {receives} times, more than max_receives = {self.cfg.max_receives}"
        )
        await self._hold(
            message_id, receipt, objects, lambda job: self._reject_job(job, error, receives)
        )

    async def _hold(
        self,
        message_id: str,
        receipt: str,
        objects: list[S3Object],
        hand_over: Callable[[Job], Awaitable[None]],
    ) -> None:
        """Keep the message (heartbeat) and hand each of its jobs over; it is settled when all are
        finished."""
        tokens = [f"{message_id}#{index}" for index in range(len(objects))]
        jobs = {token: self._job(obj, token) for token, obj in zip(tokens, objects, strict=True)}
        delivery = _Delivery(message_id, receipt, pending=dict(jobs))
        self._deliveries[message_id] = delivery
        delivery.heartbeat = asyncio.get_running_loop().create_task(self._heartbeat(delivery))
        for token, job in jobs.items():
            try:
                await hand_over(job)
            except Exception:  # not handed over: the message must come back
                delivery.retry = True
                if delivery.pending.pop(token, None) is not None and not delivery.pending:
                    await self._finish_delivery(delivery)

    async def _reject_job(self, job: Job, error: OcrwatchError, receives: int) -> None:
        assert self._reject is not None
        try:
            await self._reject(job, error, receives)
        except Exception as exc:
            log.exception(
                "s3_reject_failed", source=self.name, uri=job.origin.uri, error=error_code(exc)
            )
            raise

    async def _heartbeat(self, delivery: _Delivery) -> None:
        """Keep the message invisible while its documents are processed, so no other consumer takes
        it."""
        timeout = self.cfg.visibility_timeout_seconds
        while True:
            await asyncio.sleep(max(1.0, timeout / 3))
            try:
                await acall(
                    self._sqs.change_message_visibility,
                    attempts=2,
                    executor=self.executor,
                    QueueUrl=self.cfg.queue_url,
                    ReceiptHandle=delivery.receipt_handle,
                    VisibilityTimeout=timeout,
                )
            except Exception as exc:
                log.warning(
                    "s3_heartbeat_failed",
                    source=self.name,
                    message_id=delivery.message_id,
                    error=error_code(exc),
                )
                # receipt invalid or the 12 h limit reached: no longer ours to delete
                if not is_transient(exc):
                    self._forget(delivery)
                    return
