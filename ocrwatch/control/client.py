"""The client end, in the CLI: whether a daemon holds the state, and one request to it.

Imports nothing of the pipeline: ``ocrwatch status`` and ``retry`` stay quick and light.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ocrwatch.control.protocol import CONNECT_SECONDS, LOCK_NAME, SOCKET_NAME, ControlError, address
from ocrwatch.errors import ConfigError


def daemon_holds(state_dir: Path) -> bool:
    """Whether a daemon holds ``state_dir``'s lock now. Probed with a shared lock held for an
    instant (a daemon starting meanwhile retries its own for a while)."""
    path = state_dir / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise ConfigError(
            f"state_dir: {path} cannot be read: {exc.strerror}",
            hint=f"run as the user ocrwatch runs as, or make {state_dir} readable",
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the probe's lock
    return False


class Client:
    """One connection to the running daemon, for one request."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    @classmethod
    def connect(cls, state_dir: Path, *, wait: float = CONNECT_SECONDS) -> Client | None:
        """A connection to the daemon holding ``state_dir``; None when none holds it. ControlError
        when one holds it but does not answer within ``wait`` seconds (stopping, or hung)."""
        path = state_dir / SOCKET_NAME
        deadline = time.monotonic() + wait
        while True:
            if not daemon_holds(state_dir):
                return None
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                with address(path) as where:
                    sock.connect(where)
                return cls(sock)
            except OSError as exc:
                sock.close()
                if exc.errno not in (errno.ENOENT, errno.ECONNREFUSED, errno.EAGAIN):
                    raise ControlError(
                        f"cannot connect to the daemon's control socket {path}: {exc.strerror}",
                        hint="run as the user the daemon runs as",
                    ) from None
            if time.monotonic() > deadline:
                raise ControlError(
                    f"a daemon holds {state_dir} but does not answer on {path}",
                    hint="it may be stopping: wait for it, or look at its log (journalctl -u "
                    "ocrwatch)",
                )
            time.sleep(0.1)

    def request(self, payload: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Send ``payload``; yield each event the daemon answers, up to ``end`` (not included). An
        ``error`` event raises ControlError, as does a connection that ends before ``end``."""
        try:
            self._sock.sendall(json.dumps(payload).encode() + b"\n")
            with self._sock.makefile("rb") as lines:
                for line in lines:
                    try:
                        event = json.loads(line)
                    except ValueError:
                        raise ControlError(
                            f"the daemon answered something else than JSON: {line[:80]!r}"
                        ) from None
                    if event.get("event") == "end":
                        return
                    if event.get("event") == "error":
                        raise ControlError(
                            f"the daemon refused: {event.get('message')}", hint=event.get("hint")
                        )
                    yield event
        except OSError as exc:
            raise ControlError(f"the connection to the daemon failed: {exc}") from None
        finally:
            self._sock.close()
        raise ControlError("the daemon closed the connection before it was done (it stopped?)")
