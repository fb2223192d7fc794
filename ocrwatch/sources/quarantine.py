"""Moving a failed document aside to its inbox's ``quarantine_dir``, where others can write too.

Both sides are reached through folder descriptors, walking down without following any link: a folder of the
inbox swapped for a link, or a folder of the quarantine made a link in advance, can neither move a file from
outside the inbox nor put one outside the quarantine. Nothing is overwritten: a taken name gets a number.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from itertools import count
from pathlib import Path

from ocrwatch.errors import NotARegularFile
from ocrwatch.naming import sidecar_names
from ocrwatch.sources.beneath import CHUNK, FILE_FLAGS, folder_of, made_folders

_NO_LINK = (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP)


def quarantine(path: Path, root: Path, quarantine_dir: Path, name_template: str) -> Path:
    """Move a failed document, with its error sidecar, to the same place under ``quarantine_dir``. Blocking.

    Raises ``OSError`` (a link in the quarantine's folders: ``ELOOP``/``ENOTDIR``), or ``SourceGone`` and
    ``NotARegularFile`` when the document is no longer the regular file beneath its inbox.
    """
    relative = path.relative_to(root)
    with folder_of(path, root) as (source, _), made_folders(quarantine_dir, relative.parent.parts) as target:
        if not stat.S_ISREG(os.stat(path.name, dir_fd=source, follow_symlinks=False).st_mode):
            raise NotARegularFile(f"{path}: not a regular file")
        moved = _move_exclusive(source, path.name, target, path.name)
        error = sidecar_names(path.name, name_template)["error"]
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISREG(os.stat(error, dir_fd=source, follow_symlinks=False).st_mode):
                _move_exclusive(source, error, target, sidecar_names(moved, name_template)["error"])
    return quarantine_dir / relative.parent / moved


def _move_exclusive(source: int, name: str, target: int, wanted: str) -> str:
    """Move ``name`` from the folder ``source`` into ``target`` as ``wanted``, or ``stem.N.suffix`` when taken;
    the name it got."""
    plain = Path(wanted)
    for number in count():
        candidate = wanted if number == 0 else f"{plain.stem}.{number}{plain.suffix}"
        try:
            os.link(name, candidate, src_dir_fd=source, dst_dir_fd=target, follow_symlinks=False)
        except FileExistsError:
            continue
        except OSError as exc:
            if exc.errno not in _NO_LINK:
                raise
            try:
                _copy_exclusive(source, name, target, candidate)
            except FileExistsError:
                continue
        os.unlink(name, dir_fd=source)
        return candidate
    raise AssertionError("unreachable")


def _copy_exclusive(source: int, name: str, target: int, candidate: str) -> None:
    """Copy to a name that must not exist yet (across filesystems, where a link cannot be made)."""
    out = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=target)
    try:
        data = os.open(name, FILE_FLAGS, dir_fd=source)
        try:
            while block := os.read(data, CHUNK):
                view = memoryview(block)
                while view:
                    view = view[os.write(out, view) :]
            info = os.fstat(data)
        finally:
            os.close(data)
        os.fchmod(out, stat.S_IMODE(info.st_mode))
        os.utime(out, ns=(info.st_atime_ns, info.st_mtime_ns))
        os.fsync(out)
    except BaseException:
        os.unlink(candidate, dir_fd=target)
        raise
    finally:
        os.close(out)
