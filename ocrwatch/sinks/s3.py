"""Sidecars as S3 objects: beside the source key, or under ``output_bucket``/``output_prefix``.

``report.pdf`` → ``report.pdf.md`` (``text/markdown; charset=utf-8``), ``report.pdf.json`` and
``report.pdf.error.json`` (``application/json``), named by ``sidecar_names`` like local sidecars. A
PUT is atomic (an object appears whole or not at all), so no temporary names are needed; the JSON
goes last and is the commit marker. Every sidecar carries ``ocrwatch-source-etag`` (and
``ocrwatch-source-version-id``) metadata, linking it to the exact source it describes. The source
never takes these keys for documents. The further outputs go beside them, before the JSON:
``report.pdf.ocr.pdf`` (``application/pdf``) and the figures under ``report.pdf.assets/``
(``image/png``); a previous version's figures are found by listing that prefix.

The sink contract (``sinks.base``) holds here as for local files: every sidecar's key must fit S3's
1024 bytes before anything is written (a key that cannot exist holds nothing, so ``recorded`` is
None for it rather than an error the sender would be asked to retry for ever); only ocrwatch's own
objects are replaced or removed, recognised by a bounded ranged read of their head (a searchable PDF
no JSON records: by its mark, read whole); a failure removes the previous version's result.
"""

from __future__ import annotations

import tempfile
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import botocore.exceptions
import structlog

from ocrwatch.config import S3Config
from ocrwatch.errors import NameTooLong, OcrwatchError, OutputConflict, OutputNotWritable
from ocrwatch import textlayer
from ocrwatch.naming import FIGURE_FILE, output_names, sidecar_names
from ocrwatch.s3client import (
    MAX_KEY_BYTES,
    InvalidRequest,
    call,
    error_code,
    is_invalid_name,
    is_not_found,
    new_client,
    storage_error,
)
from ocrwatch.sinks.base import (
    HEAD_BYTES,
    NO_EXTRAS,
    RECALL_BYTES,
    Extra,
    Recalled,
    extra_names,
    json_member,
    markdown_bytes,
    marked,
    owns_json,
    pdf_recorded,
)
from ocrwatch.sinks.local import dump_json
from ocrwatch.safefs import Access
from ocrwatch.sources.base import Job, S3Object

log = structlog.get_logger()

Listed = frozenset[str] | None
"""The keys one listing found under a job's outputs' prefix; None where none was made."""

MARKDOWN = "text/markdown; charset=utf-8"
JSON = "application/json"
CONTENT_TYPES = {".pdf": "application/pdf", ".png": "image/png"}
PROBE_BYTES = 4096


class S3Sink:
    """A ``Sink`` for jobs whose origin is an ``S3Object``. Blocking; safe to call from several
    threads."""

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
        return self.cfg.output_bucket or obj.bucket, {
            kind: prefix + value for kind, value in names.items()
        }

    def recorded(self, job: Job) -> dict[str, Any] | None:
        """A key too long to exist holds nothing: None, and ``write`` says why once the document is
        processed."""
        bucket, keys = self.location(job)
        head = self._head(bucket, keys["json"], HEAD_BYTES)
        if head is None or not owns_json(head) or self._head(bucket, keys["md"], 1) is None:
            return None  # without its Markdown the document is done again
        source = json_member(head, "source")
        return source if isinstance(source, dict) else None

    def recall(self, job: Job, owner: int | None) -> Recalled | None:
        """By the mark, as every other S3 judgement: an object's writers are the bucket's policy."""
        bucket, keys = self.location(job)
        raw = self._head(bucket, keys["json"], RECALL_BYTES)
        if raw is None or len(raw) >= RECALL_BYTES or not owns_json(raw):
            return None
        markdown = self._head(bucket, keys["md"], RECALL_BYTES)
        return Recalled.parse(markdown if markdown and len(markdown) < RECALL_BYTES else None, raw)

    def outputs(self, job: Job) -> dict[str, str]:
        """The keys of the job's further outputs: ``pdf``, the searchable PDF, and ``assets``, the
        figures' prefix (without its ``/``)."""
        _, keys = self.location(job)
        folder = keys["json"][: len(keys["json"]) - len(keys["json"].rpartition("/")[2])]
        return {
            kind: folder + name
            for kind, name in output_names(_origin(job).name, self.name_template).items()
        }

    def status(self, job: Job) -> str | None:
        bucket, keys = self.location(job)
        head = self._head(bucket, keys["json"], PROBE_BYTES)
        status = json_member(head, "status") if head is not None and owns_json(head) else None
        return status if isinstance(status, str) else None

    def write(
        self,
        job: Job,
        markdown: str,
        document: dict[str, Any],
        extras: Mapping[str, Extra] = NO_EXTRAS,
        access: Access | None = None,
    ) -> None:
        """``access`` is not applied: an object's readers are the bucket's policy, not its source's
        mode."""
        bucket, keys = self.location(job)
        outputs = self.outputs(job)
        extra_names(extras, {kind: key.rpartition("/")[2] for kind, key in outputs.items()})
        folder = outputs["pdf"][: len(outputs["pdf"]) - len(outputs["pdf"].rpartition("/")[2])]
        targets = {folder + name: content for name, content in extras.items()}
        there = self._listed(bucket, [*keys.values(), *outputs.values(), *targets])
        self._prepare(bucket, {**keys, **{name: name for name in targets}}, there, "md", "json")
        pdf_ours = self._pdf_ours(bucket, keys["json"], outputs["pdf"], there)
        self._check_extras(bucket, outputs, targets, pdf_ours, there)
        self._put(job, bucket, keys["md"], markdown_bytes(markdown), MARKDOWN)
        for key, content in targets.items():
            self._put(job, bucket, key, content, CONTENT_TYPES[key[key.rfind(".") :]])
        self._put(job, bucket, keys["json"], dump_json(document), JSON)
        self._remove_own(bucket, keys, there, "error")  # the result stands: a stale error is untidy
        self._remove_stale(bucket, outputs, set(targets), pdf_ours, there)

    def write_error(self, job: Job, error: dict[str, Any]) -> None:
        bucket, keys = self.location(job)
        outputs = self.outputs(job)
        there = self._listed(bucket, [*keys.values(), *outputs.values()])
        self._prepare(bucket, keys, there, "error")
        pdf_ours = self._pdf_ours(bucket, keys["json"], outputs["pdf"], there)
        self._put(job, bucket, keys["error"], dump_json(error), JSON)
        self._remove_own(bucket, keys, there, "json", "md")  # an earlier version's result must go
        self._remove_stale(bucket, outputs, set(), pdf_ours, there)

    # -- the further outputs: checked before writing, removed once no result describes them

    def _pdf_ours(self, bucket: str, key: str, pdf: str, there: Listed) -> bool:
        """Whether the searchable PDF at ``pdf`` is ocrwatch's: the JSON sidecar at ``key`` is
        ocrwatch's and records one, or the object carries ocrwatch's mark (``textlayer.is_ours``: a
        write that never reached its JSON left it). The object is read into a spooled file, as qpdf
        reads its end first."""
        if pdf_recorded(self._head(bucket, key, HEAD_BYTES, there)):
            return True
        if self._head(bucket, pdf, 1, there) is None:
            return False
        with (
            tempfile.TemporaryFile() as copy
        ):  # a real file: pikepdf cannot read a spooled one on Python 3.10

            def fetch() -> None:  # each attempt from the start
                copy.seek(0)
                copy.truncate()
                self._client.download_fileobj(bucket, pdf, copy)

            try:
                call(fetch)
            except Exception as exc:
                if is_not_found(exc):
                    return False
                raise storage_error(exc, f"reading s3://{bucket}/{pdf}") from None
            copy.seek(0)
            return textlayer.is_ours(copy)

    def _check_extras(
        self,
        bucket: str,
        outputs: dict[str, str],
        targets: Mapping[str, Extra],
        pdf_ours: bool,
        there: Listed,
    ) -> None:
        for key in targets:
            head = self._head(bucket, key, PROBE_BYTES, there)
            ours = (
                pdf_ours if key == outputs["pdf"] else head is not None and marked("assets", head)
            )
            if head is not None and not ours:
                raise OutputConflict(
                    f"s3://{bucket}/{key} is an object ocrwatch did not write; ocrwatch writes an "
                    "output there and "
                    "replaces only its own",
                    hint="move that object away (or set output_bucket/output_prefix), then "
                    "`ocrwatch retry`",
                )

    def _remove_stale(
        self, bucket: str, outputs: dict[str, str], kept: set[str], pdf_ours: bool, there: Listed
    ) -> None:
        """Delete the outputs a previous version wrote that are not in ``kept``: the searchable PDF
        its JSON recorded, and the figures under the assets prefix that carry ocrwatch's mark.
        Logged, never raised."""
        doomed = [outputs["pdf"]] if pdf_ours and outputs["pdf"] not in kept else []
        prefix = outputs["assets"] + "/"
        try:
            if there is not None:
                listed: Iterable[str] = (key for key in there if key.startswith(prefix))
            else:
                paginator = self._client.get_paginator("list_objects_v2")
                pages = paginator.paginate(Bucket=bucket, Prefix=prefix)
                listed = (item["Key"] for page in pages for item in page.get("Contents", []))
            for key in listed:
                if key not in kept and FIGURE_FILE.fullmatch(key[len(prefix) :]):
                    head = self._head(bucket, key, PROBE_BYTES)
                    if head is not None and marked("assets", head):
                        doomed.append(key)
            for key in doomed:
                call(self._client.delete_object, Bucket=bucket, Key=key)
        except Exception as exc:
            log.warning(
                "stale_output_not_removed", uri=f"s3://{bucket}/{prefix}", error=error_code(exc)
            )

    # -- checks before writing, and removal of what ocrwatch wrote

    def _prepare(self, bucket: str, keys: dict[str, str], there: Listed, *kinds: str) -> None:
        """Every sidecar's key fits (all three: a result whose error sidecar cannot exist is refused
        too), and nothing but ocrwatch's own objects holds the keys about to be written."""
        for key in keys.values():
            if not _fits(key):
                size = len(key.encode("utf-8", "surrogatepass"))
                raise NameTooLong(
                    f"the sidecar key s3://{bucket}/{key[:40]}... would be {size} bytes long; S3 "
                    "allows "
                    f"{MAX_KEY_BYTES}",
                    hint=f"give the object a key {size - MAX_KEY_BYTES} or more bytes shorter, or "
                    "set a shorter "
                    "[output] name_template",
                )
        owned = self._owned(bucket, keys, kinds, there)
        for kind in kinds:
            if owned[kind] is False:
                raise OutputConflict(
                    f"s3://{bucket}/{keys[kind]} is an object ocrwatch did not write; ocrwatch "
                    "writes a sidecar "
                    "there and replaces only its own",
                    hint="move that object away (or set output_bucket/output_prefix or a "
                    "different [output] "
                    "name_template), then `ocrwatch retry`",
                )

    def _remove_own(self, bucket: str, keys: dict[str, str], there: Listed, *kinds: str) -> None:
        """Delete the named sidecars where ocrwatch wrote them (in order); a failure is logged,
        never raised: what was just written stands."""
        owned = self._owned(bucket, keys, kinds, there)
        for kind in kinds:
            if owned[kind] is not True:
                continue
            try:
                call(self._client.delete_object, Bucket=bucket, Key=keys[kind])
            except Exception as exc:
                log.warning(
                    "stale_sidecar_not_removed",
                    uri=f"s3://{bucket}/{keys[kind]}",
                    error=error_code(exc),
                )

    def _owned(
        self, bucket: str, keys: dict[str, str], kinds: tuple[str, ...], there: Listed = None
    ) -> dict[str, bool | None]:
        """Per sidecar of ``kinds``: None when no object holds its key, True when ocrwatch wrote the
        one there, else False, by the mark rule (``sinks.base.marked``)."""
        heads = {kind: self._head(bucket, keys[kind], PROBE_BYTES, there) for kind in kinds}
        return {kind: None if head is None else marked(kind, head) for kind, head in heads.items()}

    def _listed(self, bucket: str, keys: list[str]) -> Listed:
        """The objects under the prefix ``keys`` share, in one listing, so that a key not there is
        not read (None: more than a page, or no listing allowed; each key is then read)."""
        prefix = os.path.commonprefix(keys)
        try:
            page = call(self._client.list_objects_v2, Bucket=bucket, Prefix=prefix)
        except Exception as exc:
            log.debug("s3_listing_skipped", uri=f"s3://{bucket}/{prefix}", error=error_code(exc))
            return None
        if page.get("IsTruncated"):
            return None
        return frozenset(str(item["Key"]) for item in page.get("Contents", []))

    def _head(self, bucket: str, key: str, size: int, there: Listed = None) -> bytes | None:
        """The first ``size`` bytes of an object (a ranged read: whatever lies there is never read
        whole), or None when there is none (``there``: the keys a listing found, when one was
        made)."""
        uri = f"s3://{bucket}/{key}"
        if not _fits(key) or (there is not None and key not in there):
            return None
        try:
            response = call(
                self._client.get_object, Bucket=bucket, Key=key, Range=f"bytes=0-{size - 1}"
            )
            body = response["Body"]
            try:
                return bytes(body.read(size))
            finally:
                body.close()
        except Exception as exc:
            if is_not_found(exc):
                return None
            if (
                error_code(exc) == "InvalidRange"
            ):  # an empty object: there, but not one ocrwatch wrote
                return b""
            error = storage_error(exc, f"reading {uri}")
            if isinstance(error, InvalidRequest):
                return None  # a bucket or key S3 refuses as a name holds nothing
            raise error from None

    def _put(self, job: Job, bucket: str, key: str, body: bytes | Path, content_type: str) -> None:
        obj = _origin(job)
        metadata = {
            "ocrwatch-source-etag": obj.etag or "",
            "ocrwatch-source-version-id": obj.version_id or "",
        }
        try:
            call(
                self._put_once,
                body=body,
                Bucket=bucket,
                Key=key,
                ContentType=content_type,
                Metadata={name: value for name, value in metadata.items() if value},
            )
        except Exception as exc:
            raise _write_error(exc, f"s3://{bucket}/{key}") from None
        log.debug("s3_sidecar_written", uri=f"s3://{bucket}/{key}")

    def _put_once(self, body: bytes | Path, **request: Any) -> None:
        """One PUT; a file body is opened afresh for each attempt, so a retry sends it whole
        again."""
        if isinstance(body, Path):
            with open(body, "rb") as handle:
                self._client.put_object(Body=handle, **request)
        else:
            self._client.put_object(Body=body, **request)


def _fits(key: str) -> bool:
    return len(key.encode("utf-8", "surrogatepass")) <= MAX_KEY_BYTES


def _origin(job: Job) -> S3Object:
    if not isinstance(job.origin, S3Object):
        raise TypeError(f"S3Sink cannot write sidecars for {job.origin!r}")
    return job.origin


def _write_error(exc: BaseException, uri: str) -> OcrwatchError:
    if isinstance(exc, botocore.exceptions.ClientError) and is_invalid_name(exc):
        return NameTooLong(
            f"cannot write {uri}: S3 refuses the key ({error_code(exc)})",
            hint="give the object a shorter key, or a shorter [output] name_template",
        )
    if isinstance(exc, botocore.exceptions.ClientError) and error_code(exc) in (
        "AccessDenied",
        "NoSuchBucket",
    ):
        hint = "grant s3:PutObject and s3:DeleteObject on the sidecar keys, or set output_bucket"
        return OutputNotWritable(f"cannot write {uri}: {error_code(exc)}", hint=hint)
    return storage_error(exc, f"writing {uri}")
