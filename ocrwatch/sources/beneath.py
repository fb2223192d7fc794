"""Reading a file of a folder that others can write to: no link is followed, and a document is read once.

Checking a path and then opening it are two steps that another user can race, by swapping the file for a
symlink between them. So every lookup here walks down from the inbox folder with ``O_NOFOLLOW`` on every
component, and every later question is put to the descriptor (``fstat``). A fetched document is copied through
its descriptor into the job's private spool folder while it is hashed: the bytes rendered are the bytes hashed,
whatever happens to the name afterwards. Everything here is blocking and cheap apart from the copy.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import stat
import sys
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import NamedTuple

from ocrwatch.errors import FileTooLarge, NotARegularFile, SourceChanged, SourceGone
from ocrwatch.safefs import Access
from ocrwatch.sources.base import Fetched

FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
"""Non-blocking, so a FIFO swapped in after the type check cannot hang the thread that opens it."""
CHUNK = 1 << 20
_GONE = (errno.ENOENT, errno.ELOOP, errno.ENOTDIR)  # in a folder on the way: missing, a link, not a folder


class Signature(NamedTuple):
    """What "unchanged" means for a file. Size and mtime alone miss a replacement that keeps both (``touch
    -r``, a copy preserving times); the inode and ctime cannot be set back by a user."""

    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int
    device: int

    @classmethod
    def of(cls, info: os.stat_result) -> Signature:
        return cls(info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, info.st_dev)


def _relative_parts(path: Path, root: Path) -> tuple[str, ...]:
    if not path.is_relative_to(root) or path == root:
        raise NotARegularFile(f"{path}: outside the inbox {root}")
    parts = path.relative_to(root).parts
    if ".." in parts:
        raise NotARegularFile(f"{path}: outside the inbox {root}")
    return parts


def _symlink_refusal(path: Path, root: Path) -> NotARegularFile:
    """The refusal of a link, saying where it points: its text is only read, never resolved or opened."""
    try:
        target = Path(os.path.normpath(path.parent / os.readlink(path)))
    except OSError:  # no longer a link by now
        return NotARegularFile(f"{path}: a symlink; links are not followed")
    where = "leads outside the inbox, to" if not target.is_relative_to(root) else "leads to"
    return NotARegularFile(f"{path}: a symlink that {where} {target}; links are not followed")


@contextlib.contextmanager
def folder_of(path: Path, root: Path) -> Iterator[tuple[int, int]]:
    """The descriptor of ``path``'s folder, reached from ``root`` without following any link, and the
    inbox's device. A folder on the way that is missing, a link or not a folder: ``SourceGone`` (what the name
    meant when it was found is no longer there; nothing is written through the link either)."""
    parts = _relative_parts(path, root)
    try:
        fd = os.open(root, FOLDER_FLAGS)
    except OSError as exc:
        if exc.errno in _GONE:
            raise SourceGone(f"{path}: its inbox {root} is gone or was replaced by a link") from None
        raise
    try:
        device = os.fstat(fd).st_dev
        for index, part in enumerate(parts[:-1]):
            try:
                inner = os.open(part, FOLDER_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in _GONE:
                    raise
                folder = root.joinpath(*parts[: index + 1])
                if os.path.islink(folder):  # O_DIRECTORY | O_NOFOLLOW on a link: ELOOP or ENOTDIR
                    raise SourceGone(f"{path}: its folder {folder} is now a symlink; links are not followed") from None
                raise SourceGone(f"{path}: its folder {folder} no longer exists") from None
            os.close(fd)
            fd = inner
        yield fd, device
    finally:
        os.close(fd)


def _check(path: Path, root: Path, info: os.stat_result, device: int) -> None:
    if stat.S_ISLNK(info.st_mode):
        raise _symlink_refusal(path, root)
    if not stat.S_ISREG(info.st_mode):
        raise NotARegularFile(f"{path}: not a regular file")
    if info.st_dev != device:
        raise NotARegularFile(f"{path}: on another filesystem than its inbox {root}")


def inspect(path: Path, root: Path) -> Signature:
    """The signature of the regular file ``path`` inside ``root`` (resolved). Opens no file.

    Raises ``SourceGone`` when nothing is there (or a folder on the way is no longer a folder), and
    ``NotARegularFile`` for a link, a FIFO, a device or a file on another filesystem.
    """
    with folder_of(path, root) as (folder, device):
        try:
            info = os.stat(path.name, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            raise SourceGone(f"{path}: no longer exists") from None
        _check(path, root, info, device)
        return Signature.of(info)


def open_file(path: Path, root: Path) -> tuple[int, Signature]:
    """A read-only descriptor of the regular file ``path`` inside ``root``, and its signature by ``fstat``.
    The caller closes it. Raises as ``inspect`` does; nothing but a regular file is ever opened."""
    with folder_of(path, root) as (folder, device):
        try:
            _check(path, root, os.stat(path.name, dir_fd=folder, follow_symlinks=False), device)
            fd = os.open(path.name, FILE_FLAGS, dir_fd=folder)
        except FileNotFoundError:
            raise SourceGone(f"{path}: no longer exists") from None
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            raise _symlink_refusal(path, root) from None  # swapped for a link since the check
    try:
        info = os.fstat(fd)
        _check(path, root, info, device)
    except BaseException:
        os.close(fd)
        raise
    return fd, Signature.of(info)


def changed_since(path: Path, root: Path, before: Signature) -> bool:
    """Whether ``path`` no longer is the file that had signature ``before`` (gone, replaced or written)."""
    try:
        return inspect(path, root) != before
    except (SourceGone, NotARegularFile, OSError):
        return True


def copy_out(fd: int, source: Path, target: Path, max_bytes: int) -> tuple[str, Signature]:
    """Copy the open file ``fd`` (named ``source`` in messages) to the new file ``target`` (mode 0600), hashing
    what is copied; the sha256 of the copy and the signature it was read under.

    Raises ``FileTooLarge`` over ``max_bytes`` (before copying anything when ``fstat`` says so), and
    ``SourceChanged`` when the file was written while it was copied: the copy could mix two versions.
    """
    before = Signature.of(os.fstat(fd))
    if before.size > max_bytes:
        raise FileTooLarge(f"{source}: {before.size} bytes, more than max_bytes={max_bytes}")
    digest, copied = hashlib.sha256(), 0
    out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        while block := os.pread(fd, CHUNK, copied):
            copied += len(block)
            if copied > max_bytes:
                raise FileTooLarge(f"{source}: more than max_bytes={max_bytes} bytes")
            digest.update(block)
            view = memoryview(block)
            while view:
                view = view[os.write(out, view) :]
        after = Signature.of(os.fstat(fd))
        if after != before or copied != after.size:
            raise SourceChanged(f"{source} changed while it was read")
        os.utime(out, ns=(os.fstat(fd).st_atime_ns, before.mtime_ns))  # the sidecar reports the source's mtime
    except BaseException:
        os.close(out)
        target.unlink(missing_ok=True)
        raise
    os.close(out)
    return digest.hexdigest(), before


def spool_name(path: Path) -> str:
    """A short fixed name for the private copy, keeping a plain suffix for whoever reads the folder."""
    suffix = path.suffix
    return "source" + (suffix if re.fullmatch(r"\.\w{1,8}", suffix) else "")


def fetch_copy(path: Path, root: Path, spool_dir: Path, max_bytes: int | None) -> Fetched:
    """The file ``path`` of the inbox ``root``, opened once as ``open_file`` does and copied through that
    descriptor into ``spool_dir``; the copy, its sha256, and how to tell later that ``path`` has changed."""
    fd, _ = open_file(path, root)
    target = spool_dir / spool_name(path)
    try:
        info = os.fstat(fd)
        sha256, signature = copy_out(fd, path, target, sys.maxsize if max_bytes is None else max_bytes)
    finally:
        os.close(fd)
    access = Access.of(info)
    return Fetched(target, sha256, partial(changed_since, path, root, signature), access)


def measure(path: Path, root: Path) -> tuple[Signature, str]:
    """The signature and sha256 of the file ``path`` of the inbox ``root``, both read through one descriptor
    opened as ``open_file`` does (blocking; hashlib releases the GIL)."""
    fd, signature = open_file(path, root)
    try:
        hasher, offset = hashlib.sha256(), 0
        while block := os.pread(fd, CHUNK, offset):
            hasher.update(block)
            offset += len(block)
    finally:
        os.close(fd)
    return signature, hasher.hexdigest()


@contextlib.contextmanager
def made_folders(base: Path, parts: Sequence[str]) -> Iterator[int]:
    """A descriptor of ``base/parts...``, each folder below ``base`` made where missing and never a link."""
    base.mkdir(parents=True, exist_ok=True)  # the configured folder itself, resolved at start
    fd = os.open(base, FOLDER_FLAGS)
    try:
        for part in parts:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=fd)
            inner = os.open(part, FOLDER_FLAGS, dir_fd=fd)  # ELOOP or ENOTDIR on a link
            os.close(fd)
            fd = inner
        yield fd
    finally:
        os.close(fd)
