"""Sidecars as S3 objects: beside the source key, or under ``output_bucket``/``output_prefix``.

``report.pdf`` → ``report.pdf.md`` (``text/markdown; charset=utf-8``), ``report.pdf.json`` and
``report.pdf.error.json`` (``application/json``), named by ``sidecar_names`` like local sidecars. A PUT is atomic
(an object appears whole or not at all), so no temporary names are needed; the JSON goes last and is the
commit marker. Every sidecar carries ``ocrwatch-source-etag`` (and ``ocrwatch-source-version-id``) metadata,
linking it to the exact source it describes. The source never takes these keys for documents.
"""

from __future__ import annotations

import json
from typing import Any

import botocore.exceptions
import structlog

from ocrwatch.config import S3Config
from ocrwatch.errors import NameTooLong, OcrwatchError, OutputNotWritable
from ocrwatch.naming import sidecar_names
from ocrwatch.s3client import call, error_code, new_client, storage_error
from ocrwatch.sinks.local import dump_json
from ocrwatch.sources.base import Job, S3Object

log = structlog.get_logger()

MARKDOWN = "text/markdown; charset=utf-8"
JSON = "application/json"


class S3Sink:
    """A ``Sink`` for jobs whose origin is an ``S3Object``. Blocking; safe to call from several threads."""

    def __init__(self, cfg: S3Config, client: Any = None, name_template: str = "{name}") -> None:
        self.cfg = cfg
        self.name_template = name_template
        self._client = client if client is not None else new_client(cfg, "s3")

    def location(self, job: Job) -> tuple[str, dict[str, str]]:
        """The bucket and the keys of the job's three sidecars."""
        obj = _origin(job)
        folder, _, name = obj.key.rpartition("/")
        prefix = self.cfg.output_prefix + (f"{folder}/" if folder else "")
        names = sidecar_names(name, self.name_template)
        return self.cfg.output_bucket or obj.bucket, {kind: prefix + value for kind, value in names.items()}

    def recorded(self, job: Job) -> dict[str, Any] | None:
        bucket, keys = self.location(job)
        try:
            response = call(self._client.get_object, Bucket=bucket, Key=keys["json"])
            document = json.loads(response["Body"].read())
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) in ("NoSuchKey", "404", "NotFound"):
                return None
            raise storage_error(exc, f"reading s3://{bucket}/{keys['json']}") from None
        except ValueError:
            log.warning("s3_sidecar_unparseable", uri=f"s3://{bucket}/{keys['json']}")
            return None
        except Exception as exc:
            raise storage_error(exc, f"reading s3://{bucket}/{keys['json']}") from None
        source = document.get("source") if isinstance(document, dict) else None
        return source if isinstance(source, dict) else None

    def write(self, job: Job, markdown: str, document: dict[str, Any]) -> None:
        bucket, keys = self.location(job)
        self._put(job, bucket, keys["md"], markdown.encode("utf-8"), MARKDOWN)
        self._put(job, bucket, keys["json"], dump_json(document), JSON)
        try:
            call(self._client.delete_object, Bucket=bucket, Key=keys["error"])
        except Exception as exc:  # a stale error sidecar beside a good result is untidy, not wrong
            log.warning("s3_error_sidecar_not_removed", uri=f"s3://{bucket}/{keys['error']}", error=error_code(exc))

    def write_error(self, job: Job, error: dict[str, Any]) -> None:
        bucket, keys = self.location(job)
        self._put(job, bucket, keys["error"], dump_json(error), JSON)

    def _put(self, job: Job, bucket: str, key: str, body: bytes, content_type: str) -> None:
        obj = _origin(job)
        metadata = {"ocrwatch-source-etag": obj.etag or "", "ocrwatch-source-version-id": obj.version_id or ""}
        try:
            call(self._client.put_object, Bucket=bucket, Key=key, Body=body, ContentType=content_type,
                 Metadata={name: value for name, value in metadata.items() if value})
        except Exception as exc:
            raise _write_error(exc, f"s3://{bucket}/{key}") from None
        log.debug("s3_sidecar_written", uri=f"s3://{bucket}/{key}", bytes=len(body))


def _origin(job: Job) -> S3Object:
    if not isinstance(job.origin, S3Object):
        raise TypeError(f"S3Sink cannot write sidecars for {job.origin!r}")
    return job.origin


def _write_error(exc: BaseException, uri: str) -> OcrwatchError:
    if isinstance(exc, botocore.exceptions.ClientError) and error_code(exc) in ("KeyTooLongError", "InvalidObjectName"):
        return NameTooLong(f"cannot write {uri}: the key is longer than S3's 1024 bytes",
                           hint="give the object a shorter key, or a shorter [output] name_template")
    if isinstance(exc, botocore.exceptions.ClientError) and error_code(exc) in ("AccessDenied", "NoSuchBucket"):
        hint = "grant s3:PutObject and s3:DeleteObject on the sidecar keys, or set output_bucket"
        return OutputNotWritable(f"cannot write {uri}: {error_code(exc)}", hint=hint)
    return storage_error(exc, f"writing {uri}")
