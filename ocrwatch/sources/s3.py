"""S3 as a source: object-created events from an SQS queue (AWS) or pushed over HTTP (Ceph RGW, MinIO).

Transports (``[[s3]] transport``):

- ``sqs``: S3 event notifications delivered to an SQS queue, long-polled. A message is deleted only once every
  job it announced is finished (sidecars written or given up); while a job runs, a heartbeat keeps the message
  invisible; a job finished with ``retry`` leaves its message to reappear when the visibility timeout lapses.
  SQS is a distributed work queue: several daemons may consume one queue, each message goes to one of them.
- ``webhook``: an HTTP endpoint that RGW or MinIO POSTs ``{"Records": [...]}`` to, guarded by a shared token.
  It answers 2xx only after every job of the request is in the ledger, so the sender retries what a crash lost.
  With RGW that needs a persistent topic (``persistent=true``): a plain topic makes the upload wait for the
  answer and drops the event when it fails. RGW resends a refused event at once, in a tight loop, so refusals
  are answered after ``reject_delay_seconds``. The HTTP/1.1 server is the stdlib's asyncio streams (no new
  dependency): one request per connection, bounded head and body, strict header parsing.

Key encoding, decided per record by ``eventSource`` (``eventVersion`` cannot tell them apart: AWS itself sends
2.1, 2.2 and 2.3): ``ceph:s3`` (RGW) sends keys raw, so ``unquote_plus`` would corrupt a ``+``; ``aws:s3`` (AWS,
moto) and ``minio:s3`` (MinIO) URL-encode keys with ``+`` for a space; anything else is treated like AWS.

Delivery is at least once, and a multipart upload may be announced twice (moto sends ``Put`` and
``CompleteMultipartUpload``): each job carries the event's ETag, versionId and size, so the daemon's ledger
(keyed by bucket/key/versionId) and the sink's ``recorded`` (same ETag means done) make a duplicate a no-op.

Boto3 clients are made when the source is built (the S3 client, shared with the sink) or started (SQS), never
at import; their blocking calls run in worker threads, the SQS long poll in a daemon thread so that a pending
poll never delays shutdown. Transient failures are retried by botocore (standard mode), then with backoff by
tenacity; the polling loop itself never gives up (``s3_unreachable``, then ``s3_reachable``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar
from urllib.parse import parse_qs, unquote_plus, urlsplit

import boto3
import botocore.exceptions
import structlog
from botocore.config import Config as BotoConfig
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception,
    retry_if_exception_type,
    stop_after_attempt,
    stop_never,
    wait_exponential,
    wait_random,
)

from ocrwatch.assemble import error_document
from ocrwatch.config import LimitsConfig, MiB, S3Config
from ocrwatch.errors import FileTooLarge, OcrwatchError, PermanentError, SourceGone, StorageUnavailable
from ocrwatch.sinks.base import Sink, sidecar_names
from ocrwatch.sources.base import Job, Outcome, S3Object, Submit

log = structlog.get_logger()

T = TypeVar("T")

CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 60.0
CALL_ATTEMPTS = 5
_THROTTLING = frozenset(
    {"Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled", "RequestThrottledException",
     "SlowDown", "RequestLimitExceeded", "TooManyRequestsException", "RequestTimeout", "RequestTimeoutException",
     "ServiceUnavailable", "InternalError", "InternalFailure", "ServiceUnavailableException"}
)
_GONE = frozenset({"NoSuchKey", "NoSuchVersion", "NoSuchBucket", "404", "NotFound"})
_SIDECAR_TAILS = tuple(sorted({n.removeprefix("x") for n in sidecar_names("x", "{name}").values()}))


class TooManyDeliveries(PermanentError):
    """The queue delivered the same event more than ``max_receives`` times: processing it keeps failing."""

    kind = "too_many_deliveries"
    hint = "the document failed every delivery; see the log for why, then upload it again or run ocrwatch retry"


# --- boto3 plumbing, shared with sinks/s3.py --------------------------------------------------------------------


def new_client(cfg: S3Config, service: str, *, read_timeout: float = READ_TIMEOUT) -> Any:
    """A boto3 client for ``service`` configured from ``cfg``; credentials from the config or the standard chain."""
    session = boto3.session.Session(
        aws_access_key_id=cfg.access_key_id, aws_secret_access_key=cfg.secret_access_key, region_name=cfg.region
    )
    config = BotoConfig(
        retries={"mode": "standard"},
        connect_timeout=CONNECT_TIMEOUT,
        read_timeout=read_timeout,
        s3={"addressing_style": cfg.addressing_style},
    )
    return session.client(service, endpoint_url=cfg.endpoint_url, config=config)


def error_code(exc: BaseException) -> str:
    if isinstance(exc, botocore.exceptions.ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return type(exc).__name__


def is_transient(exc: BaseException) -> bool:
    """True for failures of the world (connection refused, timeouts, 5xx, throttling) that a retry may cure."""
    if isinstance(exc, (botocore.exceptions.ConnectionError, botocore.exceptions.HTTPClientError,
                        botocore.exceptions.IncompleteReadError, ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, botocore.exceptions.ClientError):
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        return status >= 500 or status == 429 or error_code(exc) in _THROTTLING
    return False


def _log_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    log.warning("s3_call_retry", attempt=state.attempt_number, error=error_code(exc) if exc else None,
                delay=round(state.upcoming_sleep, 2))


def _retry_kwargs(attempts: int) -> dict[str, Any]:
    return {
        "retry": retry_if_exception(is_transient),
        "wait": wait_exponential(multiplier=0.5, max=10.0) + wait_random(0, 0.5),
        "stop": stop_after_attempt(attempts),
        "before_sleep": _log_retry,
        "reraise": True,
    }


def call(fn: Callable[..., T], /, *, attempts: int = CALL_ATTEMPTS, **kwargs: Any) -> T:
    """One blocking boto3 call, retried with backoff while its failure is transient (for worker threads)."""
    for attempt in Retrying(**_retry_kwargs(attempts)):
        with attempt:
            return fn(**kwargs)
    raise AssertionError("unreachable: tenacity reraises")


async def acall(fn: Callable[..., T], /, *, attempts: int = CALL_ATTEMPTS, **kwargs: Any) -> T:
    """``call`` for the event loop: each attempt runs in a worker thread, the backoff sleeps on the loop."""
    async for attempt in AsyncRetrying(**_retry_kwargs(attempts)):
        with attempt:
            return await asyncio.to_thread(fn, **kwargs)
    raise AssertionError("unreachable: tenacity reraises")


def storage_error(exc: BaseException, what: str) -> OcrwatchError:
    """Map a boto3 failure that survived the retries onto the hierarchy (never carrying credentials)."""
    if isinstance(exc, botocore.exceptions.NoCredentialsError):
        return StorageUnavailable(f"{what}: no credentials", hint="set access_key_id/secret_access_key in [[s3]] "
                                  "or provide credentials through the AWS standard chain")
    if isinstance(exc, botocore.exceptions.ClientError) and error_code(exc) in ("AccessDenied", "403", "Forbidden"):
        return StorageUnavailable(f"{what}: access denied", hint="grant the credentials access to the bucket")
    return StorageUnavailable(f"{what}: {error_code(exc)}: {exc}")


# --- events: pure functions ---------------------------------------------------------------------------------


def event_records(body: Any) -> list[dict[str, Any]]:
    """The records of an S3 notification body (plain, or inside an SNS envelope); [] for ``s3:TestEvent``."""
    if isinstance(body, dict) and body.get("Type") == "Notification" and isinstance(body.get("Message"), str):
        body = json.loads(body["Message"])
    if isinstance(body, dict) and body.get("Event") == "s3:TestEvent":
        return []
    if isinstance(body, dict) and isinstance(body.get("Records"), list):
        return [record for record in body["Records"] if isinstance(record, dict)]
    raise ValueError("not an S3 event notification")


def created_object(record: dict[str, Any]) -> S3Object | None:
    """The object an ``ObjectCreated:*`` record announces, its key decoded as its producer encoded it."""
    if not str(record.get("eventName", "")).removeprefix("s3:").startswith("ObjectCreated:"):
        return None
    try:
        bucket = record["s3"]["bucket"]["name"]
        obj = record["s3"]["object"]
        raw_key = obj["key"]
    except (KeyError, TypeError) as exc:
        raise ValueError(f"record without s3.bucket.name or s3.object.key: {exc}") from None
    if not isinstance(bucket, str) or not isinstance(raw_key, str):
        raise ValueError("bucket name and key must be strings")
    key = raw_key if record.get("eventSource") == "ceph:s3" else unquote_plus(raw_key)
    size = obj.get("size")
    return S3Object(
        bucket=bucket,
        key=key,
        etag=str(obj.get("eTag") or "").strip('"') or None,
        version_id=str(obj.get("versionId") or "") or None,
        size=size if isinstance(size, int) and size >= 0 else None,
    )


def same_version(a: Job, b: Job) -> bool:
    """Whether two jobs name the same bytes of the same key: equal ETag and versionId."""
    return (isinstance(a.origin, S3Object) and isinstance(b.origin, S3Object) and a.key == b.key
            and (a.origin.etag, a.origin.version_id) == (b.origin.etag, b.origin.version_id))


def is_sidecar(key: str) -> bool:
    """ocrwatch's own outputs end like ``sidecar_names`` makes them, whatever the naming template."""
    return key.endswith(_SIDECAR_TAILS)


def refusal(cfg: S3Config, obj: S3Object) -> str | None:
    """Why ``obj`` is not a document for this source, or None when it is."""
    if cfg.bucket and obj.bucket != cfg.bucket:
        return "other_bucket"
    if not obj.key or obj.key.endswith("/"):
        return "folder"
    if is_sidecar(obj.key):
        return "own_sidecar"
    if cfg.output_prefix and obj.bucket == (cfg.output_bucket or obj.bucket) and obj.key.startswith(cfg.output_prefix):
        return "output_prefix"
    if not obj.key.startswith(cfg.prefix):
        return "prefix"
    if cfg.suffixes and not obj.key.lower().endswith(tuple(s.lower() for s in cfg.suffixes)):
        return "suffix"
    return None


def host_port(listen: str) -> tuple[str, int]:
    """``127.0.0.1:8787`` or ``[::1]:8787`` → (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"listen must be HOST:PORT, got {listen!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


# --- the source -------------------------------------------------------------------------------------------------


@dataclass
class _Delivery:
    """One SQS message in flight here: its latest receipt, its heartbeat, and the jobs it still waits for."""

    message_id: str
    receipt_handle: str
    pending: dict[str, Job]
    heartbeat: asyncio.Task[None] | None = None
    retry: bool = False


class S3Source:
    """A ``Source`` for one ``[[s3]]`` table.

    ``client`` (the S3 client, made here, shared with the daemon's ``S3Sink``) downloads documents; ``sink``
    writes the error sidecar of a message delivered more than ``max_receives`` times; ``limits.max_bytes`` is
    checked against the event's size before downloading. At most ``max_inflight`` SQS messages are held
    (invisible to other consumers) at once, so several daemons share a queue by their capacity.

    Concurrency: every method is called from the event loop. A message is deleted once all its jobs are
    finished; ``finish`` for a job also finishes the other jobs in flight here for the same ledger key and
    content (a duplicate delivery the daemon folded into a running job gets no ``finish`` of its own).
    """

    reject_delay_seconds = 1.0

    def __init__(self, cfg: S3Config, *, name: str = "s3", limits: LimitsConfig | None = None,
                 name_template: str = "{name}", max_inflight: int = 64, backoff_max_seconds: float = 30.0) -> None:
        from ocrwatch.sinks.s3 import S3Sink  # the sink module uses this module's boto3 plumbing

        self.cfg = cfg
        self.name = name
        self.max_bytes = (limits or LimitsConfig()).max_bytes
        self.max_inflight = max_inflight
        self.backoff_max_seconds = backoff_max_seconds
        self.client = new_client(cfg, "s3")
        self.sink: Sink = S3Sink(cfg, self.client, name_template)
        self._sqs: Any = None
        self._submit: Submit | None = None
        self._poller: asyncio.Task[None] | None = None
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.StreamWriter] = set()
        self._deliveries: dict[str, _Delivery] = {}
        self._room = asyncio.Event()
        self._unreachable_since: float | None = None

    # -- lifecycle

    async def start(self, submit: Submit) -> None:
        self._submit = submit
        if self.cfg.transport == "sqs":
            read_timeout = self.cfg.wait_time_seconds + READ_TIMEOUT
            self._sqs = await asyncio.to_thread(new_client, self.cfg, "sqs", read_timeout=read_timeout)
            self._poller = asyncio.get_running_loop().create_task(self._poll(), name=f"{self.name}:poll")
            log.info("s3_source_started", source=self.name, transport="sqs", queue=self.cfg.queue_url)
        else:
            host, port = host_port(self.cfg.listen)
            self._server = await asyncio.start_server(self._serve, host, port, limit=_HEAD_LIMIT)
            log.info("s3_source_started", source=self.name, transport="webhook", listen=self.address,
                     path=self.cfg.path)

    async def stop(self) -> None:
        """Stop taking events. Jobs in flight keep their heartbeat until ``finish``; nothing is deleted here."""
        if self._server is not None:
            self._server.close()
            for writer in list(self._connections):  # a request being submitted still finishes; its answer is lost
                writer.close()
            await self._server.wait_closed()
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        log.info("s3_source_stopped", source=self.name, in_flight=len(self._deliveries))

    @property
    def address(self) -> tuple[str, int]:
        """Where the webhook listens (the real port when ``listen`` asked for port 0)."""
        if self._server is None:
            raise RuntimeError("the webhook is not listening")
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    # -- jobs

    def _job(self, obj: S3Object, receipt: str | None = None) -> Job:
        return Job(origin=obj, source=self.name, priority=self.cfg.priority, prompt=self.cfg.prompt,
                   max_bytes=self.max_bytes, receipt=receipt)

    def _accepted(self, body: Any) -> list[S3Object]:
        """The documents a notification body announces; everything else is logged and dropped."""
        accepted = []
        for record in event_records(body):
            try:
                obj = created_object(record)
            except ValueError as exc:
                log.warning("s3_event_ignored", source=self.name, reason="malformed", error=str(exc))
                continue
            reason = "not_created" if obj is None else refusal(self.cfg, obj)
            if reason is None and obj is not None:
                accepted.append(obj)
            else:
                log.debug("s3_event_ignored", source=self.name, reason=reason,
                          uri=obj.uri if obj else None, s3_event=record.get("eventName"))
        return accepted

    async def finish(self, job: Job, outcome: Outcome) -> None:
        """Delete the messages announcing this job once all their jobs are done or failed; on ``retry`` (or for
        a job of the same key whose content differs: it was never processed) let them reappear instead."""
        for delivery in list(self._deliveries.values()):
            for token, pending in list(delivery.pending.items()):
                if token != job.receipt and pending.key != job.key:
                    continue
                del delivery.pending[token]
                delivery.retry |= outcome == "retry" or not same_version(pending, job)
            if not delivery.pending:
                await self._settle(delivery)

    async def _settle(self, delivery: _Delivery) -> None:
        self._forget(delivery)
        if delivery.retry:
            log.info("s3_message_left", source=self.name, message_id=delivery.message_id, reason="retry")
            return
        await self._delete(delivery.message_id, delivery.receipt_handle)

    def _forget(self, delivery: _Delivery) -> None:
        self._deliveries.pop(delivery.message_id, None)
        self._room.set()
        if delivery.heartbeat is not None:
            delivery.heartbeat.cancel()

    async def _delete(self, message_id: str, receipt_handle: str) -> None:
        try:
            await acall(self._sqs.delete_message, QueueUrl=self.cfg.queue_url, ReceiptHandle=receipt_handle)
        except Exception as exc:  # a later redelivery is recognised as done by the sidecar's ETag
            log.error("s3_delete_failed", source=self.name, message_id=message_id, error=error_code(exc))
        else:
            log.debug("s3_message_deleted", source=self.name, message_id=message_id)

    # -- fetch

    async def fetch(self, job: Job, spool_dir: Path) -> Path:
        """Stream the object the event announced into a 0600 spool file, refusing oversize before downloading."""
        obj = job.origin
        if not isinstance(obj, S3Object):
            raise TypeError(f"{self.name} cannot fetch {obj!r}")
        limit = job.max_bytes or self.max_bytes
        if obj.size is not None and obj.size > limit:
            raise FileTooLarge(f"{obj.uri} has {obj.size} bytes, more than the limit of {limit}")
        return await asyncio.to_thread(self._download, obj, spool_dir, limit)

    def _download(self, obj: S3Object, spool_dir: Path, limit: int) -> Path:
        suffix = PurePosixPath(obj.key).suffix
        fd, name = tempfile.mkstemp(prefix="s3-", suffix=suffix if re.fullmatch(r"\.\w{1,8}", suffix) else "",
                                    dir=spool_dir)
        os.close(fd)
        path = Path(name)
        request: dict[str, Any] = {"Bucket": obj.bucket, "Key": obj.key}
        if obj.etag:
            request["IfMatch"] = f'"{obj.etag}"'
        if obj.version_id:
            request["VersionId"] = obj.version_id
        try:
            call(self._download_once, request=request, path=path, limit=limit, uri=obj.uri)
        except botocore.exceptions.ClientError as exc:
            path.unlink(missing_ok=True)
            if error_code(exc) in _GONE:
                raise SourceGone(f"{obj.uri} no longer exists") from None
            if error_code(exc) in ("PreconditionFailed", "412"):
                raise SourceGone(f"{obj.uri} changed since the event (its new version has its own event)") from None
            raise storage_error(exc, f"downloading {obj.uri}") from None
        except OcrwatchError:
            path.unlink(missing_ok=True)
            raise
        except Exception as exc:
            path.unlink(missing_ok=True)
            raise storage_error(exc, f"downloading {obj.uri}") from None
        return path

    def _download_once(self, request: dict[str, Any], path: Path, limit: int, uri: str) -> None:
        response = self.client.get_object(**request)
        body = response["Body"]
        with contextlib.closing(body), open(path, "wb") as out:
            if response.get("ContentLength", 0) > limit:
                raise FileTooLarge(f"{uri} has {response['ContentLength']} bytes, more than the limit of {limit}")
            for chunk in body.iter_chunks(MiB):
                out.write(chunk)
                if out.tell() > limit:
                    raise FileTooLarge(f"{uri} has more than the limit of {limit} bytes")

    # -- sqs transport

    async def _poll(self) -> None:
        """Receive messages for as long as the source runs, through any outage, within ``max_inflight``."""
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
                    log.exception("s3_message_failed", source=self.name, message_id=message.get("MessageId"),
                                  error=error_code(exc))

    async def _receive(self, count: int) -> list[dict[str, Any]]:
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(Exception),
            wait=wait_exponential(multiplier=1.0, max=self.backoff_max_seconds) + wait_random(0, 1.0),
            stop=stop_never,
            before_sleep=self._log_outage,
        )
        async for attempt in retrying:
            with attempt:
                response = await _detached(
                    self._sqs.receive_message,
                    QueueUrl=self.cfg.queue_url,
                    MaxNumberOfMessages=count,
                    WaitTimeSeconds=self.cfg.wait_time_seconds,
                    VisibilityTimeout=self.cfg.visibility_timeout_seconds,
                    MessageSystemAttributeNames=["ApproximateReceiveCount"],
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
        log.warning(event, source=self.name, queue=self.cfg.queue_url, attempt=state.attempt_number,
                    error=error_code(exc) if exc else None, retry_in=round(state.upcoming_sleep, 1))

    async def _handle(self, message: dict[str, Any]) -> None:
        message_id, receipt = message["MessageId"], message["ReceiptHandle"]
        if message_id in self._deliveries:  # redelivered while still in flight here: keep the newest receipt
            self._deliveries[message_id].receipt_handle = receipt
            return
        try:
            objects = self._accepted(json.loads(message["Body"]))
        except ValueError as exc:
            log.warning("s3_message_ignored", source=self.name, message_id=message_id, reason=str(exc))
            objects = []
        if not objects:
            await self._delete(message_id, receipt)
            return
        receives = int(message.get("Attributes", {}).get("ApproximateReceiveCount", "1"))
        if receives > self.cfg.max_receives:
            await self._give_up(message_id, receipt, objects, receives)
            return
        tokens = [f"{message_id}#{index}" for index in range(len(objects))]
        jobs = {token: self._job(obj, token) for token, obj in zip(tokens, objects, strict=True)}
        delivery = _Delivery(message_id, receipt, pending=dict(jobs))
        self._deliveries[message_id] = delivery
        delivery.heartbeat = asyncio.get_running_loop().create_task(self._heartbeat(delivery))
        for token, job in jobs.items():
            try:
                await self._submit_job(job)
            except Exception:  # not in the ledger: the message must come back
                delivery.retry = True
                if delivery.pending.pop(token, None) is not None and not delivery.pending:
                    await self._settle(delivery)

    async def _submit_job(self, job: Job) -> None:
        assert self._submit is not None
        try:
            await self._submit(job)
        except Exception as exc:
            log.exception("s3_submit_failed", source=self.name, uri=job.origin.uri, error=error_code(exc))
            raise
        log.info("s3_job_submitted", source=self.name, uri=job.origin.uri, key=job.key)

    async def _heartbeat(self, delivery: _Delivery) -> None:
        """Keep the message invisible while its documents are processed, so no other consumer takes it."""
        timeout = self.cfg.visibility_timeout_seconds
        while True:
            await asyncio.sleep(max(1.0, timeout / 3))
            try:
                await acall(self._sqs.change_message_visibility, attempts=2, QueueUrl=self.cfg.queue_url,
                            ReceiptHandle=delivery.receipt_handle, VisibilityTimeout=timeout)
            except Exception as exc:
                log.warning("s3_heartbeat_failed", source=self.name, message_id=delivery.message_id,
                            error=error_code(exc))
                if not is_transient(exc):  # receipt invalid or the 12 h limit reached: no longer ours to delete
                    self._forget(delivery)
                    return

    async def _give_up(self, message_id: str, receipt: str, objects: list[S3Object], receives: int) -> None:
        """A message delivered more than ``max_receives`` times: error sidecar + delete, or leave it to the DLQ."""
        log.warning("s3_max_receives", source=self.name, message_id=message_id, receives=receives,
                    action=self.cfg.on_max_receives, uris=[obj.uri for obj in objects])
        if self.cfg.on_max_receives == "dead_letter":
            return
        error = TooManyDeliveries(f"delivered {receives} times, more than max_receives = {self.cfg.max_receives}")
        try:
            for obj in objects:
                await asyncio.to_thread(self._write_poison_sidecar, self._job(obj), error, receives)
        except Exception as exc:
            log.error("s3_error_sidecar_failed", source=self.name, message_id=message_id, error=error_code(exc))
            return
        await self._delete(message_id, receipt)

    def _write_poison_sidecar(self, job: Job, error: OcrwatchError, receives: int) -> None:
        recorded = self.sink.recorded(job)
        obj = job.origin
        assert isinstance(obj, S3Object)
        if recorded and obj.etag and recorded.get("etag") == obj.etag:
            return  # processed after all (a duplicate whose finish never came): nothing to report
        source = {"uri": obj.uri, "name": obj.name, "bytes": obj.size or 0, "sha256": None, "etag": obj.etag,
                  "version_id": obj.version_id}
        self.sink.write_error(job, error_document(source, error.as_dict(), receives, time.time()))

    # -- webhook transport

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One HTTP/1.1 exchange per connection (``Connection: close``): small, strict and bounded."""
        self._connections.add(writer)
        try:
            await self._answer(reader, writer)
        finally:
            self._connections.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            status, payload, headers = await self._exchange(reader, writer)
        except _HttpError as exc:
            status, payload, headers = exc.status, {"error": exc.reason}, exc.headers
            peer = writer.get_extra_info("peername")
            log.warning("s3_webhook_rejected", source=self.name, status=status, reason=exc.reason,
                        peer=peer and peer[0])
            # RGW resends a refused event at once, in a tight loop: answering slowly paces it (and guessers)
            await asyncio.sleep(self.reject_delay_seconds)
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            return
        with contextlib.suppress(ConnectionError, TimeoutError):
            await _respond(writer, status, payload, headers)
            if status >= 400:
                await _linger(reader, writer)

    async def _exchange(self, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter) -> tuple[int, dict[str, Any], dict[str, str]]:
        method, target, headers = await _read_head(reader)
        url = urlsplit(target)
        if url.path != self.cfg.path:
            raise _HttpError(404, "not found")
        self._authorize(headers.get("authorization"), parse_qs(url.query, keep_blank_values=True).get("token"))
        if method != "POST":
            raise _HttpError(405, "method not allowed", {"Allow": "POST"})
        length = _content_length(headers, self.cfg.max_body_bytes)
        if headers.get("expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
        body = await asyncio.wait_for(reader.readexactly(length), _READ_TIMEOUT)
        try:
            objects = self._accepted(json.loads(body))
        except ValueError as exc:
            raise _HttpError(400, f"not an S3 event notification: {exc}") from None
        for obj in objects:
            try:
                await self._submit_job(self._job(obj))
            except Exception:
                raise _HttpError(503, "not recorded, send again", {"Retry-After": "5"}) from None
        return 200, {"accepted": len(objects)}, {}

    def _authorize(self, authorization: str | None, query_tokens: list[str] | None) -> None:
        """The shared token, as ``Authorization: Bearer`` or ``?token=`` (RGW's push endpoint is a bare URL)."""
        presented: str | None = None
        if authorization is not None:
            scheme, _, credentials = authorization.partition(" ")
            if scheme.lower() == "bearer":
                presented = credentials.strip()
        elif query_tokens is not None:
            if len(query_tokens) != 1:
                raise _HttpError(400, "more than one token")
            presented = query_tokens[0]
        if not presented:
            raise _HttpError(401, "token required", {"WWW-Authenticate": 'Bearer realm="ocrwatch"'})
        assert self.cfg.token is not None
        if not hmac.compare_digest(presented.encode(), self.cfg.token.encode()):
            raise _HttpError(403, "wrong token")


# --- minimal HTTP/1.1 --------------------------------------------------------------------------------------------

_HEAD_LIMIT = 16 * 1024
_READ_TIMEOUT = 30.0
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_SINGLE_HEADERS = frozenset({"content-length", "transfer-encoding", "authorization", "expect", "host"})
_REASONS = {100: "Continue", 200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
            404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout", 411: "Length Required",
            413: "Content Too Large", 431: "Request Header Fields Too Large", 501: "Not Implemented",
            503: "Service Unavailable"}


class _HttpError(Exception):
    def __init__(self, status: int, reason: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(reason)
        self.status, self.reason, self.headers = status, reason, headers or {}


async def _read_head(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str]]:
    """Request line and headers; anything ambiguous (folded lines, repeated lengths) is refused."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT)
    except asyncio.LimitOverrunError:
        raise _HttpError(431, "request head too large") from None
    except TimeoutError:
        raise _HttpError(408, "request head too slow") from None
    request_line, *lines = head[:-4].split(b"\r\n")
    parts = request_line.split(b" ")
    if len(parts) != 3 or parts[2] not in (b"HTTP/1.1", b"HTTP/1.0") or not _TOKEN.fullmatch(parts[0]):
        raise _HttpError(400, "bad request line")
    headers: dict[str, str] = {}
    for line in lines:
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN.fullmatch(name):
            raise _HttpError(400, "bad header line")
        key = name.decode("ascii").lower()
        if key in headers and key in _SINGLE_HEADERS:
            raise _HttpError(400, f"repeated {key}")
        headers[key] = value.strip(b" \t").decode("latin-1")
    return parts[0].decode("ascii"), parts[1].decode("latin-1"), headers


def _content_length(headers: dict[str, str], limit: int) -> int:
    if "transfer-encoding" in headers:
        raise _HttpError(501, "transfer-encoding is not supported; send Content-Length")
    value = headers.get("content-length")
    if value is None:
        raise _HttpError(411, "Content-Length required")
    if not (value.isascii() and value.isdigit()):
        raise _HttpError(400, "bad Content-Length")
    if int(value) > limit:
        raise _HttpError(413, f"body larger than max_body_bytes = {limit}")
    return int(value)


async def _respond(writer: asyncio.StreamWriter, status: int, payload: dict[str, Any],
                   headers: dict[str, str]) -> None:
    body = json.dumps(payload).encode()
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}", "Content-Type: application/json",
             f"Content-Length: {len(body)}", "Connection: close", *(f"{k}: {v}" for k, v in headers.items())]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
    await asyncio.wait_for(writer.drain(), _READ_TIMEOUT)


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """After an early answer, drain what the client still sends, so closing does not reset the answer away."""
    if writer.can_write_eof():
        writer.write_eof()
    with contextlib.suppress(Exception):
        deadline = time.monotonic() + 2.0
        for _ in range(64):
            if not await asyncio.wait_for(reader.read(64 * 1024), max(0.0, deadline - time.monotonic())):
                break


async def _detached(fn: Callable[..., T], /, **kwargs: Any) -> T:
    """Run a blocking call in a daemon thread: unlike ``to_thread``, a pending long poll never delays shutdown.

    If the awaiting task is cancelled, the call's result is dropped (a received message reappears later).
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(setter: Callable[[Any], None], value: Any) -> None:
        if not future.done():
            setter(value)

    def run() -> None:
        try:
            outcome: tuple[Callable[[Any], None], Any] = (future.set_result, fn(**kwargs))
        except BaseException as exc:  # handed to the awaiting task
            outcome = (future.set_exception, exc)
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=run, name="ocrwatch-sqs-receive", daemon=True).start()
    return await future


# --- ocrwatch check ----------------------------------------------------------------------------------------------


def check(cfg: S3Config) -> list[str]:
    """Problems with one ``[[s3]]`` table: credentials, queue and bucket access. Empty when all is well."""
    problems: list[str] = []
    try:
        session = boto3.session.Session(aws_access_key_id=cfg.access_key_id,
                                        aws_secret_access_key=cfg.secret_access_key, region_name=cfg.region)
        if session.get_credentials() is None:
            return ["no credentials: set access_key_id and secret_access_key, or use the AWS standard chain"]
        s3 = new_client(cfg, "s3", read_timeout=10.0)
        sqs = new_client(cfg, "sqs", read_timeout=10.0) if cfg.transport == "sqs" else None
    except botocore.exceptions.BotoCoreError as exc:
        return [f"cannot make an S3 client: {exc}"]
    if sqs is not None:
        try:
            attributes = sqs.get_queue_attributes(QueueUrl=cfg.queue_url, AttributeNames=["All"])["Attributes"]
        except Exception as exc:
            problems.append(f"queue {cfg.queue_url}: {_describe(exc)}")
        else:
            if cfg.on_max_receives == "dead_letter" and "RedrivePolicy" not in attributes:
                problems.append(f"queue {cfg.queue_url} has no RedrivePolicy, but on_max_receives = 'dead_letter': "
                                "a poison message would be delivered forever")
    if cfg.transport == "webhook":
        try:
            host_port(cfg.listen)
        except ValueError as exc:
            problems.append(str(exc))
    for bucket in dict.fromkeys(b for b in (cfg.bucket, cfg.output_bucket) if b):
        try:
            s3.head_bucket(Bucket=bucket)
        except Exception as exc:
            problems.append(f"bucket {bucket}: {_describe(exc)}")
    return problems


def _describe(exc: BaseException) -> str:
    if isinstance(exc, botocore.exceptions.ClientError):
        return f"{error_code(exc)} ({exc.response.get('Error', {}).get('Message') or 'no message'})"
    return f"{type(exc).__name__}: {exc}"

