"""Walking a folder tree that others can write to: by descriptor, one level at a time, never by
recursion.

Any user of a shared inbox can make a chain of folders as deep as the filesystem allows: thousands
of levels, paths far longer than ``PATH_MAX``. A recursive walk (``os.walk`` up to Python 3.11) then
raises ``RecursionError``, and a walk by path name fails with ``ENAMETOOLONG`` and can be led
elsewhere by a folder swapped for a link. So this walk keeps a stack of its own, opens each folder
from its parent's descriptor with ``O_NOFOLLOW | O_DIRECTORY`` (a link is never entered, whenever it
was swapped in), holds one descriptor per level, and stops at ``max_depth``: a deeper folder is
reported, never entered. Blocking; ``local``'s scan and ``inotify``'s watches both walk through
here.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ocrwatch.safefs import FOLDER_FLAGS


@dataclass(frozen=True)
class Listing:
    """One folder reached by ``walk``, and what its entries are, told apart without following a
    link."""

    folder: Path
    depth: int  # levels below the root: 0 for the root itself
    fd: int  # the folder's descriptor, open only until the walk goes on
    files: tuple[str, ...]  # every entry that is not a folder: files, links, FIFOs, sockets
    # links that lead to a folder (one of ``files`` too); never entered
    folder_links: tuple[str, ...]
    # folders more than ``max_depth`` levels below the root; never entered
    too_deep: tuple[str, ...]


def depth_of(folder: Path, root: Path) -> int:
    """How many levels ``folder`` lies below ``root`` (0 for ``root`` itself)."""
    return len(_below(folder, root))


def _below(folder: Path, root: Path) -> tuple[str, ...]:
    """The names leading from ``root`` down to ``folder``: ``relative_to``'s parts, without its
    parsing of both paths again (the scan of the folders beyond a watch bound asks it of each, many
    thousands a look). Raises ValueError when ``folder`` is not ``root`` or inside it."""
    parts, top = folder.parts, root.parts
    if parts[: len(top)] != top:
        raise ValueError(f"{folder} is not in {root}")
    return parts[len(top) :]


def open_folder(folder: Path, root: Path) -> int:
    """A descriptor of ``folder``, opened from ``root`` one component at a time without following a
    link.

    Raises OSError when a component is missing, a link or not a folder (ELOOP, ENOTDIR, ENOENT): the
    name no longer means the folder it meant.
    """
    fd = os.open(root, FOLDER_FLAGS)
    try:
        for part in _below(folder, root):
            inner = os.open(part, FOLDER_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def _leads_to_folder(name: str, fd: int) -> bool:
    """Whether the link ``name`` in the folder ``fd`` points at a folder: a ``stat`` through it,
    never an open."""
    try:
        return stat.S_ISDIR(os.stat(name, dir_fd=fd).st_mode)
    except OSError:
        return False


def _list(
    fd: int, folder: Path, depth: int, max_depth: int, enter: Callable[[Path], bool]
) -> tuple[Listing, list[str]]:
    """The listing of the open folder ``fd`` and the names of the subfolders to walk next."""
    files: list[str] = []
    links: list[str] = []
    deep: list[str] = []
    inner: list[str] = []
    with os.scandir(fd) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if not enter(folder / entry.name):
                    continue
                (deep if depth + 1 > max_depth else inner).append(entry.name)
                continue
            files.append(entry.name)
            if (
                entry.is_symlink()
                and enter(folder / entry.name)
                and _leads_to_folder(entry.name, fd)
            ):
                links.append(entry.name)
    listing = Listing(folder, depth, fd, tuple(files), tuple(links), tuple(deep))
    inner.reverse()  # popped from the end: walked in the order listed
    return listing, inner


def walk(root: Path, top: Path, max_depth: int, enter: Callable[[Path], bool]) -> Iterator[Listing]:
    """Every folder from ``top`` down (``top`` inside ``root``, both resolved), each listed before
    its subfolders.

    A subfolder is walked when ``enter`` allows its path and it lies at most ``max_depth`` levels
    below ``root``; one that ``enter`` allows but lies deeper is named in its parent's ``too_deep``.
    A subfolder that cannot be opened or listed (gone, swapped for a link, not readable) is passed
    over. Raises OSError when ``top`` itself cannot be reached or listed, so an unreachable inbox
    never reads as an empty one. A folder's descriptor is closed once its last subfolder is opened,
    so a chain holds two whatever its depth, and no tree more than ``max_depth + 1``.
    """
    stack: list[tuple[int, Path, int, list[str]]] = []
    try:
        fd = open_folder(top, root)
        stack.append((fd, top, depth_of(top, root), []))
        listing, inner = _list(fd, top, stack[-1][2], max_depth, enter)
        stack[-1][3].extend(inner)
        yield listing
        while stack:
            fd, folder, depth, pending = stack[-1]
            if not pending:
                stack.pop()
                os.close(fd)
                continue
            name = pending.pop()
            try:
                child = os.open(name, FOLDER_FLAGS, dir_fd=fd)
            except OSError:
                continue
            finally:
                if not pending:  # nothing more to open from here: the walk never comes back to it
                    stack.pop()
                    os.close(fd)
            stack.append((child, folder / name, depth + 1, []))
            try:
                listing, inner = _list(child, folder / name, depth + 1, max_depth, enter)
            except OSError:
                stack.pop()
                os.close(child)
                continue
            stack[-1][3].extend(inner)
            yield listing
    finally:
        for fd, *_ in stack:
            os.close(fd)
