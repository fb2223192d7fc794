"""The command line's output when its reader goes away: ``ocrwatch status | head``.

Python ignores SIGPIPE, so a write to a pipe whose reader has closed raises ``BrokenPipeError``
wherever it happens: in a command's own ``print``, in a log line deep inside the pipeline, or at
exit, where the interpreter's last flush prints "Exception ignored" and makes the status 120. The
rule is the shell's for a command that SIGPIPE ended: it stops at the first write its reader
refused, quietly, with ``EXIT_CLOSED_PIPE``.

- A command's own lines raise: ``cli.main`` catches the error, points the descriptors whose reader
  is gone at /dev/null (what is still buffered goes nowhere rather than failing again at exit) and
  returns 141.
- Log lines go through ``LogStream``, which never raises into the code that logged (a document must
  not fail because a reader stopped reading): it drops the line, silences the descriptor and
  interrupts the main thread as a signal would: SIGINT for the short commands (they stop as on
  Ctrl-C, ``ocr`` cancelling its jobs), SIGTERM for ``run`` (the daemon drains and stops).
"""

from __future__ import annotations

import _thread
import os
import select
import signal
import sys
import threading
from typing import TextIO

EXIT_CLOSED_PIPE = 141
"""128 + SIGPIPE: the status a shell shows for a command that signal ended (``yes | head``)."""


def reader_gone(fd: int) -> bool:
    """Whether writes to ``fd`` fail for want of a reader: a pipe whose read end is closed (poll
    says POLLERR) or a socket whose peer is gone (POLLHUP). False for a terminal, a file, or a
    descriptor that is not open."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    try:
        events = poller.poll(0)
    except OSError:
        return False
    gone = select.POLLERR | select.POLLHUP
    return any(mask & gone and not mask & select.POLLNVAL for _, mask in events)


def silence(fd: int) -> None:
    """Point ``fd`` at /dev/null: later writes, and Python's flush at exit, go nowhere."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


def silence_gone() -> bool:
    """Silence stdout and stderr where their reader is gone; whether either was."""
    gone = [fd for fd in (1, 2) if reader_gone(fd)]
    for fd in gone:
        silence(fd)
    return bool(gone)


def flush() -> None:
    """Flush stdout and stderr now: a refused write raises into ``cli.main``, not at exit."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()


class LogStream:
    """The logs' stream (stderr): a write its reader refuses is dropped, never raised, and the main
    thread is interrupted once with ``stop`` (a signal; None: not at all). ``closed`` says so."""

    def __init__(self, stream: TextIO, stop: signal.Signals | None = signal.SIGINT) -> None:
        self._stream = stream
        self.stop = stop
        self.closed = False
        self._interrupted = False
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        if not self.closed:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._gone()
        self._interrupt()
        return len(text)

    def flush(self) -> None:
        if not self.closed:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._gone()
        if self.closed:
            self._interrupt()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    def _gone(self) -> None:
        """Once, from whichever thread logged: the descriptor silenced, so what the stream still
        buffers goes nowhere."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        try:
            silence(self._stream.fileno())
            self._stream.flush()
        except (OSError, ValueError):  # no descriptor (a test's capture): nothing to silence
            pass

    def _interrupt(self) -> None:
        """The main thread interrupted once Python handles ``stop``: a line dropped before the
        daemon's handlers exist leaves it to the next line, since the signal's default kills."""
        with self._lock:
            handled = self.stop is not None and callable(signal.getsignal(self.stop))
            if self._interrupted or not handled:
                return
            self._interrupted = True
        assert self.stop is not None
        _thread.interrupt_main(self.stop)
