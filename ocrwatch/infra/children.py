"""The child processes that worker threads wait for (pdfinfo, pdftoppm), known so that a stop can
end them.

A thread blocked in ``subprocess.run`` cannot be cancelled: the task awaiting it can, but the
interpreter waits for every worker thread at exit, so one slow page would hold a SIGTERM for up to
its render timeout. ``run`` keeps each child in a set while it runs; ``kill_all``, called once a
drain has cancelled what it could not wait for, kills them, and each waiting thread returns at once
with the signal as the child's status.

A child that decodes what others wrote (pdftoppm) may be given a bound on its memory: ``prlimit``
(util-linux) sets its address space (``RLIMIT_AS``) and then becomes the program, so an allocation
beyond the bound fails in the child, which says so, instead of taking the machine's memory. No
``preexec_fn``: Python code run between fork and exec may deadlock in a process with threads.
"""

from __future__ import annotations

import contextlib
import errno
import shutil
import subprocess
import threading
from collections.abc import Iterator, Sequence
from typing import Any

_lock = threading.Lock()
_running: set[subprocess.Popen[bytes]] = set()


PRLIMIT = "prlimit"
"""Sets a child's limits, then becomes it (util-linux, on every Linux that has poppler-utils)."""


def run(
    argv: Sequence[str], *, timeout: float, memory: int | None = None, **popen: Any
) -> subprocess.CompletedProcess[bytes]:
    """``subprocess.run(argv, timeout=timeout, **popen)``: the same result and ``TimeoutExpired``
    (the child killed first), with the child in reach of ``kill_all`` while it runs. ``memory``:
    the bytes of address space the child may map (``limited``)."""
    if memory is not None:
        argv = limited(argv, memory)
    with subprocess.Popen(argv, **popen) as process, tracked(process):
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except BaseException:
            process.kill()
            process.wait()
            raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def limited(argv: Sequence[str], memory: int) -> list[str]:
    """``argv`` run by ``prlimit`` with at most ``memory`` bytes of address space (soft and hard:
    the child cannot raise it). A program not on PATH raises ``FileNotFoundError`` here, as
    ``Popen`` would, rather than becoming prlimit's complaint; a missing prlimit raises it from
    ``Popen`` (``render.check_renderer`` refuses to start without it)."""
    program = shutil.which(argv[0])
    if program is None:
        raise FileNotFoundError(errno.ENOENT, "not found on PATH", argv[0])
    return [PRLIMIT, f"--as={memory}", "--", program, *argv[1:]]


@contextlib.contextmanager
def tracked(process: subprocess.Popen[bytes]) -> Iterator[None]:
    """``process`` in reach of ``kill_all`` while the block runs: for a caller that reads the
    child's output itself (``pagetext`` bounds it)."""
    with _lock:
        _running.add(process)
    try:
        yield
    finally:
        with _lock:
            _running.discard(process)


def kill_all() -> int:
    """Kill every child ``run`` is waiting for; how many there were."""
    with _lock:
        running = list(_running)
    for process in running:
        process.kill()  # a child that has just exited is not signalled: Popen knows it once reaped
    return len(running)
