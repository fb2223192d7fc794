"""What becomes of a source once its document is ``ok``: kept (the default), moved to the archive, or deleted.

``[output] on_success``, overridden per ``[[inbox]]`` and per ``[[s3]]``:

- ``move``, a local file: the source, then its sidecars and further outputs when they lie beside it (not under
  ``[output] dir``: those stay where the configuration puts them), go into ``[output] archive_dir``, in the
  folder that mirrors theirs under a folder per inbox (``sinks.local.inbox_folder``, as ``[output] dir``
  mirrors them). Nothing there is replaced: when a name of the group is taken, the whole group gets a number
  (``report.1.pdf``, ``report.1.pdf.md``, ...), and the Markdown's figure links and the JSON's paths follow it.
  An S3 object: copied to ``archive_prefix`` + its key (the very version read), then deleted.
- ``delete``: the local file is unlinked, its sidecars being durable already (each was fsynced, and its folder,
  when written); the S3 object's version that was read is deleted (the object, where unversioned).

Neither acts on a document that is not ``ok`` (a ``partial`` one stays for a person to look at), nor on a source
that changed since it was read. A local file is opened beneath its inbox without following a link
(``sources.beneath``), hashed again through that descriptor and compared with the sha256 of the bytes
processed; right before its name is moved or unlinked, the name must still be that file, unwritten since. An
S3 object is compared by its ETag, or addressed by its version. Every action runs once the ledger records the
document done, so a source gone from its inbox is never taken for a new one; a daemon killed in between finds
the document done at its next start and acts then (``Pipeline._done_already``). Everything here is blocking,
and a failure is logged, never raised: the document is done whatever becomes of its source.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
from collections.abc import Callable, Iterator, Mapping
from itertools import count
from pathlib import Path
from urllib.parse import quote

import structlog

from ocrwatch.config import OnSuccess, OutputConfig, S3Config
from ocrwatch.errors import SourceChanged, SourceGone, classify
from ocrwatch.metrics import Metrics
from ocrwatch.naming import output_names, sidecar_names
from ocrwatch.s3client import call, error_code
from ocrwatch.sinks.base import Sink
from ocrwatch.sinks.local import LocalSink, dump_json, inbox_folder
from ocrwatch.sources.base import Job, LocalFile, S3Object, Source
from ocrwatch.sources.beneath import CHUNK, FILE_FLAGS, FOLDER_FLAGS, folder_of, made_folders
from ocrwatch.sources.local import LocalSource

log = structlog.get_logger()

_NO_LINK = (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP)
"""``link`` cannot join the two folders (another filesystem, or one without hard links): the file is copied."""
_MEMBERS = ("md", "pdf", "assets", "json")
"""The order a group's members follow the source in: the JSON, the completion mark, last."""


class Archiver:
    """Applies each source's ``on_success`` to its finished jobs; ``sources`` and ``sinks`` are the pipeline's."""

    def __init__(
        self, output: OutputConfig, sources: Mapping[str, Source], sinks: Mapping[str, Sink], metrics: Metrics
    ) -> None:
        self.output = output
        self._sources = sources
        self._sinks = sinks
        self._metrics = metrics

    def action(self, job: Job) -> OnSuccess:
        """The job's ``on_success``: its bucket's or its inbox's, else ``[output]``'s; ``keep`` for a job of no
        inbox or bucket (``ocrwatch ocr``: the files named are the user's)."""
        source = self._sources.get(job.source)
        cfg = getattr(source, "cfg", None)
        if isinstance(job.origin, S3Object) and isinstance(cfg, S3Config):
            return cfg.on_success or self.output.on_success
        if isinstance(job.origin, LocalFile) and isinstance(source, LocalSource):
            inbox = source.inboxes().get(job.origin.inbox)
            if inbox is not None:
                return inbox.on_success or self.output.on_success
        return "keep"

    def settle(
        self, job: Job, status: str | None, sha256: str | None, changed: Callable[[], bool] | None = None
    ) -> dict[str, str] | None:
        """Act on the finished job's source as configured. ``status`` None: read from its JSON sidecar;
        ``sha256``: of the bytes processed; ``changed``: the fetch's own check, asked first. Where its ``json``
        and ``md`` sidecars are when a move took them along, so its hooks are told where they are now; None
        where they stayed (kept, deleted, an S3 object, sidecars under ``[output] dir``, a failure)."""
        action = self.action(job)
        if action == "keep":
            return None
        fields = {"uri": job.origin.uri, "action": action}
        try:
            if status is None:
                status = self._sinks[job.source].status(job)
            if status != "ok":
                log.info("source_kept", **fields, reason=f"the document is {status or 'without a result'}")
                return None
            if changed is not None and changed():
                raise SourceChanged(f"{job.origin.uri} changed since it was read")
            if isinstance(job.origin, S3Object):
                where, sidecars = self._s3(job.origin, action, self._sources[job.source]), None
            else:
                assert isinstance(job.origin, LocalFile)
                where, sidecars = self._local(job, job.origin, action, sha256)
        except (SourceChanged, SourceGone) as exc:
            log.warning("source_kept", **fields, reason=exc.message)
            self._metrics.archive_failures.labels(action=action, reason="changed").inc()
            return None
        except Exception as exc:
            error = classify(exc)
            again = "the next start tries again" if isinstance(job.origin, LocalFile) else "it stays; act on it by hand"
            log.error("source_not_archived", **fields, kind=error.kind, error=error.message, hint=again)
            self._metrics.archive_failures.labels(action=action, reason="error").inc()
            return None
        log.info("source_archived" if action == "move" else "source_deleted", **fields, to=where)
        self._metrics.archived.labels(action=action).inc()
        return sidecars

    def _local(
        self, job: Job, origin: LocalFile, action: OnSuccess, sha256: str | None
    ) -> tuple[str | None, dict[str, str] | None]:
        """Where the source went, and where its ``json`` and ``md`` sidecars did when they went along."""
        if sha256 is None:
            raise SourceChanged(f"{origin.path}: no digest of what was read to compare it with")
        if action == "delete":
            delete_local(origin.path, origin.inbox, sha256)
            return None, None
        source, sink = self._sources[job.source], self._sinks[job.source]
        assert self.output.archive_dir is not None and isinstance(source, LocalSource)
        beside = isinstance(sink, LocalSink) and sink.paths(job)["json"].parent == origin.path.parent
        roots = set(source.inboxes()) | {origin.inbox}
        target = self.output.archive_dir / inbox_folder(origin.inbox, roots)
        moved = move_local(origin.path, origin.inbox, sha256, target, self.output.name_template, beside)
        if not beside:
            return str(moved), None
        names = _group(moved.name, self.output.name_template)
        return str(moved), {kind: str(moved.parent / names[kind]) for kind in ("json", "md")}

    def _s3(self, obj: S3Object, action: OnSuccess, source: Source) -> str | None:
        client, cfg = getattr(source, "client"), getattr(source, "cfg")
        version = {"VersionId": obj.version_id} if obj.version_id else {}
        if not version:
            if not obj.etag:
                raise SourceChanged(f"{obj.uri}: no ETag or version to tell that it is the object read")
            try:
                head = call(client.head_object, Bucket=obj.bucket, Key=obj.key)
            except Exception as exc:
                if error_code(exc) in ("NoSuchKey", "404", "NotFound"):
                    raise SourceGone(f"{obj.uri} no longer exists") from None
                raise
            if str(head.get("ETag", "")).strip('"') != obj.etag:
                raise SourceChanged(f"{obj.uri} was replaced since it was read")
        target = None
        if action == "move":
            target = cfg.archive_prefix + obj.key
            condition = {"CopySourceIfMatch": f'"{obj.etag}"'} if obj.etag else {}
            try:
                call(client.copy_object, Bucket=obj.bucket, Key=target,
                     CopySource={"Bucket": obj.bucket, "Key": obj.key, **version}, **condition)  # fmt: skip
            except Exception as exc:
                if error_code(exc) in ("PreconditionFailed", "412"):
                    raise SourceChanged(f"{obj.uri} was replaced since it was read") from None
                if error_code(exc) in ("NoSuchKey", "NoSuchVersion", "404"):
                    raise SourceGone(f"{obj.uri} no longer exists") from None
                raise
        call(client.delete_object, Bucket=obj.bucket, Key=obj.key, **version)
        return None if target is None else f"s3://{obj.bucket}/{target}"


# --- local files: through folder descriptors, never following a link -------------------------------------------


def delete_local(path: Path, root: Path, sha256: str) -> None:
    """Unlink ``path`` of the inbox ``root`` if it still holds the bytes ``sha256``; its folder is fsynced."""
    with folder_of(path, root) as (folder, _):
        fd, info = _verified(folder, path, sha256)
        try:
            _unlink_same(folder, path.name, info)
        finally:
            os.close(fd)
        os.fsync(folder)


def move_local(path: Path, root: Path, sha256: str, archive: Path, template: str, sidecars: bool) -> Path:
    """Move ``path`` of the inbox ``root`` (if it still holds the bytes ``sha256``), and with ``sidecars`` its
    sidecars and outputs beside it, to the mirrored folder under ``archive``; where the source went."""
    relative = path.relative_to(root)
    with folder_of(path, root) as (source, _):
        fd, info = _verified(source, path, sha256)
        try:
            with made_folders(archive, relative.parent.parts) as target:
                name = _free_name(target, path.name, template, sidecars)
                _move_source(source, path.name, target, name, fd, info)
                if sidecars:
                    _move_group(source, _group(path.name, template), target, _group(name, template))
                os.fsync(target)
        finally:
            os.close(fd)
        os.fsync(source)
    return archive / relative.parent / name


def _verified(folder: int, path: Path, sha256: str) -> tuple[int, os.stat_result]:
    """A descriptor of the regular file ``path`` in ``folder`` whose bytes hash to ``sha256``, and its stat."""
    try:
        fd = os.open(path.name, FILE_FLAGS, dir_fd=folder)
    except FileNotFoundError:
        raise SourceGone(f"{path}: no longer exists") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SourceChanged(f"{path}: now a symlink; links are not followed") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SourceChanged(f"{path}: no longer a regular file")
        digest, offset = hashlib.sha256(), 0
        while block := os.pread(fd, CHUNK, offset):
            digest.update(block)
            offset += len(block)
        if digest.hexdigest() != sha256 or os.fstat(fd).st_mtime_ns != info.st_mtime_ns:
            raise SourceChanged(f"{path}: its content is no longer what was read")
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def _same(folder: int, name: str, info: os.stat_result) -> None:
    """``name`` in ``folder`` must still be the file of ``info``, unwritten (a link changes only its ctime)."""
    try:
        now = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        raise SourceGone(f"{name}: no longer exists") from None
    if (now.st_ino, now.st_dev, now.st_size, now.st_mtime_ns) != (
        info.st_ino, info.st_dev, info.st_size, info.st_mtime_ns
    ):  # fmt: skip
        raise SourceChanged(f"{name} was replaced or written since it was read")


def _unlink_same(folder: int, name: str, info: os.stat_result) -> None:
    _same(folder, name, info)
    os.unlink(name, dir_fd=folder)


def _move_source(source: int, name: str, target: int, new: str, fd: int, info: os.stat_result) -> None:
    """Give the file a name in ``target`` (a hard link, or across filesystems a copy of the bytes verified),
    then take its name in ``source`` away; a swap caught on the way undoes the new name."""
    _same(source, name, info)
    try:
        os.link(name, new, src_dir_fd=source, dst_dir_fd=target, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in _NO_LINK:
            raise
        _copy(fd, target, new)
    try:
        _unlink_same(source, name, info)
    except BaseException:
        os.unlink(new, dir_fd=target)
        raise


def _group(name: str, template: str) -> dict[str, str]:
    """The names that follow the source ``name``: its sidecars (no error sidecar: the document is ok) and
    outputs."""
    return {**sidecar_names(name, template), **output_names(name, template)}


def _free_name(target: int, name: str, template: str, sidecars: bool) -> str:
    """``name``, or ``stem.N.suffix`` with the first N for which no member of the group is taken in ``target``."""
    plain = Path(name)
    for number in count():
        candidate = name if number == 0 else f"{plain.stem}.{number}{plain.suffix}"
        names = [candidate, *(_group(candidate, template).values() if sidecars else ())]
        if not any(_exists(target, each) for each in names):
            return candidate
    raise AssertionError("unreachable")


def _move_group(source: int, old: dict[str, str], target: int, new: dict[str, str]) -> None:
    """The members present beside the source, in ``_MEMBERS`` order; a renamed group's links follow it."""
    relink = _relinker(old, new) if old != new else None
    for kind in _MEMBERS:
        try:
            info = os.stat(old[kind], dir_fd=source, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if kind == "assets":
            if stat.S_ISDIR(info.st_mode):
                _move_folder(source, old[kind], target, new[kind])
        elif stat.S_ISREG(info.st_mode):
            if relink is not None and kind in ("md", "json"):
                _rewrite(source, old[kind], target, new[kind], relink[kind])
            else:
                _move_file(source, old[kind], target, new[kind])


def _relinker(old: dict[str, str], new: dict[str, str]) -> dict[str, Callable[[bytes], bytes]]:
    """How the Markdown and the JSON of a renamed group are rewritten: figure links and output paths."""
    links = (f"]({quote(old['assets'])}/", f"]({quote(new['assets'])}/")

    def markdown(data: bytes) -> bytes:
        return data.decode("utf-8", "surrogateescape").replace(*links).encode("utf-8", "surrogateescape")

    def document(data: bytes) -> bytes:
        body = json.loads(data)
        section = body.get("searchable_pdf")
        if isinstance(section, dict) and section.get("path") == old["pdf"]:
            section["path"] = new["pdf"]
        for figure in body.get("figures") or ():
            figure["path"] = new["assets"] + figure["path"][len(old["assets"]):]
        for page in body.get("pages") or ():
            page["markdown"] = page["markdown"].replace(*links)
        return dump_json(body)

    return {"md": markdown, "json": document}


def _move_file(source: int, name: str, target: int, new: str) -> None:
    try:
        os.link(name, new, src_dir_fd=source, dst_dir_fd=target, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in _NO_LINK:
            raise
        fd = os.open(name, FILE_FLAGS, dir_fd=source)
        try:
            _copy(fd, target, new)
        finally:
            os.close(fd)
    os.unlink(name, dir_fd=source)


def _move_folder(source: int, name: str, target: int, new: str) -> None:
    """The regular files of the folder ``name`` into a new folder ``new``; ``name`` is removed once empty."""
    os.mkdir(new, 0o755, dir_fd=target)
    old_fd = os.open(name, FOLDER_FLAGS, dir_fd=source)
    try:
        new_fd = os.open(new, FOLDER_FLAGS, dir_fd=target)
        try:
            for entry in os.listdir(old_fd):
                if stat.S_ISREG(os.stat(entry, dir_fd=old_fd, follow_symlinks=False).st_mode):
                    _move_file(old_fd, entry, new_fd, entry)
            os.fsync(new_fd)
        finally:
            os.close(new_fd)
    finally:
        os.close(old_fd)
    with contextlib.suppress(OSError):
        os.rmdir(name, dir_fd=source)  # anything but a regular file (not ocrwatch's) keeps it


def _rewrite(source: int, name: str, target: int, new: str, change: Callable[[bytes], bytes]) -> None:
    fd = os.open(name, FILE_FLAGS, dir_fd=source)
    try:
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = change(handle.read())
    finally:
        os.close(fd)
    _write_new(target, new, data)
    os.unlink(name, dir_fd=source)


def _copy(fd: int, target: int, new: str) -> None:
    """The bytes of ``fd`` as the new file ``new`` in ``target``, fsynced, with the original's mode and times."""
    info = os.fstat(fd)
    chunks = _chunks(fd)
    _write_new(target, new, chunks, mode=stat.S_IMODE(info.st_mode), times=(info.st_atime_ns, info.st_mtime_ns))


def _chunks(fd: int) -> Iterator[bytes]:
    offset = 0
    while block := os.pread(fd, CHUNK, offset):
        offset += len(block)
        yield block


def _write_new(
    target: int, name: str, data: bytes | Iterator[bytes], *, mode: int = 0o644, times: tuple[int, int] | None = None
) -> None:
    out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=target)
    try:
        for block in [data] if isinstance(data, bytes) else data:
            view = memoryview(block)
            while view:
                view = view[os.write(out, view):]
        os.fchmod(out, mode)
        if times is not None:
            os.utime(out, ns=times)
        os.fsync(out)
    except BaseException:
        os.close(out)
        os.unlink(name, dir_fd=target)
        raise
    os.close(out)


def _exists(folder: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True
