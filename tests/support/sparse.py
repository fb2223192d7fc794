"""Sparse files (a few bytes of data, terabytes long) and a count of what ``os.pread`` reads of
them, for the byte budgets: a file over its budget must cost a ``stat``, never a read."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

TIB = 1 << 40


def sparse_file(
    path: Path, size: int, head: bytes = b"%PDF-1.4\n", tail: bytes = b"%%EOF\n"
) -> Path:
    """``head`` at the start and ``tail`` at the end of a file of ``size`` bytes, a hole between."""
    with open(path, "wb") as handle:
        handle.write(head)
        handle.seek(size - len(tail))
        handle.write(tail)
    return path


class Reads:
    """What ``os.pread`` reads of the files ``watch`` names (by inode): bytes, and the threads that
    read them. Past ``cap`` bytes it raises instead, so a test whose fix is missing fails at once
    rather than reading terabytes of holes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, cap: int = 1 << 30) -> None:
        self.inodes: set[int] = set()
        self.bytes = 0
        self.threads: set[str] = set()
        self._then: list[tuple[int, Callable[[], object]]] = []
        self._cap = cap
        self._lock = threading.Lock()
        self._real = os.pread
        monkeypatch.setattr(os, "pread", self._pread)

    def after(self, count: int, then: Callable[[], object]) -> None:
        """Call ``then`` once ``count`` bytes of the watched files have been read."""
        self._then.append((count, then))

    def watch(self, path: Path) -> Path:
        self.inodes.add(os.stat(path).st_ino)
        return path

    def _pread(self, fd: int, length: int, offset: int) -> bytes:
        if os.fstat(fd).st_ino not in self.inodes:
            return self._real(fd, length, offset)
        with self._lock:
            if self.bytes > self._cap:
                raise RuntimeError(
                    f"read {self.bytes} bytes of a watched file, more than {self._cap}"
                )
            self.threads.add(threading.current_thread().name)
        data = self._real(fd, length, offset)
        with self._lock:
            self.bytes += len(data)
            due = [then for count, then in self._then if count <= self.bytes]
            self._then = [(count, then) for count, then in self._then if count > self.bytes]
        for then in due:
            then()
        return data
