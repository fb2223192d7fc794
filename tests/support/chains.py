"""Chains of folders thousands of levels deep, made and removed through descriptors.

Such a chain's paths are far longer than ``PATH_MAX``, so nothing here names a folder by its full
path, and ``shutil.rmtree`` (recursive, a level a frame) cannot remove one: ``remove_chain`` removes
it from the bottom up, a few hundred levels a pass, with as many descriptors at most.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
HELD = 256


def make_chain(
    top: Path, depth: int, name: str = "d", files: dict[int, tuple[str, bytes]] | None = None
) -> None:
    """``top/name/name/...``, ``depth`` folders deep; ``files`` puts a file (name, bytes) in the
    folder at a level (1 for ``top/name``)."""
    fd = os.open(top, FOLDER)
    try:
        for level in range(1, depth + 1):
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, dir_fd=fd)
            inner = os.open(name, FOLDER, dir_fd=fd)
            os.close(fd)
            fd = inner
            if files and level in files:
                file_name, data = files[level]
                out = os.open(
                    file_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644, dir_fd=fd
                )
                os.write(out, data)
                os.close(out)
    finally:
        os.close(fd)


def chain_depth(top: Path, name: str = "d") -> int:
    """How many levels of ``name`` lie below ``top``."""
    depth, fd = 0, os.open(top, FOLDER)
    try:
        while True:
            try:
                inner = os.open(name, FOLDER, dir_fd=fd)
            except FileNotFoundError:
                return depth
            os.close(fd)
            fd, depth = inner, depth + 1
    finally:
        os.close(fd)


def remove_chain(top: Path, name: str = "d") -> None:
    """Remove ``top/name`` and the chain below it, files included, the deepest ``HELD`` levels a
    pass: each pass walks down holding the descriptors of the last ``HELD`` folders only, then
    empties and removes those."""
    while True:
        held: list[int] = [os.open(top, FOLDER)]
        try:
            while True:
                try:
                    inner = os.open(name, FOLDER, dir_fd=held[-1])
                except FileNotFoundError:
                    break
                held.append(inner)
                if len(held) > HELD + 1:
                    os.close(held.pop(0))
            if len(held) == 1:
                return  # nothing below top
            while len(held) > 1:
                folder = held.pop()
                for entry in os.listdir(folder):
                    os.unlink(entry, dir_fd=folder)
                os.close(folder)
                os.rmdir(name, dir_fd=held[-1])
        finally:
            for fd in held:
                os.close(fd)


@contextlib.contextmanager
def removed_after(*chains: tuple[Path, str]) -> Iterator[None]:
    """Remove each (top, name) chain at the end, however the block ends: pytest's own clean-up of
    its temporary folders recurses a level a frame and would fail on them."""
    try:
        yield
    finally:
        for top, name in chains:
            if top.exists():
                remove_chain(top, name)
