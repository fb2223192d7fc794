"""Sidecars beside a local source (or mirrored under ``[output] dir``, each inbox in a folder of its own),
written atomically.

Each file is written to a hidden temporary name in the destination folder, flushed, fsynced and renamed over
the final name, then the folder is fsynced: a reader sees the old file or the new one, never half of one,
even across ``kill -9`` or a full disk. The JSON goes last, so its presence means the Markdown is complete.
The temporary name is fixed per sidecar (created exclusively, never through a symlink), so a temporary left
by ``kill -9`` is replaced by the next write of that sidecar instead of piling up.

Whatever already lies at a sidecar's name is looked at with ``look``: ``lstat`` first, then a non-blocking open
that never follows a link, checked again with ``fstat``, and a bounded read. A FIFO, a device, a folder or a
link there is never opened for reading; with a user's file, they are ``output_conflict`` (``sinks.base``), and
so is the sidecar of another document beside the source that shares its sidecar's name (``{stem}`` makes
``report.json`` of ``report.pdf`` and ``report.png``): the first keeps it, the other is told why.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import stat
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from ocrwatch.config import InboxConfig
from ocrwatch.errors import NameTooLong, OutputConflict, OutputNotWritable
from ocrwatch.naming import output_names, sidecar_names
from ocrwatch.sinks import extras as further
from ocrwatch.sinks.base import NO_EXTRAS, HEAD_BYTES, Extra, extra_names, json_member, owns_json, owns_markdown
from ocrwatch.sources.base import Access, Job, LocalFile, Origin

log = structlog.get_logger()

TMP_MARKER = ".ocrwatch-tmp-"
NAME_MAX = 255
"""File-name limit where the folder's own (``pathconf``) cannot be learnt."""
PROBE_BYTES = 4096
"""Read of a file at a sidecar's name to tell whose it is: its first members, or its first line, are enough."""
FOREIGN = "a file ocrwatch did not write"


def temporary_path(path: Path) -> Path:
    """The hidden name ``path`` is written under before the rename: fixed per target, at most 108 bytes."""
    name = os.fsencode(path.name)
    tag = hashlib.sha1(name).hexdigest()[:12]
    return path.with_name(os.fsdecode(b"." + name[:80]) + TMP_MARKER + tag)


def atomic_write(path: Path, data: bytes | Path) -> None:
    """Write ``data`` (bytes, or a file's content) to ``path`` so that ``path`` is always either absent, the old
    content or all of ``data``."""
    tmp = temporary_path(path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # a leftover of a killed write (unlinking a symlink never touches its target)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            if isinstance(data, Path):
                with open(data, "rb") as content:
                    shutil.copyfileobj(content, handle, 1 << 20)
            else:
                handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), 0o644)  # by descriptor: a name swapped for a symlink cannot redirect it
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def dump_json(document: dict[str, Any]) -> bytes:
    """UTF-8 JSON; strings that are not valid Unicode (a file name in another encoding, a model's lone
    surrogate) are kept as ``\\udcXX`` escapes, which round-trip, rather than failing the document."""
    text = json.dumps(document, ensure_ascii=False, indent=2) + "\n"
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return (json.dumps(document, ensure_ascii=True, indent=2) + "\n").encode("ascii")


def _encode_markdown(markdown: str) -> bytes:
    return markdown.encode("utf-8", "replace")  # a lone surrogate from a model becomes "?", not a failure


@dataclass(frozen=True)
class Occupant:
    """What lies at a sidecar's name: a regular file and its first bytes, or what it is instead."""

    path: Path
    other: str | None = None  # "a folder", "a FIFO", ... for anything but a regular file
    head: bytes = b""


def look(path: Path, limit: int) -> Occupant | None:
    """What lies at ``path`` (None: nothing, or a name too long to exist), reading at most ``limit`` bytes.

    Never follows a link, never blocks (a FIFO opened without a writer), never reads a device: the type is
    checked with ``lstat``, and again with ``fstat`` on a descriptor opened with ``O_NOFOLLOW|O_NONBLOCK``, so
    a swap between the two is caught too."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ENAMETOOLONG):
            return None
        raise
    if not stat.S_ISREG(info.st_mode):
        return Occupant(path, _describe(info.st_mode))
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except PermissionError:
        return Occupant(path, "a file ocrwatch cannot read")
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return Occupant(path, "a symbolic link")
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return Occupant(path, _describe(info.st_mode))
        chunks: list[bytes] = []
        left = limit
        while left > 0 and (chunk := os.read(fd, left)):
            chunks.append(chunk)
            left -= len(chunk)
        return Occupant(path, None, b"".join(chunks))
    finally:
        os.close(fd)


def _describe(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")):  # fmt: skip
        if test(mode):
            return name
    return "not a regular file"


def _name_max(folder: Path) -> int:
    """The file-name limit of the filesystem ``folder`` is (or will be created) on."""
    for candidate in (folder, *folder.parents):
        try:
            return int(os.pathconf(candidate, "PC_NAME_MAX"))
        except (OSError, ValueError):
            continue
    return NAME_MAX


def inbox_folder(root: Path, roots: Collection[Path]) -> str:
    """The folder under ``[output] dir`` that mirrors the inbox ``root``: the inbox folder's name, and where
    several of ``roots`` (every configured inbox) share that name, ``-`` and 8 hex digits of the sha256 of its
    path after it. Derived from paths alone: the same across restarts and whatever the order of the inboxes."""
    name = root.name or "root"
    if sum((other.name or "root") == name for other in roots) < 2:
        return name
    return f"{name}-{hashlib.sha256(os.fsencode(root)).hexdigest()[:8]}"


class LocalSink:
    """Writes ``NAME.md`` / ``NAME.json`` / ``NAME.error.json`` beside the source file, or under ``out_dir``.

    ``inboxes`` returns the configured inboxes as they are now (a reload changes them): with it, each inbox is
    mirrored under ``out_dir`` in a folder of its own (``inbox_folder``), so two inboxes never share a sidecar;
    without it (``ocrwatch ocr --out``), every file's sidecars go straight into ``out_dir``."""

    def __init__(
        self, name_template: str = "{name}", out_dir: Path | None = None,
        inboxes: Callable[[], Sequence[InboxConfig]] | None = None,
    ) -> None:  # fmt: skip
        self._template = name_template
        self._out_dir = out_dir
        self._inboxes = inboxes
        self._roots: tuple[Sequence[InboxConfig] | None, frozenset[Path]] = (None, frozenset())

    def paths(self, job: Job) -> dict[str, Path]:
        origin = job.origin
        if not isinstance(origin, LocalFile):
            raise TypeError(f"LocalSink cannot write sidecars for {origin.uri}")
        folder = origin.path.parent
        if self._out_dir is not None:
            try:
                relative = origin.path.parent.relative_to(origin.inbox)
            except ValueError:
                relative = Path()
            folder = self._mirror(origin.inbox) / relative
        names = sidecar_names(origin.path.name, self._template)
        for name in names.values():  # the config validates the template; this holds whatever it let through
            if "/" in name or "\0" in name or name in (".", ".."):
                raise OutputNotWritable(f"the sidecar name {name!r} for {origin.path} would leave its folder")
        return {kind: folder / name for kind, name in names.items()}

    def _mirror(self, inbox: Path) -> Path:
        """Where the documents of ``inbox`` (a resolved inbox folder) are mirrored under ``out_dir``."""
        assert self._out_dir is not None
        if self._inboxes is None:
            return self._out_dir
        configs = self._inboxes()
        if self._roots[0] is not configs:  # resolved once per configuration, not per document
            self._roots = (configs, frozenset(config.path.expanduser().resolve() for config in configs))
        return self._out_dir / inbox_folder(inbox, self._roots[1] | {inbox})

    def recorded(self, job: Job) -> dict[str, Any] | None:
        """None too when the Markdown sidecar is gone or no regular file: the document is then done again (a
        user's edits to it stand: its content is not judged)."""
        paths = self.paths(job)
        try:
            found, markdown = look(paths["json"], HEAD_BYTES), look(paths["md"], 0)
        except OSError:
            return None
        if found is None or found.other is not None or not owns_json(found.head):
            return None
        if markdown is None or markdown.other is not None:
            return None
        source = json_member(found.head, "source")
        return source if isinstance(source, dict) else None

    def write(
        self, job: Job, markdown: str, document: dict[str, Any], extras: Mapping[str, Extra] = NO_EXTRAS,
        access: Access | None = None,
    ) -> None:
        paths, outputs = self.paths(job), self.outputs(job)
        extra_names(extras, {kind: path.name for kind, path in outputs.items()})
        self._prepare(job, paths, "md", "json")
        pdf_ours = _pdf_ours(paths["json"], outputs["pdf"], job.origin)
        further.check(outputs, extras, pdf_ours, look, _conflict)
        atomic_write(paths["md"], _encode_markdown(markdown))
        for name, content in extras.items():
            target = paths["json"].parent / name
            if target.parent == outputs["assets"]:
                further.make_assets(target.parent, _fsync_dir)
            atomic_write(target, content)
        atomic_write(paths["json"], dump_json(document))
        self._remove_own(job, paths, "error")  # the result stands: a stale error sidecar left behind is only untidy
        further.remove_stale(outputs, set(extras), pdf=pdf_ours, look=look, fsync_dir=_fsync_dir)

    def write_error(self, job: Job, error: dict[str, Any]) -> None:
        paths = self.paths(job)
        self._prepare(job, paths, "error")
        pdf_ours = _pdf_ours(paths["json"], self.outputs(job)["pdf"], job.origin)
        atomic_write(paths["error"], dump_json(error))
        self._remove_own(job, paths, "json", "md")  # a previous version's result must not stand for this one
        further.remove_stale(self.outputs(job), (), pdf=pdf_ours, look=look, fsync_dir=_fsync_dir)

    def outputs(self, job: Job) -> dict[str, Path]:
        """Where the job's further outputs go, beside its JSON sidecar: ``pdf``, the searchable PDF, and
        ``assets``, the figures' folder."""
        folder = self.paths(job)["json"].parent
        return {kind: folder / name for kind, name in output_names(job.origin.name, self._template).items()}

    def status(self, job: Job) -> str | None:
        try:
            found = look(self.paths(job)["json"], PROBE_BYTES)
        except OSError:
            return None
        if found is None or found.other is not None or _whose(found.head, job.origin) is not None:
            return None
        status = json_member(found.head, "status")
        return status if isinstance(status, str) else None

    def _prepare(self, job: Job, paths: dict[str, Path], *kinds: str) -> None:
        """Check before writing anything, so a document never gets half of its sidecars for a known reason:
        every sidecar's name fits the folder (all three: a result whose error sidecar cannot exist is refused
        too), the folder is writable, and nothing but ocrwatch's own files holds the names about to be written."""
        folder = paths["json"].parent
        limit = _name_max(folder)
        for path in paths.values():
            if len(os.fsencode(path.name)) > limit:
                raise NameTooLong(
                    f"the sidecar {path.name[:40]}... would be {len(os.fsencode(path.name))} bytes long; "
                    f"{folder}'s filesystem allows {limit}",
                    hint=f"rename the file {len(os.fsencode(path.name)) - limit} or more bytes shorter, "
                    "or set a shorter [output] name_template",
                )
        if self._out_dir is not None:
            folder.mkdir(parents=True, exist_ok=True)
        if not os.access(folder, os.W_OK | os.X_OK):
            read_only = False
            with contextlib.suppress(OSError):
                read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
            reason = "the filesystem is read-only" if read_only else os.strerror(errno.EACCES).lower()
            raise OutputNotWritable(f"cannot write sidecars in {folder}: {reason}")
        owned = _owned(paths, job.origin)
        for kind in kinds:
            if (what := owned[kind]) is not None:
                raise _conflict(paths[kind], what)

    def _remove_own(self, job: Job, paths: dict[str, Path], *kinds: str) -> None:
        """Remove the named sidecars where ocrwatch wrote them for this document (in order), never a user's
        file or another document's; a failure is logged, never raised: what was just written stands."""
        try:
            owned = _owned(paths, job.origin)
        except OSError as exc:
            log.warning("stale_sidecar_not_removed", path=str(paths[kinds[0]]), error=str(exc))
            return
        removed = False
        for kind in kinds:
            if owned[kind] is not None:
                continue
            try:
                os.unlink(paths[kind])
                removed = True
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ENAMETOOLONG):  # a name too long to exist holds nothing
                    continue
                log.warning("stale_sidecar_not_removed", path=str(paths[kind]), error=str(exc))
        if removed:
            with contextlib.suppress(OSError):
                _fsync_dir(paths["json"].parent)


def _owned(paths: dict[str, Path], origin: Origin) -> dict[str, str | None]:
    """Per sidecar: None when its name is free or holds ocrwatch's own file for ``origin``, else what holds it
    instead. A Markdown goes with its JSON: ours when the JSON is, another document's when the JSON is."""
    found = {kind: look(path, PROBE_BYTES) for kind, path in paths.items()}
    whose = {
        kind: _whose(occupant.head, origin)
        for kind, occupant in found.items()
        if kind != "md" and occupant is not None and occupant.other is None
    }
    owned: dict[str, str | None] = {}
    for kind, occupant in found.items():
        if occupant is None or occupant.other is not None:
            owned[kind] = None if occupant is None else occupant.other
        elif kind != "md":
            owned[kind] = whose[kind]
        elif (json_whose := whose.get("json", FOREIGN)) != FOREIGN:
            owned[kind] = json_whose  # None (ours) or another document's
        else:
            owned[kind] = None if owns_markdown(occupant.head) else FOREIGN
    return owned


def _whose(head: bytes, origin: Origin) -> str | None:
    """None when a JSON sidecar beginning with ``head`` is ocrwatch's for ``origin``; else whose it is: a user's,
    or that of another document still beside ``origin`` (whose sidecar takes the same name)."""
    if not owns_json(head):
        return FOREIGN
    source = json_member(head, "source")
    other = source.get("name") if isinstance(source, dict) else None
    if not isinstance(origin, LocalFile) or not isinstance(other, str) or other == origin.name:
        return None
    if "/" in other or "\0" in other or other in ("", ".", "..") or not os.path.lexists(origin.path.parent / other):
        return None  # its document is gone: a stale sidecar, ocrwatch's to replace
    return f"the sidecar of {other}, which lies beside {origin.name}"


def _pdf_ours(path: Path, pdf: Path, origin: Origin) -> bool:
    """Whether the searchable PDF at ``pdf`` is ocrwatch's to replace or remove: the JSON sidecar at ``path``,
    ocrwatch's for ``origin``, records one, or the file carries ocrwatch's mark (a write killed between the PDF
    and its JSON left it), as a figure does."""
    found = look(path, HEAD_BYTES)
    if found is not None and found.other is None and _whose(found.head, origin) is None:
        section = json_member(found.head, "searchable_pdf")
        if isinstance(section, dict) and "path" in section:
            return True
    return further.pdf_marked(pdf)


def _conflict(path: Path, what: str) -> OutputConflict:
    return OutputConflict(
        f"{path} is {what}; ocrwatch writes a sidecar there and replaces only its own",
        hint=f"move {path} away (or set [output] dir or a different [output] name_template), then `ocrwatch retry`",
    )
