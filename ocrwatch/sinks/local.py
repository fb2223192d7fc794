"""Sidecars beside a local source (or mirrored under ``[output] dir``, each inbox in a folder of its
own), written atomically through descriptors, with no more readers than the source.

The sidecars' folder is opened from its root (the inbox, or ``[output] dir``) one component at a
time without following a link (``safefs.folder``), and every file is staged, recorded, renamed and
removed through that one descriptor: a folder on the way swapped for a symlink meanwhile can
redirect nothing. Each file is written to a fixed hidden temporary name, fsynced and renamed over
the final name, then the folder is fsynced; the JSON goes last, so its presence means the Markdown
is complete. Every output gets the source's mode bits (less the umask) and, where the daemon runs as
root, its owner, set before the rename (``safefs.Access``). Each folder under ``[output] dir`` gets
the owner, group and mode of the inbox folder it stands for (the figures' folder its source's), and
one found there is written through only while it is just so (``untrusted_folder`` otherwise): a
user's private folder is never mirrored in one others may list.

What already lies at an output's name is ocrwatch's to replace or remove only by the record of what
it wrote (``ownership.judge``): anything else is a user's file, and the document fails as
``output_conflict``, naming it; so is the sidecar of another document beside the source that shares
its sidecar's name (``{stem}`` makes ``report.json`` of ``report.pdf`` and ``report.png``): the
first keeps it, the other is told why.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import structlog

from ocrwatch.config import InboxConfig
from ocrwatch.errors import NameTooLong, OutputConflict, OutputNotWritable, SourceGone
from ocrwatch.naming import FIGURE_FILE, LAYOUTS, output_names, sidecar_names
from ocrwatch.safefs import PUBLIC, Access, Folder, FolderGone, Staged, folder, walk
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
    OURS,
    Verdict,
    json_vouches,
    judge,
    layout_recorded,
    marked,
    owns_json,
    pdf_marked,
    pdf_recorded,
    theirs,
    vouched,
)
from ocrwatch.sources.base import Job, LocalFile, Origin
from ocrwatch.store.written import Output, Written

log = structlog.get_logger()

Marker = Callable[[Folder, str], bool]
"""Whether a file carries ocrwatch's own mark (an output written before the record of outputs
existed)."""
Markers = Callable[[str], Marker]
"""The mark rule of each further output, by its name."""

NAME_MAX = 255
"""File-name limit where the folder's own (``fpathconf``) cannot be learnt."""
PROBE_BYTES = 4096
"""Read of a file at a sidecar's name to tell whose it is: its first members, or its first line, are
enough."""


def inbox_folder(root: Path, roots: Collection[Path]) -> str:
    """The folder under ``[output] dir`` that mirrors the inbox ``root``: the inbox folder's name,
    and where several of ``roots`` (every configured inbox) share that name, ``-`` and 8 hex digits
    of the sha256 of its path after it. Derived from paths alone: the same across restarts and
    whatever the order of the inboxes."""
    name = root.name or "root"
    if sum((other.name or "root") == name for other in roots) < 2:
        return name
    return f"{name}-{hashlib.sha256(os.fsencode(root)).hexdigest()[:8]}"


class Claims:
    """The ownership rule applied in one open folder for one document: which names hold ocrwatch's
    own files for it, and the record kept of each file written there."""

    def __init__(
        self,
        here: Folder,
        root: Path,
        prefix: str,
        job: Job,
        owner: int | None,
        written: Written | None,
    ) -> None:
        self.here, self.root, self.prefix, self.job = here, root, prefix, job
        self.owner, self._written = owner, written

    def name(self, name: str) -> str:
        """``name`` as recorded: relative to the root, ``/``-separated."""
        return self.prefix + name

    def verdict(self, name: str, marked: Marker, *, verify: bool = True) -> Verdict:
        """Whether ``name`` in this folder (or ``folder/file`` one level down) is free or ocrwatch's
        own for this document; ``marked`` tells ocrwatch's own mark, which counts for outputs the
        record predates."""
        records = self._written.get(self.root, self.name(name)) if self._written is not None else []
        try:
            with self._inner(name) as (here, file):
                if here is None:
                    return OURS
                mark = not records and marked(here, file)
                return judge(records, here, file, self.owner, mark, verify=verify)
        except FolderGone:
            return theirs("not a folder")

    @contextlib.contextmanager
    def _inner(self, name: str) -> Iterator[tuple[Folder | None, str]]:
        """The folder ``name`` lies in (this one, or one level down; None where that folder is
        missing)."""
        folder_name, _, file = name.rpartition("/")
        if not folder_name:
            yield self.here, file
        elif self.here.lstat(folder_name) is None:
            yield None, file
        else:
            with self.here.sub(folder_name) as inner:
                yield inner, file

    def refuse(self, name: str, marked: Marker) -> None:
        """Raise ``output_conflict`` where ``name`` holds what ocrwatch may not replace for this
        document."""
        verdict = self.verdict(name, marked)
        if not verdict.ours:
            raise conflict(self.here.path / name, verdict.why)

    def publish(self, here: Folder, name: str, data: bytes | Path, access: Access) -> None:
        """Stage, record, rename: whatever a crash leaves at ``name`` is recorded as ocrwatch's."""
        staged = here.stage(name.rpartition("/")[2], data, access)
        output = self._output(name, staged)
        if self._written is not None:
            self._written.put(output)
        here.commit(staged)
        if self._written is not None:
            self._written.drop_others(output)

    def _output(self, name: str, staged: Staged) -> Output:
        owner = self.owner if self.owner is not None else os.geteuid()
        return Output(
            self.root,
            self.name(name),
            self.job.key,
            owner,
            staged.inode,
            staged.size,
            staged.sha256,
        )

    def remove(self, name: str, marked: Marker) -> bool:
        """Remove ``name`` where it holds ocrwatch's own file for this document; a failure is
        logged."""
        try:
            gone = self.here.lstat(name.partition("/")[0]) is None
            if gone or not self.verdict(name, marked).ours:
                return False
            with self._inner(name) as (inner, file):
                assert inner is not None
                removed = inner.unlink(file)
                inner.fsync()
            if self._written is not None:
                self._written.forget(self.root, self.name(name))
            return removed
        except OSError as exc:
            log.warning("stale_output_not_removed", path=str(self.here.path / name), error=str(exc))
            return False

    def read_vouched(self, name: str) -> bytes | None:
        """The whole file at ``name`` in this folder where the record vouches for the very bytes
        read through one descriptor as ocrwatch's for this document's user; None otherwise, or when
        it is too large."""
        if self._written is None:
            return None
        found = self.here.look(name, RECALL_BYTES)
        if found is None or found.other is not None or found.info is None:
            return None
        if len(found.head) != found.info.st_size or found.info.st_size >= RECALL_BYTES:
            return None
        records = self._written.get(self.root, self.name(name))
        digest = hashlib.sha256(found.head).hexdigest()
        return found.head if vouched(records, found.info, digest, self.owner) else None

    def recorded_here(self) -> list[str]:
        """The names in this folder that the record holds for this document (relative to the
        folder)."""
        if self._written is None:
            return []
        return [
            o.name[len(self.prefix) :]
            for o in self._written.of_job(self.job.key)
            if o.root == self.root and o.name.startswith(self.prefix)
        ]


def marker(kind: str) -> Marker:
    """The mark rule (``ownership.marked``) for an output of ``kind``, asked of a regular file
    only."""

    def marked_here(here: Folder, name: str) -> bool:
        found = here.look(name, PROBE_BYTES)
        return found is not None and found.other is None and marked(kind, found.head)

    return marked_here


json_marked, markdown_marked, figure_marked = marker("json"), marker("md"), marker("assets")


@contextlib.contextmanager
def _opened(here: Folder, name: str) -> Iterator[BinaryIO | None]:
    """The regular file ``name`` in ``here``, open for reading (None: there is none)."""
    fd = here.open_read(name)
    if fd is None:
        yield None
        return
    with os.fdopen(fd, "rb") as handle:
        yield handle


def _pdf_marker(recorded: bool) -> Marker:
    """The mark of a searchable PDF (``ownership.pdf_marked``): ``recorded``, the JSON sidecar
    beside it, as it is now, records one; it counts only where the record holds no row for the
    PDF."""

    def marked(inner: Folder, name: str) -> bool:
        return pdf_marked(recorded, lambda: _opened(inner, name))

    return marked


def output_markers(here: Folder, json_name: str) -> dict[str, Marker]:
    """The mark of each kind of output (``md``, ``json``, ``pdf``, ``alto``, ``hocr``, ``assets``:
    a figure) in ``here``, which counts only for outputs the record predates: the archive takes
    along what this rule holds as ocrwatch's. An ALTO or hOCR file's: the JSON records it, where
    that JSON may say so (``ownership.json_vouches``)."""
    found = here.look(json_name, HEAD_BYTES)
    info = found.info if found is not None and found.other is None else None
    head = found.head if found is not None and info is not None and json_vouches(info) else None
    layouts = {kind: _said(layout_recorded(head, kind)) for kind in LAYOUTS}
    pdf = _pdf_marker(pdf_recorded(head))
    return {
        "md": markdown_marked,
        "json": json_marked,
        "pdf": pdf,
        **layouts,
        "assets": figure_marked,
    }


def _said(recorded: bool) -> Marker:
    return lambda inner, name: recorded


def _extra_markers(here: Folder, json_name: str, outputs: dict[str, Path]) -> Markers:
    """The mark rule of each further output, by its name (``output_markers``)."""
    markers = output_markers(here, json_name)
    named = {outputs[kind].name: markers[kind] for kind in ("pdf", *LAYOUTS)}
    return lambda name: markers["assets"] if "/" in name else named[name]


def conflict(path: Path, what: str) -> OutputConflict:
    return OutputConflict(
        f"{path} is {what}; ocrwatch writes an output there and replaces only its own",
        hint=f"move {path} away (or set [output] dir or a different [output] name_template), then "
        "`ocrwatch retry`",
    )


class LocalSink:
    """Writes ``NAME.md`` / ``NAME.json`` / ``NAME.error.json`` beside the source file, or under
    ``out_dir``.

    ``inboxes``: the configured inboxes (``update_inboxes`` after a reload); with them, each inbox
    is mirrored under ``out_dir`` in a folder of its own (``inbox_folder``), so two inboxes never
    share a sidecar; without (``ocrwatch ocr --out``), every file's sidecars go straight into
    ``out_dir``. ``written`` is the record of outputs (None for ``ocrwatch ocr``
    without a daemon: only marks then, on the user's files)."""

    def __init__(
        self,
        name_template: str = "{name}",
        out_dir: Path | None = None,
        inboxes: Sequence[InboxConfig] | None = None,
        written: Written | None = None,
    ) -> None:
        self._template = name_template
        self._out_dir = out_dir
        self._written = written
        self._roots: frozenset[Path] | None = None
        if inboxes is not None:
            self.update_inboxes(inboxes)

    def update_inboxes(self, inboxes: Sequence[InboxConfig]) -> None:
        """The inboxes as configured now; their folders are resolved once here, not per
        document."""
        self._roots = frozenset(config.path.expanduser().resolve() for config in inboxes)

    def paths(self, job: Job) -> dict[str, Path]:
        root, parts = self._where(job)
        names = sidecar_names(job.origin.name, self._template)
        # the config validates the template; this holds whatever it let through
        for name in names.values():
            if "/" in name or "\0" in name or name in (".", ".."):
                raise OutputNotWritable(
                    f"the sidecar name {name!r} for {job.origin.uri} would leave its folder"
                )
        return {kind: root.joinpath(*parts, name) for kind, name in names.items()}

    def outputs(self, job: Job) -> dict[str, Path]:
        """Where the job's further outputs go, beside its JSON sidecar: ``pdf``, the searchable PDF,
        and ``assets``, the figures' folder."""
        folder_path = self.paths(job)["json"].parent
        return {
            kind: folder_path / name
            for kind, name in output_names(job.origin.name, self._template).items()
        }

    def _where(self, job: Job) -> tuple[Path, tuple[str, ...]]:
        """The root the sidecars' folder is reached from, and the folders below it."""
        origin = job.origin
        if not isinstance(origin, LocalFile):
            raise TypeError(f"LocalSink cannot write sidecars for {origin.uri}")
        relative = _below_inbox(origin)
        if self._out_dir is None:
            return origin.inbox, relative
        if self._roots is None:
            return self._out_dir, relative
        return self._out_dir, (inbox_folder(origin.inbox, self._roots | {origin.inbox}), *relative)

    @contextlib.contextmanager
    def _claims(self, job: Job, owner: int | None, make: bool = False) -> Iterator[Claims]:
        root, parts = self._where(job)
        made = self._stands_for(job, parts) if make and self._out_dir is not None else None
        try:
            with walk(root, parts, make=made) as chain:
                prefix = "".join(f"{part}/" for part in parts)
                yield Claims(chain[-1], root, prefix, job, owner, self._written)
        except FolderGone as exc:
            if made is not None and exc.path == root:
                # Made and checked at start (``roots.prepare``), never here: a path made now could
                # lead through a link, or stand on an unmounted filesystem's mount point.
                said = f"{exc.why}; it is made (and checked) when ocrwatch starts"
                fix = (
                    f"create {root} again (owned by the user ocrwatch runs as, writable by no"
                    " one else) or restart ocrwatch, which makes it; ocrwatch retries until it can"
                    " write"
                )
                raise OutputNotWritable(
                    f"{job.origin.uri}: the output folder {root} {said}", hint=fix
                ) from None
            raise SourceGone(f"{job.origin.uri}: its folder {exc.path} {exc.why}") from None

    def _stands_for(self, job: Job, parts: Sequence[str]) -> list[Access]:
        """The access, as it is now, of each inbox folder that ``parts`` (the sidecars' folders
        under ``[output] dir``) stand for: the last of those from the inbox down to the source's,
        reached without following a link. Each is made with it, and one found must be as made so
        (``safefs.walk``): never the daemon's own for a user's private folder."""
        origin = job.origin
        assert isinstance(origin, LocalFile)
        try:
            with walk(origin.inbox, _below_inbox(origin)) as chain:
                accesses = [Access.of(os.fstat(each.fd)) for each in chain]
        except FolderGone as exc:
            raise SourceGone(f"{origin.uri}: its folder {exc.path} {exc.why}") from None
        return accesses[len(accesses) - len(parts) :]

    def source_access(self, job: Job) -> Access | None:
        """The source's access as it is now (the error sidecar of a document never read, or read by
        an older call), through its inbox without following a link; None where it is gone."""
        origin = job.origin
        assert isinstance(origin, LocalFile)
        try:
            relative = origin.path.parent.relative_to(origin.inbox).parts
            with folder(origin.inbox, relative) as here:
                info = here.lstat(origin.name)
        except (OSError, ValueError):
            return None
        return Access.of(info) if info is not None else None

    def recorded(self, job: Job) -> dict[str, Any] | None:
        """The ``source`` section of the job's JSON sidecar where it is ocrwatch's own for this
        document (by the record: a JSON anyone could have written proves nothing); None too when the
        Markdown sidecar is gone or no regular file: the document is then done again (a user's edits
        to it stand)."""
        access = self.source_access(job)
        try:
            with self._claims(job, access.uid if access else None) as claims:
                names = {kind: path.name for kind, path in self.paths(job).items()}
                if not claims.verdict(names["json"], json_marked, verify=False).ours:
                    return None
                found, markdown = (
                    claims.here.look(names["json"], HEAD_BYTES),
                    claims.here.lstat(names["md"]),
                )
        except (OSError, SourceGone):
            return None
        if found is None or found.other is not None or not owns_json(found.head):
            return None
        if markdown is None or not stat.S_ISREG(markdown.st_mode):
            return None
        source = json_member(found.head, "source")
        return source if isinstance(source, dict) else None

    def recall(self, job: Job, owner: int | None) -> Recalled | None:
        try:
            with self._claims(job, owner) as claims:
                names = {kind: path.name for kind, path in self.paths(job).items()}
                return Recalled.parse(
                    claims.read_vouched(names["md"]), claims.read_vouched(names["json"])
                )
        except (OSError, SourceGone):
            return None

    def status(self, job: Job) -> str | None:
        try:
            with self._claims(job, None) as claims:
                found = claims.here.look(self.paths(job)["json"].name, PROBE_BYTES)
        except (OSError, SourceGone):
            return None
        if found is None or found.other is not None or not owns_json(found.head):
            return None
        if _whose(found.head, job.origin) is not None:
            return None
        status = json_member(found.head, "status")
        return status if isinstance(status, str) else None

    def write(
        self,
        job: Job,
        markdown: str,
        document: dict[str, Any],
        extras: Mapping[str, Extra] = NO_EXTRAS,
        access: Access | None = None,
    ) -> None:
        paths, outputs = self.paths(job), self.outputs(job)
        names = {kind: path.name for kind, path in paths.items()}
        extra_names(extras, {kind: path.name for kind, path in outputs.items()})
        access = access or self.source_access(job) or PUBLIC
        with self._claims(job, access.uid, make=True) as claims, contextlib.ExitStack() as stack:
            self._prepare(claims, names, "md", "json")
            ours = _extra_markers(claims.here, names["json"], outputs)
            for name in extras:
                claims.refuse(name, ours(name))
            # The figures' folder holds this document's alone: as readable as the source, never
            # more. Made, or found as made so, before anything is written.
            inner = {
                part: stack.enter_context(claims.here.sub(part, make=access))
                for part in {name.partition("/")[0] for name in extras if "/" in name}
            }
            claims.publish(claims.here, names["md"], markdown_bytes(markdown), access)
            for name, content in extras.items():
                here = inner[name.partition("/")[0]] if "/" in name else claims.here
                claims.publish(here, name, content, access)
            claims.publish(claims.here, names["json"], dump_json(document), access)
            # a stale error sidecar left behind is only untidy
            claims.remove(names["error"], json_marked)
            self._remove_stale(claims, outputs, set(extras), ours)

    def write_error(self, job: Job, error: dict[str, Any]) -> None:
        names = {kind: path.name for kind, path in self.paths(job).items()}
        access = self.source_access(job) or PUBLIC
        with self._claims(job, access.uid, make=True) as claims:
            self._prepare(claims, names, "error")
            # asked before the JSON that may record it goes
            ours = _extra_markers(claims.here, names["json"], self.outputs(job))
            claims.publish(claims.here, names["error"], dump_json(error), access)
            if _other_document(claims.here, names["json"], job.origin) is None:
                for kind, marked in (("json", json_marked), ("md", markdown_marked)):
                    claims.remove(names[kind], marked)  # a previous version's result must not stand
            self._remove_stale(claims, self.outputs(job), (), ours)

    def _prepare(self, claims: Claims, names: dict[str, str], *kinds: str) -> None:
        """Check before writing anything, so a document never gets half of its outputs for a known
        reason: every sidecar's name fits the folder (all three: a result whose error sidecar cannot
        exist is refused too), the folder is writable, and nothing but ocrwatch's own files holds
        the names about to be written."""
        here = claims.here
        try:
            limit = int(os.fpathconf(here.fd, "PC_NAME_MAX"))
        except (OSError, ValueError):
            limit = NAME_MAX
        for name in names.values():
            if (size := len(os.fsencode(name))) > limit:
                raise NameTooLong(
                    f"the sidecar {name[:40]}... would be {size} bytes long; {here.path}'s "
                    f"filesystem allows {limit}",
                    hint=f"rename the file {size - limit} or more bytes shorter, "
                    "or set a shorter [output] name_template",
                )
        if not _writable(here):
            raise OutputNotWritable(
                f"cannot write sidecars in {here.path}: {_why_not_writable(here)}"
            )
        markers = {"md": markdown_marked, "json": json_marked, "error": json_marked}
        for kind in kinds:
            claims.refuse(names[kind], markers[kind])
            if kind == "json" and (
                other := _other_document(here, names["json"], claims.job.origin)
            ):
                raise conflict(here.path / names["json"], other)

    def _remove_stale(
        self, claims: Claims, outputs: dict[str, Path], kept: Collection[str], ours: Markers
    ) -> None:
        """Remove the further outputs a previous version left and this one did not write: those the
        record holds for this document, and those of an older ocrwatch by their marks; then the
        figures' folder once empty. A failure is logged, never raised: what was just written
        stands."""
        assets, files = outputs["assets"].name, {outputs[k].name for k in ("pdf", *LAYOUTS)}
        doomed = {
            name for name in claims.recorded_here() if name.partition("/")[0] in {*files, assets}
        }
        doomed |= files
        with contextlib.suppress(OSError):
            if claims.here.lstat(assets) is not None:
                with claims.here.sub(assets) as inner:
                    doomed.update(
                        f"{assets}/{name}" for name in inner.names() if FIGURE_FILE.fullmatch(name)
                    )
        for name in sorted(doomed - set(kept)):
            claims.remove(name, ours(name))
        if claims.here.rmdir(assets):  # only once empty: a user's file in it keeps it
            claims.here.fsync()


def _below_inbox(origin: LocalFile) -> tuple[str, ...]:
    """The folders from the source's inbox down to its own (none for a source outside it)."""
    try:
        return origin.path.parent.relative_to(origin.inbox).parts
    except ValueError:
        return ()


def _writable(here: Folder) -> bool:
    """Whether the daemon may create files in ``here`` (root may anywhere but on a read-only
    filesystem)."""
    try:
        read_only = bool(os.fstatvfs(here.fd).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    if read_only:
        return False
    return os.access(f"/proc/self/fd/{here.fd}", os.W_OK | os.X_OK)


def _why_not_writable(here: Folder) -> str:
    with contextlib.suppress(OSError):
        if os.fstatvfs(here.fd).f_flag & os.ST_RDONLY:
            return "the filesystem is read-only"
    return os.strerror(errno.EACCES).lower()


def _other_document(here: Folder, json_name: str, origin: Origin) -> str | None:
    """Whose JSON sidecar lies at ``json_name`` where it is another document's that still lies
    beside ``origin`` (two names one template maps to one sidecar); None otherwise."""
    found = here.look(json_name, PROBE_BYTES)
    if found is None or found.other is not None or not owns_json(found.head):
        return None
    return _whose(found.head, origin)


def _whose(head: bytes, origin: Origin) -> str | None:
    """None when a JSON sidecar beginning with ``head`` is for ``origin``, or for a document that is
    gone; else that of another document still beside ``origin`` (whose sidecar takes the same
    name)."""
    source = json_member(head, "source")
    other = source.get("name") if isinstance(source, dict) else None
    if not isinstance(origin, LocalFile) or not isinstance(other, str) or other == origin.name:
        return None
    if "/" in other or "\0" in other or other in ("", ".", ".."):
        return None
    try:
        relative = origin.path.parent.relative_to(origin.inbox).parts
        with folder(origin.inbox, relative) as beside:
            present = beside.lstat(other) is not None
    except (OSError, ValueError):
        present = False
    return f"the sidecar of {other}, which lies beside {origin.name}" if present else None
