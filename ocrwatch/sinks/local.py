"""Sidecars beside a local source (or mirrored under ``[output] dir``), written atomically.

Each file is written to a hidden temporary name in the destination folder, flushed, fsynced and renamed over
the final name, then the folder is fsynced: a reader sees the old file or the new one, never half of one,
even across ``kill -9`` or a full disk. The JSON goes last, so its presence means the Markdown is complete.
The temporary name is fixed per sidecar (created exclusively, never through a symlink), so a temporary left
by ``kill -9`` is replaced by the next write of that sidecar instead of piling up.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ocrwatch.errors import NameTooLong, OutputNotWritable
from ocrwatch.naming import sidecar_names
from ocrwatch.sources.base import Job, LocalFile

TMP_MARKER = ".ocrwatch-tmp-"
NAME_MAX = 255


def temporary_path(path: Path) -> Path:
    """The hidden name ``path`` is written under before the rename: fixed per target, at most 108 bytes."""
    name = os.fsencode(path.name)
    tag = hashlib.sha1(name).hexdigest()[:12]
    return path.with_name(os.fsdecode(b"." + name[:80]) + TMP_MARKER + tag)


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that ``path`` is always either absent, the old content or all of ``data``."""
    tmp = temporary_path(path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # a leftover of a killed write (unlinking a symlink never touches its target)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
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


class LocalSink:
    """Writes ``NAME.md`` / ``NAME.json`` / ``NAME.error.json`` beside the source file."""

    def __init__(self, name_template: str = "{name}", out_dir: Path | None = None) -> None:
        self._template = name_template
        self._out_dir = out_dir

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
            folder = self._out_dir / relative
        names = sidecar_names(origin.path.name, self._template)
        for name in names.values():  # the config validates the template; this holds whatever it let through
            if "/" in name or "\0" in name or name in (".", ".."):
                raise OutputNotWritable(f"the sidecar name {name!r} for {origin.path} would leave its folder")
        return {kind: folder / name for kind, name in names.items()}

    def recorded(self, job: Job) -> dict[str, Any] | None:
        try:
            data = json.loads(self.paths(job)["json"].read_bytes())
        except (OSError, ValueError):
            return None
        source = data.get("source") if isinstance(data, dict) else None
        return source if isinstance(source, dict) else None

    def write(self, job: Job, markdown: str, document: dict[str, Any]) -> None:
        paths = self.paths(job)
        self._prepare(paths["json"].parent, paths["md"], paths["json"])
        atomic_write(paths["md"], _encode_markdown(markdown))
        atomic_write(paths["json"], dump_json(document))
        try:
            paths["error"].unlink()
        except FileNotFoundError:
            pass

    def write_error(self, job: Job, error: dict[str, Any]) -> None:
        path = self.paths(job)["error"]
        self._prepare(path.parent, path)
        atomic_write(path, dump_json(error))

    def _prepare(self, folder: Path, *targets: Path) -> None:
        """Check before writing anything, so a document never gets half of its sidecars for a known reason."""
        for target in targets:
            if len(os.fsencode(target.name)) > NAME_MAX:
                raise NameTooLong(f"the sidecar name for {target.name[:40]}... would be longer than {NAME_MAX} bytes")
        if self._out_dir is not None:
            folder.mkdir(parents=True, exist_ok=True)
        if not os.access(folder, os.W_OK | os.X_OK):
            read_only = False
            with contextlib.suppress(OSError):
                read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
            reason = "the filesystem is read-only" if read_only else os.strerror(errno.EACCES).lower()
            raise OutputNotWritable(f"cannot write sidecars in {folder}: {reason}")
