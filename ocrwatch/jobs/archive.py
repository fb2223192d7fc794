"""What becomes of a source once its document is ``ok``: kept (the default), moved to the archive,
or deleted.

``[output] on_success``, overridden per ``[[inbox]]`` and per ``[[s3]]``:

- ``move``, a local file: the source, then those of its sidecars and further outputs beside it that
  the record of outputs holds as this document's (``sinks.ownership``; never a user's file at such a
  name, nor one under ``[output] dir``, which stays where the configuration puts it), go into
  ``[output] archive_dir``, in the folder that mirrors theirs under a folder per inbox
  (``sinks.local.inbox_folder``, as ``[output] dir`` mirrors them); their records follow them.
  Nothing there is replaced: when a name of the group is taken, the whole group gets a number
  (``report.1.pdf``, ``report.1.pdf.md``, ...), and the Markdown's figure links and the JSON's paths
  follow it, rewritten through ``Folder.stage`` with the source's access. A move across filesystems
  copies each file with its owner, mode and times; each folder the archive makes is as readable as
  the inbox folder it stands for, never more. An S3 object: copied to ``archive_prefix`` + its key
  (the very version read), then deleted; nothing there is replaced either: a taken key gets a
  number (``stem.N.suffix``), claimed by a conditional write (``s3archive.claim``).
- ``delete``: the local file is unlinked, its sidecars being durable already (each was fsynced, and
  its folder, when written); the S3 object's version that was read is deleted (the object, where
  unversioned).

Neither acts on a document that is not ``ok`` (a ``partial`` one stays for a person to look at), nor
on a source that changed since it was read, that has another name (a hard link), or that a process
holds open for writing: a local file is held as ``sources.sourcefile.held`` holds it (its size by
``fstat`` against the one its sidecar records, so a file extended since is never read; then a read
lease, and its sha256 compared under it), and its name goes only while it is still that file
(``Folder.remove_if``); every step goes through descriptors from the inbox and ``archive_dir``
(``safefs``), and a folder of the archive is moved into only while it is as the archive makes it
for the inbox folder it stands for (``untrusted_folder``: made for one that has changed hands, say).
An S3 object is compared by its ETag, or addressed by its version. Every action runs
once the ledger records the document done, so a source gone from its inbox is never taken for a new
one; a daemon killed in between finds the document done at its next start and acts then
(``Pipeline._done_already``). Everything here is blocking, and a failure is logged, never raised:
the document is done whatever becomes of its source.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any
from urllib.parse import quote

import structlog

from ocrwatch.config import OnSuccess, OutputConfig
from ocrwatch.errors import OutputNotWritable, SourceChanged, SourceGone, SourceInUse, classify
from ocrwatch.infra.metrics import Metrics
from ocrwatch.infra.s3client import call, error_code, is_not_found
from ocrwatch.jobs import s3archive
from ocrwatch.naming import FIGURE_FILE, output_names, sidecar_names
from ocrwatch.safefs import (
    Access,
    Folder,
    FolderGone,
    Replaced,
    hash_fd,
    parts_below,
    read_head,
    walk,
)
from ocrwatch.sinks.base import Sink, recorded_fingerprint
from ocrwatch.sinks.local import (
    Claims,
    LocalSink,
    Marker,
    dump_json,
    inbox_folder,
    output_markers,
)
from ocrwatch.sources.base import Bucketed, Job, LocalFile, Read, S3Object, Source
from ocrwatch.sources.local import LocalSource
from ocrwatch.sources.sourcefile import Content, folders_of, held
from ocrwatch.store.written import Output, Written

log = structlog.get_logger()

_MEMBERS = ("md", "pdf", "alto", "hocr", "assets", "json")
"""The order a group's members follow the source in: the JSON, the completion mark, last."""
MAX_SIDECAR_BYTES = 256 << 20
"""A renamed group's Markdown or JSON is read whole to be rewritten; a larger one moves as it is."""


class Archiver:
    """Applies each source's ``on_success`` to its finished jobs; ``sources`` and ``sinks`` are the
    pipeline's."""

    def __init__(
        self,
        output: OutputConfig,
        sources: Mapping[str, Source],
        sinks: Mapping[str, Sink],
        metrics: Metrics,
        written: Written | None = None,
    ) -> None:
        self.output = output
        self._sources = sources
        self._sinks = sinks
        self._metrics = metrics
        self.written = written
        """The record of outputs (the pipeline's, over its ledger): what a move takes along, and
        where its rows go. None: only an older ocrwatch's marks tell, on files of the
        daemon's user."""
        self._later: dict[str, threading.Timer] = {}

    def action(self, job: Job) -> OnSuccess:
        """The job's ``on_success``: its bucket's or its inbox's, else ``[output]``'s; ``keep`` for
        a job of no inbox or bucket (``ocrwatch ocr``: the files named are the user's)."""
        source = self._sources.get(job.source)
        if isinstance(job.origin, S3Object) and isinstance(source, Bucketed):
            return source.cfg.on_success or self.output.on_success
        if isinstance(job.origin, LocalFile) and isinstance(source, LocalSource):
            inbox = source.inboxes().get(job.origin.inbox)
            if inbox is not None:
                return inbox.on_success or self.output.on_success
        return "keep"

    def apply_on_success(
        self,
        job: Job,
        status: str | None,
        sha256: str | None,
        changed: Callable[[], bool] | None = None,
        read: Read | None = None,
    ) -> dict[str, str] | None:
        """Act on the finished job's source as configured. ``status`` None: read from its JSON
        sidecar; ``sha256``: of the bytes processed; ``changed``: the fetch's own check, asked
        first; ``read``: admission's hash of a local source, so one still as it was hashed is not
        read again. What moved, so its hooks are told where it is now: under ``source`` the
        source's URI now (``""`` once deleted), under ``json`` and ``md`` their paths where a move
        took them along (not where they stay: an S3 object's, sidecars under ``[output] dir``).
        None where nothing moved (kept, a failure)."""
        action = self.action(job)
        if action == "keep":
            return None
        fields = {"uri": job.origin.uri, "action": action}
        try:
            if status is None:
                status = self._sinks[job.source].status(job)
            if status != "ok":
                detail = f"the document is {status or 'without a result'}"
                log.info("source_kept", **fields, reason="not_ok", detail=detail)
                return None
            if changed is not None and changed():
                raise SourceChanged(f"{job.origin.uri} changed since it was read")
            if isinstance(job.origin, S3Object):
                where, sidecars = self._s3(job.origin, action, self._sources[job.source]), None
                now = where or ""
            else:
                assert isinstance(job.origin, LocalFile)
                moved, sidecars = self._local(job, job.origin, action, sha256, read)
                where, now = (None, "") if moved is None else (str(moved), moved.as_uri())
        except SourceInUse as exc:
            log.warning("source_kept", **fields, reason=exc.reason, detail=exc.message)
            self._metrics.archive_failures.labels(action=action, reason="in_use").inc()
            if exc.retry_in is not None and action == "delete":
                self._again(job, sha256, read, exc.retry_in)
            return None
        except (SourceChanged, SourceGone) as exc:
            reason = "changed" if isinstance(exc, SourceChanged) else "gone"
            log.warning("source_kept", **fields, reason=reason, detail=exc.message)
            self._metrics.archive_failures.labels(action=action, reason="changed").inc()
            return None
        except Exception as exc:
            error = classify(exc)
            again = (
                "the next start tries again"
                if isinstance(job.origin, LocalFile)
                else "it stays; act on it by hand"
            )
            log.error(
                "source_not_archived", **fields, kind=error.kind, error=error.message, hint=again
            )
            self._metrics.archive_failures.labels(action=action, reason="error").inc()
            return None
        log.info("source_archived" if action == "move" else "source_deleted", **fields, to=where)
        self._metrics.archived.labels(action=action).inc()
        return {"source": now, **(sidecars or {})}

    def _again(self, job: Job, sha256: str | None, read: Read | None, delay: float) -> None:
        """Delete a source again once it has been quiet long enough, where no lease tells that no
        writer holds it: a timer thread of its own, which a stopping daemon does not wait for (its
        next start acts then)."""
        if (previous := self._later.pop(job.key, None)) is not None:
            previous.cancel()
        timer = threading.Timer(delay + 1.0, self._retry, (job, sha256, read))
        timer.daemon = True
        self._later[job.key] = timer
        timer.start()

    def _retry(self, job: Job, sha256: str | None, read: Read | None) -> None:
        self._later.pop(job.key, None)
        self.apply_on_success(job, "ok", sha256, read=read)

    def _local(
        self, job: Job, origin: LocalFile, action: OnSuccess, sha256: str | None, read: Read | None
    ) -> tuple[Path | None, dict[str, str] | None]:
        """Where the source went (None: deleted), and where its ``json`` and ``md`` sidecars are,
        when beside it."""
        if sha256 is None:
            raise SourceChanged(f"{origin.path}: no digest of what was read to compare it with")
        source, sink = self._sources[job.source], self._sinks[job.source]
        content = _processed(sink, job, sha256, read)
        if action == "delete":
            delete_local(origin.path, origin.inbox, content)
            return None, None
        assert self.output.archive_dir is not None and isinstance(source, LocalSource)
        paths = sink.paths(job) if isinstance(sink, LocalSink) else None
        beside = paths is not None and paths["json"].parent == origin.path.parent
        roots = set(source.inboxes()) | {origin.inbox}
        # The folders above it resolved, not the archive itself: made a link since it was checked
        # at start, it is refused (``move_local``), never followed.
        configured = Path(os.path.abspath(self.output.archive_dir.expanduser()))
        archive = configured.parent.resolve() / configured.name
        place = Place(archive, inbox_folder(origin.inbox, roots), self.output.name_template)
        moved, names = move_local(job, content, place, self.written, sidecars=beside)
        if not beside or paths is None:
            return moved, None
        return moved, {kind: str(names.get(kind, paths[kind])) for kind in ("json", "md")}

    def _s3(self, obj: S3Object, action: OnSuccess, source: Source) -> str | None:
        assert isinstance(source, Bucketed)
        client, cfg = source.client, source.cfg
        version: dict[str, Any] = {"VersionId": obj.version_id} if obj.version_id else {}
        if not version:
            if not obj.etag:
                raise SourceChanged(
                    f"{obj.uri}: no ETag or version to tell that it is the object read"
                )
            try:
                head = call(client.head_object, Bucket=obj.bucket, Key=obj.key)
            except Exception as exc:
                if is_not_found(exc):
                    raise SourceGone(f"{obj.uri} no longer exists") from None
                raise
            if str(head.get("ETag", "")).strip('"') != obj.etag:
                raise SourceChanged(f"{obj.uri} was replaced since it was read")
        target = None
        if action == "move":
            target, claim = s3archive.claim(client, obj, cfg.archive_prefix)
            condition: dict[str, Any] = {"CopySourceIfMatch": f'"{obj.etag}"'} if obj.etag else {}
            try:
                call(
                    client.copy_object,
                    Bucket=obj.bucket,
                    Key=target,
                    CopySource={"Bucket": obj.bucket, "Key": obj.key, **version},
                    **condition,
                )
            except Exception as exc:
                s3archive.unclaim(client, obj.bucket, target, claim)
                if error_code(exc) in s3archive.PRECONDITION_FAILED:
                    raise SourceChanged(f"{obj.uri} was replaced since it was read") from None
                if is_not_found(exc):
                    raise SourceGone(f"{obj.uri} no longer exists") from None
                raise
            if "VersionId" in claim:  # the claim's empty version, below the copy, goes
                s3archive.unclaim(client, obj.bucket, target, claim)
        call(client.delete_object, Bucket=obj.bucket, Key=obj.key, **version)
        return None if target is None else f"s3://{obj.bucket}/{target}"


# --- local files: through folder descriptors, never following a link ------------------------------


def _processed(sink: Sink, job: Job, sha256: str, read: Read | None = None) -> Content:
    """The size and sha256 of the bytes the job processed, as its JSON sidecar records them
    (``Sink.recorded``): what the source must still be, its size compared before a byte is read.
    ``SourceChanged`` where the sidecar records other bytes, or none."""
    recorded = sink.recorded(job)
    fingerprint = recorded_fingerprint(recorded) if recorded is not None else None
    if fingerprint is None or fingerprint.sha256 != sha256:
        raise SourceChanged(f"{job.origin.uri}: its sidecar no longer records the bytes read")
    return Content(fingerprint.size, sha256, read)


def delete_local(path: Path, root: Path, content: Content) -> None:
    """Unlink ``path`` of the inbox ``root`` while it still holds ``content`` and nothing holds it
    (``held``); its folder is fsynced."""
    with folders_of(path, root) as inbox, held(inbox[-1], path, content) as source:
        try:
            inbox[-1].remove_if(path.name, source.info, source.check)
        except Replaced as exc:
            raise SourceChanged(str(exc)) from None


@dataclass(frozen=True)
class Place:
    """Where a move goes: ``archive`` (resolved), its folder mirroring the inbox, the template."""

    archive: Path
    mirror: str
    template: str


@dataclass(frozen=True)
class _Member:
    """A file of the group that the record holds as the document's: ``name`` relative to the
    source's folder (``x.assets/page-1-figure-1.png`` for a figure), the folder it lies in, its
    descriptor and row."""

    kind: str
    name: str
    here: Folder
    fd: int
    info: os.stat_result
    record: Output | None  # None: an older ocrwatch's output, known by its mark and owner

    @property
    def file(self) -> str:
        return self.name.rpartition("/")[2]


def move_local(
    job: Job, content: Content, place: Place, written: Written | None, *, sidecars: bool
) -> tuple[Path, dict[str, Path]]:
    """Move the job's source (while ``held`` as ``content``, what was processed) and, with
    ``sidecars``, the outputs beside it that the record holds as its own, into the mirrored folder
    under ``place.archive``. Where the source went, and where each member that went along is now
    (by kind: ``md``, ``json``, ...). The archive itself is made and checked at start
    (``roots.prepare``), never here: one gone since is ``OutputNotWritable``, and the source
    stays."""
    origin = job.origin
    assert isinstance(origin, LocalFile)
    relative = parts_below(origin.path.parent, origin.inbox)
    with contextlib.ExitStack() as stack:
        inbox = stack.enter_context(folders_of(origin.path, origin.inbox))
        here, accesses = inbox[-1], [Access.of(os.fstat(folder.fd)) for folder in inbox]
        try:
            archive = stack.enter_context(walk(place.archive, ()))[0]
        except FolderGone as exc:
            said = f"{exc.why}; it is made (and checked) when ocrwatch starts"
            raise OutputNotWritable(f"the archive {place.archive} {said}") from None
        # A hard link keeps a writer's later bytes in the archived file: no quiet time needed then.
        linked = os.fstat(here.fd).st_dev == os.fstat(archive.fd).st_dev
        source = stack.enter_context(held(here, origin.path, content, 0 if linked else None))
        mirrored = (place.mirror, *relative)
        target = stack.enter_context(walk(place.archive, mirrored, make=accesses))[-1]
        prefix = "".join(f"{part}/" for part in relative)
        claims = Claims(here, origin.inbox, prefix, job, source.info.st_uid, written)
        old = _group(origin.name, place.template)
        members = _members(claims, written, old, stack) if sidecars else []
        name = _free_name(target, origin.name, place.template, sidecars)
        try:
            here.move_to(origin.name, target, name, source.fd, source.info, source.check)
        except Replaced as exc:
            raise SourceChanged(str(exc)) from None
        prefix_there = "/".join((*mirrored, ""))
        group = _Carried(claims, written, target, place, prefix_there, Access.of(source.info))
        moved = group.carry(members, old, _group(name, place.template), stack)
        here.fsync()
    folder = place.archive.joinpath(place.mirror, *relative)
    return folder / name, {kind: folder / new for kind, new in moved.items()}


def _group(name: str, template: str) -> dict[str, str]:
    """The names that follow the source ``name``: its sidecars (no error sidecar: the document is
    ok) and outputs."""
    return {**sidecar_names(name, template), **output_names(name, template)}


def _free_name(target: Folder, name: str, template: str, sidecars: bool) -> str:
    """``name``, or ``stem.N.suffix`` with the first N for which no member of the group is taken in
    ``target``."""
    plain = Path(name)
    for number in count():
        candidate = name if number == 0 else f"{plain.stem}.{number}{plain.suffix}"
        names = [candidate, *(_group(candidate, template).values() if sidecars else ())]
        if not any(target.lstat(each) is not None for each in names):
            return candidate
    raise AssertionError("unreachable")


def _members(
    claims: Claims, written: Written | None, names: dict[str, str], stack: contextlib.ExitStack
) -> list[_Member]:
    """The group's files that the record (or, for what it predates, the mark and owner) holds as
    this document's, judged before anything moves, in ``_MEMBERS`` order; each held open until the
    move is done."""
    markers = output_markers(claims.here, names["json"])
    found: list[_Member] = []
    for kind in _MEMBERS:
        if kind != "assets":
            found += _judged(claims, written, claims.here, kind, names[kind], markers[kind], stack)
            continue
        assets = names["assets"]
        info = claims.here.lstat(assets)
        if info is None or not stat.S_ISDIR(info.st_mode):
            continue
        try:
            inner = stack.enter_context(claims.here.sub(assets))
        except FolderGone:
            continue
        recorded = claims.recorded_here()
        candidates = {name.partition("/")[2] for name in recorded if name.startswith(f"{assets}/")}
        candidates.update(name for name in inner.names() if FIGURE_FILE.fullmatch(name))
        for file in sorted(candidates):
            found += _judged(claims, written, inner, kind, f"{assets}/{file}", markers[kind], stack)
    return found


def _judged(
    claims: Claims,
    written: Written | None,
    here: Folder,
    kind: str,
    name: str,
    marker: Marker,
    stack: contextlib.ExitStack,
) -> list[_Member]:
    """``name`` as a member where ``claims`` holds it as the document's (none where it is a user's
    file or another document's: it stays). The descriptor is opened first, and must be the very file
    recorded."""
    fd = here.open_read(name.rpartition("/")[2])
    if fd is None:
        return []
    stack.callback(os.close, fd)
    info = os.fstat(fd)
    if not claims.verdict(name, marker).ours:
        return []
    records = written.get(claims.root, claims.name(name)) if written is not None else []
    same = (info.st_ino, info.st_size)
    record = next((row for row in records if (row.inode, row.size) == same), None)
    if (records and record is None) or (not records and info.st_uid != os.geteuid()):
        return []  # replaced between the two looks
    return [_Member(kind, name, here, fd, info, record)]


class _Carried:
    """The members' move into ``target``, each record following its file (``Written.move``, or a new
    row for a rewritten sidecar and for an output the record predated)."""

    def __init__(
        self,
        claims: Claims,
        written: Written | None,
        target: Folder,
        place: Place,
        prefix: str,
        access: Access,
    ) -> None:
        self.claims, self.written, self.target, self.place = claims, written, target, place
        self.prefix = prefix  # the target folder, relative to the archive
        self.access = access  # the source's
        self.owner = claims.owner if claims.owner is not None else os.geteuid()

    def carry(
        self,
        members: list[_Member],
        old: dict[str, str],
        new: dict[str, str],
        stack: contextlib.ExitStack,
    ) -> dict[str, str]:
        """Move ``members``; the names (relative to the target folder) of those moved, by kind."""
        relink = _relinker(old, new) if old != new else None
        moved: dict[str, str] = {}
        assets: Folder | None = None
        for member in members:
            there, name, key = self.target, new[member.kind], new[member.kind]
            if member.kind == "assets":
                if assets is None:
                    assets = stack.enter_context(self.target.sub(new["assets"], make=self.access))
                there, name, key = assets, member.file, f"{new['assets']}/{member.file}"
            try:
                small = member.info.st_size <= MAX_SIDECAR_BYTES
                if relink is not None and member.kind in relink and small:
                    self._rewrite(member, there, name, self.prefix + key, relink[member.kind])
                else:
                    self._move(member, there, name, self.prefix + key)
            except (Replaced, FileExistsError) as exc:
                path = str(member.here.path / member.file)
                log.warning("output_not_archived", path=path, error=str(exc))
                continue
            moved[member.kind] = name if member.kind != "assets" else new["assets"]
        if assets is not None:
            self.claims.here.rmdir(old["assets"])  # only once empty: a user's file in it keeps it
        return moved

    def _move(self, member: _Member, there: Folder, name: str, key: str) -> None:
        """``key``: the new name as recorded, relative to the archive."""
        made = member.here.move_to(member.file, there, name, member.fd, member.info, None)
        if self.written is None:
            return
        if member.record is not None:
            self.written.move(member.record, self.place.archive, key, made.st_ino)
        else:
            self._record(key, made.st_ino, made.st_size, hash_fd(member.fd))

    def _rewrite(
        self, member: _Member, there: Folder, name: str, key: str, change: Callable[[bytes], bytes]
    ) -> None:
        """A renamed group's Markdown or JSON, its links made to follow, written anew with the
        source's access; one that cannot be parsed moves as it is."""
        try:
            data = change(read_head(member.fd, member.info.st_size + 1))
        except (ValueError, TypeError, KeyError, AttributeError):
            self._move(member, there, name, key)
            return
        staged = there.stage(name, data, self.access)
        there.commit(staged, replace=False)
        try:
            member.here.remove_if(member.file, member.info)
        except BaseException:
            there.unlink(name)
            raise
        if self.written is not None:
            self.written.forget(self.claims.root, self.claims.name(member.name))
            self._record(key, staged.inode, staged.size, staged.sha256)

    def _record(self, key: str, inode: int, size: int, sha256: str) -> None:
        assert self.written is not None
        job = self.claims.job.key
        self.written.put(Output(self.place.archive, key, job, self.owner, inode, size, sha256))


def _relinker(old: dict[str, str], new: dict[str, str]) -> dict[str, Callable[[bytes], bytes]]:
    """How the Markdown and the JSON of a renamed group are rewritten: figure links and output
    paths."""
    links = (f"]({quote(old['assets'])}/", f"]({quote(new['assets'])}/")

    def markdown(data: bytes) -> bytes:
        return (
            data.decode("utf-8", "surrogateescape")
            .replace(*links)
            .encode("utf-8", "surrogateescape")
        )

    def document(data: bytes) -> bytes:
        body = json.loads(data)
        for member, kind in (("searchable_pdf", "pdf"), ("alto", "alto"), ("hocr", "hocr")):
            section = body.get(member)
            if isinstance(section, dict) and section.get("path") == old[kind]:
                section["path"] = new[kind]
        for figure in body.get("figures") or ():
            figure["path"] = new["assets"] + figure["path"][len(old["assets"]) :]
        for page in body.get("pages") or ():
            page["markdown"] = page["markdown"].replace(*links)
        return dump_json(body)

    return {"md": markdown, "json": document}
