"""What both S3 transports share: parsing object-created events, and fetching the object an event
announced.

Key encoding, decided per record by ``eventSource`` (``eventVersion`` cannot tell them apart: AWS
itself sends 2.1, 2.2 and 2.3): ``ceph:s3`` (RGW) sends keys raw, so ``unquote_plus`` would corrupt
a ``+``; ``aws:s3`` (AWS, moto) and ``minio:s3`` (MinIO) URL-encode keys with ``+`` for a space;
anything else is treated like AWS.

Delivery is at least once, and a multipart upload may be announced twice (moto sends ``Put`` and
``CompleteMultipartUpload``): each job carries the event's ETag, versionId and size, so the daemon's
ledger (keyed by bucket/key/versionId) and the sink's ``recorded`` (same ETag means done) make a
duplicate a no-op.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any, Protocol, TypeVar
from urllib.parse import unquote_plus

import botocore.exceptions
import structlog

from ocrwatch.config import LimitsConfig, MiB, S3Config
from ocrwatch.errors import FileTooLarge, OcrwatchError, PermanentError, SourceGone
from ocrwatch.infra.s3client import (
    MAX_KEY_BYTES,
    S3Threads,
    call,
    error_code,
    is_not_found,
    new_client,
    storage_error,
)
from ocrwatch.naming import is_output, sidecar_names
from ocrwatch.sources.base import Fetched, Job, Outcome, Read, Reject, S3Object, Submit

log = structlog.get_logger()

_SIDECAR_TAILS = tuple(sorted({n.removeprefix("x") for n in sidecar_names("x", "{name}").values()}))


# --- events: pure functions -----------------------------------------------------------------------


def parse(text: str | bytes) -> Any:
    """JSON from a peer, every failure a ``ValueError``: nesting too deep for the parser (a
    RecursionError otherwise), bytes that are not UTF-8, a number too long to convert."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def event_records(body: Any) -> list[dict[str, Any]]:
    """The records of an S3 notification body (plain, or inside an SNS envelope); [] for
    ``s3:TestEvent``."""
    if (
        isinstance(body, dict)
        and body.get("Type") == "Notification"
        and isinstance(body.get("Message"), str)
    ):
        body = parse(body["Message"])
    if isinstance(body, dict) and body.get("Event") == "s3:TestEvent":
        return []
    if isinstance(body, dict) and isinstance(body.get("Records"), list):
        return [record for record in body["Records"] if isinstance(record, dict)]
    raise ValueError("not an S3 event notification")


def created_object(record: dict[str, Any]) -> S3Object | None:
    """The object an ``ObjectCreated:*`` record announces, its key decoded as its producer encoded
    it."""
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
    etag, version_id, size = obj.get("eTag"), obj.get("versionId"), obj.get("size")
    if not isinstance(etag, str | None) or not isinstance(version_id, str | None):
        raise ValueError("eTag and versionId must be strings")
    key = raw_key if record.get("eventSource") == "ceph:s3" else unquote_plus(raw_key)
    return S3Object(
        bucket=bucket,
        key=key,
        etag=(etag or "").strip('"') or None,
        version_id=version_id or None,
        size=size if type(size) is int and size >= 0 else None,  # not a bool
    )


def same_version(a: Job, b: Job) -> bool:
    """Whether two jobs name the same bytes of the same key: equal ETag and versionId."""
    return (
        isinstance(a.origin, S3Object)
        and isinstance(b.origin, S3Object)
        and a.key == b.key
        and (a.origin.etag, a.origin.version_id) == (b.origin.etag, b.origin.version_id)
    )


class Announced(Protocol):
    """A message in flight: the jobs it announced that have not finished, and whether it must come
    back rather than be acknowledged."""

    pending: dict[str, Job]
    retry: bool


D = TypeVar("D", bound=Announced)


def finished_by(deliveries: Iterable[D], job: Job, outcome: Outcome) -> list[D]:
    """The messages ``job`` finishing as ``outcome`` leaves waiting for no job: each message is
    settled once every job it announced is finished, and comes back instead (``retry``) where one
    of them is to be tried again or was a version other than the one processed."""
    settled = []
    for delivery in list(deliveries):
        for token, pending in list(delivery.pending.items()):
            if token != job.receipt and pending.key != job.key:
                continue
            del delivery.pending[token]
            delivery.retry |= outcome == "retry" or not same_version(pending, job)
        if not delivery.pending:
            settled.append(delivery)
    return settled


def is_sidecar(key: str) -> bool:
    """ocrwatch's own outputs end like ``sidecar_names`` makes them, whatever the naming template
    (the searchable PDF and the figures too: ``naming.is_output``)."""
    return key.endswith(_SIDECAR_TAILS) or is_output(key)


def refusal(cfg: S3Config, obj: S3Object) -> str | None:
    """Why ``obj`` is not a document for this source, or None when it is."""
    if cfg.bucket and obj.bucket != cfg.bucket:
        return "other_bucket"
    if not obj.key or obj.key.endswith("/"):
        return "folder"
    if not _valid_key(obj.key):
        return "invalid_key"
    if is_sidecar(obj.key):
        return "own_sidecar"
    if (
        cfg.output_prefix
        and obj.bucket == (cfg.output_bucket or obj.bucket)
        and obj.key.startswith(cfg.output_prefix)
    ):
        return "output_prefix"
    if cfg.archive_prefix and obj.key.startswith(cfg.archive_prefix):
        return "archive_prefix"  # a moved object's copy
    if not obj.key.startswith(cfg.prefix):
        return "prefix"
    if cfg.suffixes and not obj.key.lower().endswith(tuple(s.lower() for s in cfg.suffixes)):
        return "suffix"
    return None


def _valid_key(key: str) -> bool:
    """What S3 can hold as a key: UTF-8 (no lone surrogate from a JSON escape), at most 1024 bytes,
    no NUL."""
    try:
        return len(key.encode()) <= MAX_KEY_BYTES and "\0" not in key
    except UnicodeEncodeError:
        return False


# --- the part of a source both transports share ---------------------------------------------------


class S3EventSource:
    """The base of the SQS and webhook sources: turns notification bodies into jobs and fetches
    their objects.

    ``client`` (the S3 client, made here, shared with the daemon's ``S3Sink``) downloads documents;
    ``limits.max_bytes`` is checked against the event's size before downloading. ``executor`` runs
    this source's blocking S3 calls, and the pipeline runs its sink's on it too, so a bucket that
    does not answer holds back only its own work.
    """

    def __init__(self, cfg: S3Config, *, name: str, limits: LimitsConfig | None) -> None:
        self.cfg = cfg
        self.name = name
        self.max_bytes = (limits or LimitsConfig()).max_bytes
        self.client = new_client(cfg, "s3")
        self.executor = S3Threads(name)
        self._submit: Submit | None = None
        self._reject: Reject | None = None

    def _job(self, obj: S3Object, receipt: str | None = None) -> Job:
        return Job(
            origin=obj,
            source=self.name,
            priority=self.cfg.priority,
            prompt=self.cfg.prompt,
            max_bytes=self.max_bytes,
            receipt=receipt,
            duplicates=self.cfg.duplicates,
        )

    def _accepted(self, body: Any) -> list[S3Object]:
        """The documents a notification body announces; everything else is logged and dropped."""
        accepted, malformed = [], []
        for record in event_records(body):
            try:
                obj = created_object(record)
            except ValueError as exc:
                malformed.append(str(exc))
                continue
            reason = "not_created" if obj is None else refusal(self.cfg, obj)
            if reason is None and obj is not None:
                accepted.append(obj)
            else:
                log.debug(
                    "s3_event_ignored",
                    source=self.name,
                    reason=reason,
                    uri=obj.uri if obj else None,
                    s3_event=str(record.get("eventName"))[:100],
                )
        if malformed:  # one line per body, however many records it holds
            log.warning(
                "s3_event_ignored",
                source=self.name,
                reason="malformed",
                records=len(malformed),
                error=malformed[0],
            )
        return accepted

    async def _submit_job(self, job: Job) -> None:
        """Hand a job to the pipeline. A failure no retry can cure (S3 refuses the event's bucket or
        key) is given up through ``reject`` (recorded, logged, counted) rather than raised: a sender
        told to retry would resend it for ever, and with it every event behind it."""
        assert self._submit is not None and self._reject is not None
        try:
            answer = await self._submit(job)
            if answer.final:  # settled with nothing run: its event is acknowledged as after a run
                await self.finish(job, answer.settled, answer.kind)
        except PermanentError as exc:
            log.warning(
                "s3_event_given_up",
                source=self.name,
                uri=job.origin.uri,
                kind=exc.kind,
                error=exc.message,
            )
            await self._reject(job, exc, 0)
            return
        except OcrwatchError as exc:
            log.warning(
                "s3_submit_failed",
                source=self.name,
                uri=job.origin.uri,
                kind=exc.kind,
                error=exc.message,
            )
            raise
        except Exception as exc:
            log.exception(
                "s3_submit_failed", source=self.name, uri=job.origin.uri, error=error_code(exc)
            )
            raise
        log.info("s3_job_submitted", source=self.name, uri=job.origin.uri, key=job.key)

    async def finish(self, job: Job, outcome: Outcome, kind: str | None = None) -> None:
        """Settle the events announcing ``job``: each transport that holds them (SQS, AMQP) does it
        its own way; one answered at once (a webhook) has nothing left to settle."""

    # -- fetch

    async def fetch(self, job: Job, spool_dir: Path, read: Read | None = None) -> Fetched:
        """Stream the object the event announced into a 0600 spool file, refusing oversize before
        downloading, and hash it on the way (an object's admission reads nothing: ``read`` is
        None): the sidecars' sha256 is that of the very bytes processed. The download is pinned to
        the event's ETag and versionId, so what is processed is the version announced."""
        obj = job.origin
        if not isinstance(obj, S3Object):
            raise TypeError(f"{self.name} cannot fetch {obj!r}")
        limit = job.max_bytes or self.max_bytes
        if obj.size is not None and obj.size > limit:
            raise FileTooLarge(f"{obj.uri} has {obj.size} bytes, more than the limit of {limit}")
        loop = asyncio.get_running_loop()
        download = functools.partial(
            contextvars.copy_context().run, self._download, obj, spool_dir, limit
        )
        path, digest = await loop.run_in_executor(self.executor, download)
        return Fetched(path, sha256=digest)

    def _download(self, obj: S3Object, spool_dir: Path, limit: int) -> tuple[Path, str]:
        suffix = PurePosixPath(obj.key).suffix
        fd, name = tempfile.mkstemp(
            prefix="s3-", suffix=suffix if re.fullmatch(r"\.\w{1,8}", suffix) else "", dir=spool_dir
        )
        os.close(fd)
        path = Path(name)
        request: dict[str, Any] = {"Bucket": obj.bucket, "Key": obj.key}
        if obj.etag:
            request["IfMatch"] = f'"{obj.etag}"'
        if obj.version_id:
            request["VersionId"] = obj.version_id
        try:
            digest = call(self._download_once, request=request, path=path, limit=limit, uri=obj.uri)
        except botocore.exceptions.ClientError as exc:
            path.unlink(missing_ok=True)
            if is_not_found(exc):
                raise SourceGone(f"{obj.uri} no longer exists") from None
            if error_code(exc) in ("PreconditionFailed", "412"):
                raise SourceGone(
                    f"{obj.uri} changed since the event (its new version has its own event)"
                ) from None
            raise storage_error(exc, f"downloading {obj.uri}") from None
        except OcrwatchError:
            path.unlink(missing_ok=True)
            raise
        except Exception as exc:
            path.unlink(missing_ok=True)
            raise storage_error(exc, f"downloading {obj.uri}") from None
        return path, digest

    def _download_once(self, request: dict[str, Any], path: Path, limit: int, uri: str) -> str:
        response = self.client.get_object(**request)
        body = response["Body"]
        digest = hashlib.sha256()
        with contextlib.closing(body), open(path, "wb") as out:
            if response.get("ContentLength", 0) > limit:
                raise FileTooLarge(
                    f"{uri} has {response['ContentLength']} bytes, more than the limit of {limit}"
                )
            for chunk in body.iter_chunks(MiB):
                out.write(chunk)
                digest.update(chunk)
                if out.tell() > limit:
                    raise FileTooLarge(f"{uri} has more than the limit of {limit} bytes")
        return digest.hexdigest()
