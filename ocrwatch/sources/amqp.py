"""S3 as a source, AMQP transport: Ceph RGW or MinIO publish bucket notifications to RabbitMQ, and
ocrwatch consumes one queue of it as it consumes SQS.

A message is acknowledged only once every job it announced is finished (sidecars or error sidecar
written); until then it is unacknowledged, held by this consumer alone, and the broker gives it to
another consumer if this one's connection ends (a crash, ``kill -9``, a lost network). Several
daemons on one queue so share its work, at most ``prefetch`` messages each. A message that is of
no use (not an S3 event, a test event, only keys this source refuses: its own sidecars, keys under
``archive_prefix``) is acknowledged at once. One delivered more than ``max_receives`` times (the
quorum queue's ``x-delivery-count``, or ``x-death``) is dead-lettered (``nack`` without requeue:
the queue's dead-letter exchange keeps it), after an error sidecar for each of its keys with
``on_max_receives = "error_sidecar"``.

A lost connection is made again with backoff, for ever (``amqp_unreachable``, then
``amqp_reachable``); what was held here goes back to the queue, and a redelivery of a document
already done is recognised by the ETag in its ``KEY.json`` (``Admission.done_already``).
aio-pika is imported only here, and only where a ``[[s3]]`` table asks for this transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import structlog
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage, AbstractQueue

from ocrwatch.config import LimitsConfig, S3Config
from ocrwatch.errors import OcrwatchError
from ocrwatch.infra.metrics import AMQP_EVENTS, Metrics
from ocrwatch.sources.amqpmessages import broker_url, receives, redacted
from ocrwatch.sources.base import Job, Outbox, Outcome, S3Object
from ocrwatch.sources.s3 import TooManyDeliveries
from ocrwatch.sources.s3events import S3EventSource, finished_by, parse

log = structlog.get_logger()

CONNECT_TIMEOUT = 10.0
REQUEUE_DELAY = 5.0
"""How long a message whose job asked for a retry is held before it goes back: a requeued message
comes back at once, and without a pause a failing bucket would turn it round in a tight loop."""


@dataclass
class _Delivery:
    """One message held here: the jobs it still waits for, and how it is to be settled."""

    token: int
    message: AbstractIncomingMessage
    pending: dict[str, Job] = field(default_factory=dict)
    retry: bool = False
    dead: bool = False  # past max_receives: dead-lettered once its error sidecars are written


class AmqpSource(S3EventSource):
    """A ``Source`` for one ``[[s3]]`` table with ``transport = "amqp"``.

    ``prefetch`` (default ``max_inflight``, the daemon's active documents) bounds the messages held
    unacknowledged at once. Every method is called from the event loop; as with SQS, ``finish`` for
    a job also settles the other deliveries held for the same key (a duplicate the daemon folded
    into a running job gets no ``finish`` of its own).
    """

    def __init__(
        self,
        cfg: S3Config,
        *,
        name: str = "s3",
        limits: LimitsConfig | None = None,
        name_template: str = "{name}",
        max_inflight: int = 64,
        backoff_max_seconds: float = 30.0,
        metrics: Metrics | None = None,
        index: int = 0,
    ) -> None:
        super().__init__(cfg, name=name, limits=limits)
        assert cfg.queue is not None
        self.queue_name = cfg.queue
        self.prefetch = cfg.prefetch if isinstance(cfg.prefetch, int) else max_inflight
        self.backoff_max_seconds = backoff_max_seconds
        self.metrics = metrics
        self.index = index
        self._url = ""
        self._shown = ""
        self._consumer: asyncio.Task[None] | None = None
        self._connection: AbstractConnection | None = None
        self._queue: AbstractQueue | None = None
        self._tag: str | None = None
        self._deliveries: dict[int, _Delivery] = {}
        self._tokens = itertools.count()
        self._later: set[asyncio.Task[None]] = set()
        self._stopping = False

    # -- lifecycle

    async def start(self, outbox: Outbox) -> None:
        """Read the URL (a missing variable or file stops the start, exit 2) and consume in a
        task of its own: a broker down at start is waited for, never a reason to stop."""
        self._submit, self._reject = outbox.submit, outbox.reject
        self._url = broker_url(self.cfg, self.index)
        self._shown = redacted(self._url)
        # aiormq's line for each failed connection says what amqp_unreachable says
        logging.getLogger("aiormq.connection").setLevel(logging.CRITICAL)
        if self.metrics is not None:
            for event in AMQP_EVENTS:
                self.metrics.amqp_messages.labels(source=self.name, event=event)
            self.metrics.amqp_connected.labels(source=self.name).set(0)
        loop = asyncio.get_running_loop()
        self._consumer = loop.create_task(self._consume(), name=f"{self.name}:amqp")
        log.info(
            "s3_source_started",
            source=self.name,
            transport="amqp",
            broker=self._shown,
            queue=self.queue_name,
            prefetch=self.prefetch,
        )

    async def stop(self) -> None:
        """Stop taking messages. The connection stays open so the jobs still running can
        acknowledge theirs; it is closed once the last is settled, and at exit the broker takes
        back the rest."""
        self._stopping = True
        if self._consumer is not None:
            self._consumer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._consumer
        if self._queue is not None and self._tag is not None:
            with contextlib.suppress(Exception):  # a connection already gone has no consumer left
                await self._queue.cancel(self._tag)
        if not self._deliveries:
            await self._close()
        log.info("s3_source_stopped", source=self.name, in_flight=len(self._deliveries))

    async def _close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.close()

    # -- jobs

    async def finish(self, job: Job, outcome: Outcome, kind: str | None = None) -> None:
        """Settle the messages announcing this job once all their jobs are finished: acknowledged,
        dead-lettered past ``max_receives``, or put back on ``retry`` (and for a job of the same key
        whose content differs: it was never processed)."""
        for delivery in finished_by(self._deliveries.values(), job, outcome):
            await self._finish_delivery(delivery)

    async def _finish_delivery(self, delivery: _Delivery) -> None:
        if self._deliveries.pop(delivery.token, None) is None:
            return
        if delivery.retry:
            task = asyncio.get_running_loop().create_task(self._requeue_later(delivery.message))
            self._later.add(task)
            task.add_done_callback(self._later.discard)
        elif delivery.dead:
            await self._dead_letter(delivery.message)
        else:
            await self._ack(delivery.message)
        if self._stopping and not self._deliveries and not self._later:
            await self._close()

    async def _ack(self, message: AbstractIncomingMessage) -> None:
        await self._answer(message, "acknowledged", message.ack)

    async def _dead_letter(self, message: AbstractIncomingMessage) -> None:
        await self._answer(message, "dead_lettered", lambda: message.nack(requeue=False))

    async def _requeue_later(self, message: AbstractIncomingMessage) -> None:
        await asyncio.sleep(REQUEUE_DELAY)
        await self._answer(message, "requeued", lambda: message.nack(requeue=True))

    async def _answer(
        self, message: AbstractIncomingMessage, event: str, answer: Callable[[], Awaitable[None]]
    ) -> None:
        """Answer the broker; on a channel already gone the message is back in the queue anyway,
        and its redelivery is recognised as done by the sidecar's ETag."""
        try:
            await answer()
        except Exception as exc:
            log.info(
                "amqp_answer_lost",
                source=self.name,
                message_id=message.message_id,
                answer=event,
                error=type(exc).__name__,
            )
            return
        self._count(event)
        log.debug(
            "amqp_message_settled", source=self.name, message_id=message.message_id, answer=event
        )

    def _count(self, event: str) -> None:
        if self.metrics is not None:
            self.metrics.amqp_messages.labels(source=self.name, event=event).inc()

    # -- consuming

    async def _consume(self) -> None:
        """Connect, declare, consume; whenever the connection or channel ends, again, with
        backoff."""
        failures, down_since = 0, None
        while True:
            lost = asyncio.Event()
            try:
                connection = await aio_pika.connect(self._url, timeout=CONNECT_TIMEOUT)
            except Exception as exc:
                failures += 1
                down_since = down_since or time.monotonic()
                await self._wait_out("amqp_unreachable", exc, failures)
                continue
            # this connection's own event: a late close of an earlier one must not end this one
            connection.close_callbacks.add(lambda *_, lost=lost: lost.set())
            self._connection = connection
            try:
                channel = await self._declare(connection)
                channel.close_callbacks.add(lambda *_, lost=lost: lost.set())
                assert self._queue is not None
                self._tag = await self._queue.consume(self._on_message)
            except Exception as exc:  # refused: permissions, a queue of another kind, the exchange
                failures += 1
                down_since = down_since or time.monotonic()
                await self._close()
                await self._wait_out("amqp_setup_failed", exc, failures)
                continue
            if down_since is not None:
                outage = round(time.monotonic() - down_since, 1)
                log.info("amqp_reachable", source=self.name, outage_seconds=outage)
            failures, down_since = 0, None
            self._connected(1)
            log.info(
                "amqp_consuming",
                source=self.name,
                broker=self._shown,
                queue=self.queue_name,
                prefetch=self.prefetch,
            )
            await lost.wait()
            down_since = time.monotonic()
            self._connected(0)
            held = len(self._deliveries)
            self._deliveries.clear()  # the broker has them back; their jobs finish all the same
            log.warning(
                "amqp_connection_lost", source=self.name, broker=self._shown, messages_returned=held
            )
            await self._close()

    def _connected(self, value: int) -> None:
        if self.metrics is not None:
            self.metrics.amqp_connected.labels(source=self.name).set(value)

    async def _wait_out(self, event: str, exc: BaseException, failures: int) -> None:
        """A second more each time, up to ``backoff_max_seconds``, with jitter: a broker
        restart (seconds) is caught up within a second or two, and the consumers of many hosts
        spread out."""
        delay = round(min(self.backoff_max_seconds, failures) + random.uniform(0, 0.5), 2)
        log.warning(
            event,
            source=self.name,
            broker=self._shown,
            queue=self.queue_name,
            attempt=failures,
            error=_said(exc),
            retry_in=delay,
        )
        await asyncio.sleep(delay)

    async def _declare(self, connection: AbstractConnection) -> AbstractChannel:
        """The channel to consume on; the queue declared if absent (durable, quorum, so that
        deliveries are counted), bound to ``exchange`` with ``routing_key``; the exchange declared
        if absent (durable, topic: RGW routes by its topic's name)."""
        cfg = self.cfg
        if not await _exists(connection, "queue", self.queue_name):
            arguments: dict[str, Any] = {"x-queue-type": "quorum"}
            if cfg.dead_letter_exchange:
                arguments["x-dead-letter-exchange"] = cfg.dead_letter_exchange
            channel = await connection.channel()
            await channel.declare_queue(self.queue_name, durable=True, arguments=arguments)
            await channel.close()
            log.info(
                "amqp_queue_declared",
                source=self.name,
                queue=self.queue_name,
                dead_letter_exchange=cfg.dead_letter_exchange or None,
            )
        if cfg.exchange and not await _exists(connection, "exchange", cfg.exchange):
            channel = await connection.channel()
            await channel.declare_exchange(cfg.exchange, aio_pika.ExchangeType.TOPIC, durable=True)
            await channel.close()
            log.info("amqp_exchange_declared", source=self.name, exchange=cfg.exchange)
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=self.prefetch)
        self._queue = await channel.declare_queue(self.queue_name, passive=True)
        if cfg.exchange:
            await self._queue.bind(cfg.exchange, routing_key=cfg.routing_key)
        return channel

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        try:
            await self._handle(message)
        except Exception as exc:  # never settled here: it comes back with the connection's end
            log.exception(
                "s3_message_failed",
                source=self.name,
                message_id=message.message_id,
                error=type(exc).__name__,
            )

    async def _handle(self, message: AbstractIncomingMessage) -> None:
        self._count("received")
        if message.redelivered:
            self._count("redelivered")
        try:
            objects = self._accepted(parse(message.body))
        except ValueError as exc:
            log.warning(
                "s3_message_ignored",
                source=self.name,
                message_id=message.message_id,
                reason=str(exc)[:200],
            )
            objects = []
        if not objects:
            log.debug("amqp_message_unused", source=self.name, message_id=message.message_id)
            await self._ack(message)
            return
        token = next(self._tokens)
        seen = receives(message.headers, bool(message.redelivered), self.queue_name)
        if seen <= self.cfg.max_receives:
            await self._hold(_Delivery(token, message), objects, self._submit_job)
            return
        log.warning(
            "s3_max_receives",
            source=self.name,
            message_id=message.message_id,
            receives=seen,
            action=self.cfg.on_max_receives,
            uris=[o.uri for o in objects],
        )
        if self.cfg.on_max_receives == "dead_letter":
            await self._dead_letter(message)
            return
        error = TooManyDeliveries(
            f"delivered {seen} times, more than max_receives = {self.cfg.max_receives}"
        )
        delivery = _Delivery(token, message, dead=True)
        await self._hold(delivery, objects, lambda job: self._reject_job(job, error, seen))

    async def _hold(
        self,
        delivery: _Delivery,
        objects: list[S3Object],
        hand_over: Callable[[Job], Awaitable[None]],
    ) -> None:
        """Keep the message unacknowledged and hand each of its jobs over; it is settled when all
        are finished (a job not handed over puts it back)."""
        tokens = [f"amqp:{delivery.token}#{index}" for index in range(len(objects))]
        jobs = {token: self._job(obj, token) for token, obj in zip(tokens, objects, strict=True)}
        delivery.pending = dict(jobs)
        self._deliveries[delivery.token] = delivery
        for token, job in jobs.items():
            try:
                await hand_over(job)
            except Exception:  # already logged by _submit_job or _reject_job
                delivery.retry = True
                if delivery.pending.pop(token, None) is not None and not delivery.pending:
                    await self._finish_delivery(delivery)

    async def _reject_job(self, job: Job, error: OcrwatchError, seen: int) -> None:
        assert self._reject is not None
        try:
            await self._reject(job, error, seen)
        except Exception as exc:
            log.exception(
                "s3_reject_failed", source=self.name, uri=job.origin.uri, error=type(exc).__name__
            )
            raise


async def _exists(connection: AbstractConnection, kind: str, name: str) -> bool:
    """Whether the broker has this queue or exchange: a passive declaration on a channel of its
    own, since the broker closes the channel of one that fails."""
    channel = await connection.channel()
    try:
        if kind == "queue":
            await channel.declare_queue(name, passive=True)
        else:
            await channel.get_exchange(name, ensure=True)
    except aio_pika.exceptions.ChannelNotFoundEntity:
        return False
    finally:
        with contextlib.suppress(Exception):
            await channel.close()
    return True


def _said(exc: BaseException) -> str:
    """What went wrong, short, and never the URL (aiormq puts it in some messages)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text[:200]}" if "://" not in text else type(exc).__name__


def probe(cfg: S3Config, index: int) -> list[tuple[bool, str, str, str]]:
    """``ocrwatch check``: can the broker be reached with these credentials, and what of the
    queue and the exchanges; one ``(ok, what, detail, hint)`` per probe. Blocking."""
    return asyncio.run(_probe(cfg, index))


async def _probe(cfg: S3Config, index: int) -> list[tuple[bool, str, str, str]]:
    key = f"s3[{index}]"
    try:
        url = broker_url(cfg, index)
    except OcrwatchError as exc:
        return [(False, f"{key} broker", exc.message, "set url or url_file to the broker's URL")]
    what = f"{key} broker {redacted(url)}"
    try:
        connection = await aio_pika.connect(url, timeout=CONNECT_TIMEOUT)
    except Exception as exc:
        return [
            (
                False,
                what,
                f"cannot be reached: {_said(exc)}",
                "start RabbitMQ, or correct the URL and its credentials",
            )
        ]
    results = [(True, what, "answered; credentials accepted", "")]
    try:
        channel = await connection.channel()
        try:
            queue = await channel.declare_queue(cfg.queue or "", passive=True)
        except aio_pika.exceptions.ChannelNotFoundEntity:
            results.append(
                (
                    True,
                    f"{key} queue {cfg.queue}",
                    "absent: declared at start (durable, quorum)",
                    "",
                )
            )
        else:
            state = queue.declaration_result
            results.append(
                (
                    True,
                    f"{key} queue {cfg.queue}",
                    f"{state.message_count} message(s) ready, {state.consumer_count} consumer(s)",
                    "",
                )
            )
        for role, name in (
            ("exchange", cfg.exchange),
            ("dead_letter_exchange", cfg.dead_letter_exchange),
        ):
            if not name:
                continue
            found = await _exists(connection, "exchange", name)
            if role == "exchange":
                detail = "exists" if found else "absent: declared at start (durable, topic)"
                results.append((True, f"{key} exchange {name}", detail, ""))
            elif not found:
                results.append(
                    (
                        False,
                        f"{key} dead_letter_exchange {name}",
                        "absent: dead-lettered messages would be dropped",
                        "declare it and bind a queue to it (docs/guide.md, RabbitMQ)",
                    )
                )
            else:
                results.append((True, f"{key} dead_letter_exchange {name}", "exists", ""))
    except Exception as exc:
        results.append(
            (
                False,
                f"{key} queue {cfg.queue}",
                _said(exc),
                "check the user's permissions on the queue and the vhost",
            )
        )
    finally:
        with contextlib.suppress(Exception):
            await connection.close()
    return results
