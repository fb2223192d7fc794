"""Sidecars as S3 objects: beside the source key, or under ``output_bucket``/``output_prefix``.

``report.pdf`` → ``report.pdf.md`` (``text/markdown; charset=utf-8``), ``report.pdf.json`` and
``report.pdf.error.json`` (``application/json``), named by ``sidecar_names`` like local sidecars. A
PUT is atomic (an object appears whole or not at all), so no temporary names are needed; the JSON
goes last and is the commit marker. Every sidecar carries ``ocrwatch-source-etag`` (and
``ocrwatch-source-version-id``) metadata, linking it to the exact source it describes, and the
record of what it is and whose (``written.object_record``). The source never takes these keys for
documents. The further outputs go beside them, before the JSON:
``report.pdf.ocr.pdf`` (``application/pdf``), ``report.pdf.alto.xml`` (``application/xml``),
``report.pdf.hocr`` (``application/xhtml+xml``) and the figures under ``report.pdf.assets/``
(``image/png``); a previous version's figures are found by listing that prefix.

The sink contract (``sinks.base``) holds here as for local files: every sidecar's key must fit S3's
1024 bytes before anything is written (a key that cannot exist holds nothing, so ``recorded`` is
None for it rather than an error the sender would be asked to retry for ever); a failure removes the
previous version's result. An object is ocrwatch's to replace, remove, count as done or reuse only
where the record it carries says so for this very source (bucket and key): the one ownership rule of
both sinks, ``ownership.judge_object``, asked with what one bounded ranged read of the object finds
(its ETag and metadata; its head for the mark of an output an older ocrwatch wrote). A user's
object, one edited since, or ocrwatch's output for another source at the same key (two buckets, or
two names one template maps to one sidecar) is ``output_conflict``, naming it.

Where several ``[[s3]]`` tables write into one ``output_bucket`` (``shares_output``), each source
bucket's sidecars go under a folder of its own, ``output_prefix`` + ``BUCKET/`` + key, as ``[output]
dir`` gives each inbox one: two buckets never share a sidecar key. What the configuration cannot
tell (one table whose events come from several buckets) the record keeps apart.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import botocore.exceptions
import structlog

from ocrwatch.config import S3Config
from ocrwatch.errors import NameTooLong, OcrwatchError, OutputConflict, OutputNotWritable
from ocrwatch.infra.s3client import (
    MAX_KEY_BYTES,
    InvalidRequest,
    call,
    error_code,
    is_invalid_name,
    is_not_found,
    new_client,
    storage_error,
)
from ocrwatch.naming import FIGURE_FILE, LAYOUTS, output_names, sidecar_names
from ocrwatch.safefs import Access
from ocrwatch.sinks.base import (
    HEAD_BYTES,
    NO_EXTRAS,
    RECALL_BYTES,
    Extra,
    Recalled,
    dump_json,
    extra_names,
    json_member,
    markdown_bytes,
)
from ocrwatch.sinks.ownership import (
    Stored,
    Verdict,
    judge_object,
    layout_recorded,
    marked,
    owns_json,
    pdf_marked,
    pdf_recorded,
)
from ocrwatch.sources.base import Job, S3Object
from ocrwatch.store.written import object_owner, object_record

log = structlog.get_logger()

Listed = frozenset[str] | None
"""The keys one listing found under a job's outputs' prefix; None where none was made."""
Read = tuple[bytes, Stored]
"""The first bytes of an object, and what the read found of it."""
Mark = Callable[[bytes], bool]
"""Whether an object beginning with these bytes carries ocrwatch's mark (``ownership.marked``)."""

MARKDOWN = "text/markdown; charset=utf-8"
JSON = "application/json"
CONTENT_TYPES = {
    ".pdf": "application/pdf",
    ".png": "image/png",
    ".xml": "application/xml",
    ".hocr": "application/xhtml+xml",
}
PROBE_BYTES = 4096


class S3Sink:
    """A ``Sink`` for jobs whose origin is an ``S3Object``. Blocking; safe to call from several
    threads. ``tables``: every ``[[s3]]`` table configured, so that a shared ``output_bucket`` gives
    each source bucket a folder of its own (``shares_output``)."""

    def __init__(
        self,
        cfg: S3Config,
        client: Any = None,
        name_template: str = "{name}",
        tables: Sequence[S3Config] = (),
    ) -> None:
        self.cfg = cfg
        self.name_template = name_template
        self._client = client if client is not None else new_client(cfg, "s3")
        self._apart = shares_output(cfg, tables)

    def location(self, job: Job) -> tuple[str, dict[str, str]]:
        """The bucket and the keys of the job's three sidecars."""
        obj = _origin(job)
        folder, _, name = obj.key.rpartition("/")
        apart = f"{obj.bucket}/" if self._apart else ""
        prefix = self.cfg.output_prefix + apart + (f"{folder}/" if folder else "")
        names = sidecar_names(name, self.name_template)
        return self.cfg.output_bucket or obj.bucket, {
            kind: prefix + value for kind, value in names.items()
        }

    def recorded(self, job: Job) -> dict[str, Any] | None:
        """A key too long to exist holds nothing: None, and ``write`` says why once the document is
        processed. Another source's JSON at the key (a user's, or ocrwatch's for another source)
        records nothing of this one."""
        bucket, keys = self.location(job)
        read = self._read(bucket, keys["json"], HEAD_BYTES)
        if read is None or not self._judged(job, bucket, keys["json"], read, _mark("json")).ours:
            return None
        if not owns_json(read[0]) or self._head(bucket, keys["md"], 1) is None:
            return None  # without its Markdown the document is done again
        source = json_member(read[0], "source")
        return source if isinstance(source, dict) else None

    def recall(self, job: Job, owner: int | None) -> Recalled | None:
        """Where the record each object carries vouches for the very bytes read as this job's
        source's (``owner``, a local file's user, is None here: an object's is its source)."""
        bucket, keys = self.location(job)
        return Recalled.parse(
            self._vouched(job, bucket, keys["md"]), self._vouched(job, bucket, keys["json"])
        )

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
        read = self._read(bucket, keys["json"], PROBE_BYTES)
        if read is None or not self._judged(job, bucket, keys["json"], read, _mark("json")).ours:
            return None
        status = json_member(read[0], "status") if owns_json(read[0]) else None
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
        self._prepare(
            job, bucket, {**keys, **{name: name for name in targets}}, there, "md", "json"
        )
        pdf = self._pdf_verdict(job, bucket, keys["json"], outputs["pdf"], there)
        judged = {outputs["pdf"]: pdf, **self._layout_verdicts(job, bucket, keys, outputs, there)}
        self._check_extras(job, bucket, targets, judged, there)
        self._put(job, bucket, keys["md"], markdown_bytes(markdown), MARKDOWN)
        for key, content in targets.items():
            self._put(job, bucket, key, content, CONTENT_TYPES[key[key.rfind(".") :]])
        self._put(job, bucket, keys["json"], dump_json(document), JSON)
        self._remove_own(job, bucket, keys, there, "error")  # a stale error is only untidy
        self._remove_stale(job, bucket, outputs, set(targets), _ours_of(judged), there)

    def write_error(self, job: Job, error: dict[str, Any]) -> None:
        bucket, keys = self.location(job)
        outputs = self.outputs(job)
        there = self._listed(bucket, [*keys.values(), *outputs.values()])
        self._prepare(job, bucket, keys, there, "error")
        # asked before the JSON that may record it goes
        pdf = self._pdf_verdict(job, bucket, keys["json"], outputs["pdf"], there)
        judged = {outputs["pdf"]: pdf, **self._layout_verdicts(job, bucket, keys, outputs, there)}
        self._put(job, bucket, keys["error"], dump_json(error), JSON)
        self._remove_own(job, bucket, keys, there, "json", "md")  # an earlier result must go
        self._remove_stale(job, bucket, outputs, set(), _ours_of(judged), there)

    # -- the further outputs: checked before writing, removed once no result describes them

    def _pdf_verdict(
        self, job: Job, bucket: str, key: str, pdf: str, there: Listed
    ) -> Verdict | None:
        """Whether the searchable PDF at ``pdf`` is ocrwatch's for this job (None: there is none).
        Where the object carries no record (an older ocrwatch's), its mark decides: the JSON sidecar
        at ``key`` is ocrwatch's and records one, or the object itself carries ocrwatch's mark
        (``ownership.pdf_marked``), read whole into a file, as qpdf reads its end first."""

        def marked(head: bytes) -> bool:
            recorded = pdf_recorded(self._head(bucket, key, HEAD_BYTES, there))
            return pdf_marked(recorded, lambda: self._downloaded(bucket, pdf))

        return self._verdict(job, bucket, pdf, there, marked)

    @contextlib.contextmanager
    def _downloaded(self, bucket: str, key: str) -> Iterator[BinaryIO | None]:
        """The whole object at ``key``, in a temporary file (None: it is gone)."""
        with tempfile.TemporaryFile() as copy:  # pikepdf cannot read a spooled one (3.10)

            def fetch() -> None:  # each attempt from the start
                copy.seek(0)
                copy.truncate()
                self._client.download_fileobj(bucket, key, copy)

            try:
                call(fetch)
            except Exception as exc:
                if is_not_found(exc):
                    yield None
                    return
                raise storage_error(exc, f"reading s3://{bucket}/{key}") from None
            copy.seek(0)
            yield copy

    def _layout_verdicts(
        self, job: Job, bucket: str, keys: dict[str, str], outputs: dict[str, str], there: Listed
    ) -> dict[str, Verdict | None]:
        """Whether the ALTO and hOCR objects are ocrwatch's for this job (by key; None: there is
        none). Where one carries no record, the JSON sidecar decides: ocrwatch's, and recording
        it."""

        def recorded(kind: str) -> Mark:
            return lambda head: layout_recorded(self._head(bucket, keys["json"], HEAD_BYTES), kind)

        return {
            outputs[kind]: self._verdict(job, bucket, outputs[kind], there, recorded(kind))
            for kind in LAYOUTS
        }

    def _check_extras(
        self,
        job: Job,
        bucket: str,
        targets: Mapping[str, Extra],
        judged: Mapping[str, Verdict | None],
        there: Listed,
    ) -> None:
        """Refuse where an object not ocrwatch's holds a key about to be written (``judged``: the
        verdicts already made, by key; a figure's is made here)."""
        for key in targets:
            if key in judged:
                verdict = judged[key]
            else:
                verdict = self._verdict(job, bucket, key, there, _mark("assets"))
            if verdict is not None and not verdict.ours:
                raise OutputConflict(
                    f"s3://{bucket}/{key} is {verdict.why}; ocrwatch writes an output there and "
                    "replaces only its own",
                    hint="move that object away (or set output_bucket/output_prefix), then "
                    "`ocrwatch retry`",
                )

    def _remove_stale(
        self,
        job: Job,
        bucket: str,
        outputs: dict[str, str],
        kept: set[str],
        ours: set[str],
        there: Listed,
    ) -> None:
        """Delete the outputs a previous version wrote that are not in ``kept``: the searchable PDF
        and the ALTO and hOCR files where ocrwatch's (``ours``, judged before anything was
        written), and the figures under the assets prefix that are ocrwatch's for this job. Logged,
        never raised."""
        doomed = sorted(ours - kept)
        prefix = outputs["assets"] + "/"
        try:
            if there is not None:
                listed: Iterable[str] = (key for key in there if key.startswith(prefix))
            else:
                paginator = self._client.get_paginator("list_objects_v2")
                pages = paginator.paginate(Bucket=bucket, Prefix=prefix)
                listed = (item["Key"] for page in pages for item in page.get("Contents", []))
            for key in listed:
                figure = key not in kept and FIGURE_FILE.fullmatch(key[len(prefix) :])
                if figure and _ours(self._verdict(job, bucket, key, None, _mark("assets"))):
                    doomed.append(key)
            for key in doomed:
                call(self._client.delete_object, Bucket=bucket, Key=key)
        except Exception as exc:
            log.warning(
                "stale_output_not_removed", uri=f"s3://{bucket}/{prefix}", error=error_code(exc)
            )

    # -- checks before writing, and removal of what ocrwatch wrote

    def _prepare(
        self, job: Job, bucket: str, keys: dict[str, str], there: Listed, *kinds: str
    ) -> None:
        """Every sidecar's key fits (all three: a result whose error sidecar cannot exist is refused
        too), and nothing but ocrwatch's own objects for this source holds the keys about to be
        written."""
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
        for kind in kinds:
            verdict = self._verdict(job, bucket, keys[kind], there, _mark(kind))
            if verdict is not None and not verdict.ours:
                raise OutputConflict(
                    f"s3://{bucket}/{keys[kind]} is {verdict.why}; ocrwatch writes a sidecar there "
                    "and replaces only its own",
                    hint="move that object away (or set output_bucket/output_prefix or a "
                    "different [output] "
                    "name_template), then `ocrwatch retry`",
                )

    def _remove_own(
        self, job: Job, bucket: str, keys: dict[str, str], there: Listed, *kinds: str
    ) -> None:
        """Delete the named sidecars where they are ocrwatch's for this job (in order); a failure
        is logged, never raised: what was just written stands."""
        for kind in kinds:
            try:
                if not _ours(self._verdict(job, bucket, keys[kind], there, _mark(kind))):
                    continue  # nothing there, or not ocrwatch's to remove
                call(self._client.delete_object, Bucket=bucket, Key=keys[kind])
            except Exception as exc:
                log.warning(
                    "stale_sidecar_not_removed",
                    uri=f"s3://{bucket}/{keys[kind]}",
                    error=error_code(exc),
                )

    def _verdict(
        self, job: Job, bucket: str, key: str, there: Listed, marked: Mark
    ) -> Verdict | None:
        """None where no object holds ``key``; else whether the one there is ocrwatch's to replace
        or remove for this job's source (``ownership.judge_object``), from one bounded read."""
        read = self._read(bucket, key, PROBE_BYTES, there)
        return None if read is None else self._judged(job, bucket, key, read, marked)

    def _judged(self, job: Job, bucket: str, key: str, read: Read, marked: Mark) -> Verdict:
        """``_verdict`` for what a read of ``key`` found there."""
        head, stored = read
        return judge_object(
            stored, _owner(job), lambda: marked(head), lambda: self._md5(bucket, key)
        )

    def _vouched(self, job: Job, bucket: str, key: str) -> bytes | None:
        """The whole object at ``key`` where its record vouches for the very bytes read as
        ocrwatch's for this job's source (no mark: an older ocrwatch's result is done again); None
        otherwise, or when it is too large."""
        read = self._read(bucket, key, RECALL_BYTES)
        if read is None or len(read[0]) >= RECALL_BYTES:
            return None
        data, stored = read
        digest = hashlib.md5(data, usedforsecurity=False).hexdigest()
        ours = judge_object(stored, _owner(job), lambda: False, lambda: digest).ours
        return data if ours else None

    def _md5(self, bucket: str, key: str) -> str | None:
        """The MD5 of the object's bytes, read whole: asked only where its ETag is not the MD5 its
        record holds (a server whose ETag is no MD5, or an object changed since). None: gone."""

        def digest() -> str:  # each attempt from the start
            hasher = hashlib.md5(usedforsecurity=False)
            body = self._client.get_object(Bucket=bucket, Key=key)["Body"]
            try:
                for chunk in body.iter_chunks(1 << 20):
                    hasher.update(chunk)
            finally:
                body.close()
            return hasher.hexdigest()

        try:
            return call(digest)
        except Exception as exc:
            if is_not_found(exc):
                return None
            raise storage_error(exc, f"reading s3://{bucket}/{key}") from None

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
        """The first ``size`` bytes of an object, or None when there is none."""
        read = self._read(bucket, key, size, there)
        return None if read is None else read[0]

    def _read(self, bucket: str, key: str, size: int, there: Listed = None) -> Read | None:
        """The first ``size`` bytes of an object (a ranged read: whatever lies there is never read
        whole) and what the read found of it, or None when there is none (``there``: the keys a
        listing found, when one was made)."""
        uri = f"s3://{bucket}/{key}"
        if not _fits(key) or (there is not None and key not in there):
            return None
        try:
            response = call(
                self._client.get_object, Bucket=bucket, Key=key, Range=f"bytes=0-{size - 1}"
            )
            body = response["Body"]
            try:
                return bytes(body.read(size)), _stored(response)
            finally:
                body.close()
        except Exception as exc:
            if is_not_found(exc):
                return None
            if error_code(exc) == "InvalidRange":  # an empty object: there, with no byte to read
                return self._empty(bucket, key)
            error = storage_error(exc, f"reading {uri}")
            if isinstance(error, InvalidRequest):
                return None  # a bucket or key S3 refuses as a name holds nothing
            raise error from None

    def _empty(self, bucket: str, key: str) -> Read | None:
        """An empty object, as its HEAD finds it (a ranged read of it has no range to answer)."""
        try:
            return b"", _stored(call(self._client.head_object, Bucket=bucket, Key=key))
        except Exception as exc:
            if is_not_found(exc):
                return None
            raise storage_error(exc, f"reading s3://{bucket}/{key}") from None

    def _put(self, job: Job, bucket: str, key: str, body: bytes | Path, content_type: str) -> None:
        """One object, with the record of what it is and whose (``written.object_record``)."""
        obj = _origin(job)
        metadata = {
            "ocrwatch-source-etag": obj.etag or "",
            "ocrwatch-source-version-id": obj.version_id or "",
            **object_record(_owner(job), _md5_of(body)),
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


def shares_output(cfg: S3Config, tables: Sequence[S3Config]) -> bool:
    """Whether ``cfg``'s sidecars go under a folder named after their source bucket: another of
    ``tables`` (every ``[[s3]]`` table) writes into its ``output_bucket`` (as its own, or beside
    its keys there) under an ``output_prefix`` that overlaps this one, and reads another bucket (or
    any). Decided from the configuration alone, like ``sinks.local.inbox_folder``: the same across
    restarts and whatever the order of the tables."""
    if cfg.output_bucket is None:
        return False
    for other in tables:
        if other is cfg:
            continue
        there, prefix = (
            (other.output_bucket, other.output_prefix)
            if other.output_bucket
            else (other.bucket, "")
        )
        one_source = other.bucket is not None and other.bucket == cfg.bucket
        overlaps = prefix.startswith(cfg.output_prefix) or cfg.output_prefix.startswith(prefix)
        if there == cfg.output_bucket and overlaps and not one_source:
            return True
    return False


def _ours_of(judged: Mapping[str, Verdict | None]) -> set[str]:
    """The keys judged to hold ocrwatch's own object for the job."""
    return {key for key, verdict in judged.items() if _ours(verdict)}


def _mark(kind: str) -> Mark:
    return functools.partial(marked, kind)


def _ours(verdict: Verdict | None) -> bool:
    """Whether an object is there and ocrwatch's own for the job (``_verdict``'s answer)."""
    return verdict is not None and verdict.ours


def _owner(job: Job) -> str:
    """Whose the job's outputs are: its source object, by bucket and key."""
    return object_owner(_origin(job).uri)


def _stored(response: Mapping[str, Any]) -> Stored:
    """What a GET or a HEAD found of an object."""
    etag = str(response.get("ETag") or "").strip('"')
    return Stored(etag, dict(response.get("Metadata") or {}))


def _md5_of(body: bytes | Path) -> str:
    """The MD5 of what a PUT sends (a file: the job's own spool copy, read whole)."""
    if isinstance(body, bytes):
        return hashlib.md5(body, usedforsecurity=False).hexdigest()
    hasher = hashlib.md5(usedforsecurity=False)
    with open(body, "rb") as handle:
        while chunk := handle.read(1 << 20):
            hasher.update(chunk)
    return hasher.hexdigest()


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
