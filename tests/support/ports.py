"""Loopback ports for the servers and daemons the tests start, safe under pytest-xdist.

A port asked of the kernel (``bind(0)``) is random, so two workers can be handed the same one in
the moment before a daemon binds it. Under xdist each worker instead takes ports in turn from a
slice of its own, below the kernel's ephemeral range (which outgoing connections and ``bind(0)``
use), each checked free.
"""

from __future__ import annotations

import os
import random
import re
import socket
from pathlib import Path

LOWEST = 10000  # above the well-known and Ceph's default (6800-7300) ports
_cursor: list[int] = []


def _ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range: the slices stay below it."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _worker_slice() -> range | None:
    """This xdist worker's ports; None outside xdist, where one process asks the kernel safely."""
    worker = re.fullmatch(r"gw(\d+)", os.environ.get("PYTEST_XDIST_WORKER", ""))
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if worker is None or count < 1:
        return None
    size = (_ephemeral_start() - LOWEST) // count
    if size < 100:
        return None
    start = LOWEST + int(worker.group(1)) * size
    return range(start, start + size)


def _bindable(port: int) -> bool:
    """Whether ``port`` can be bound now: a listener from an earlier test may still hold it."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback port nobody listens on now, and that no other worker of this run is handed."""
    ports = _worker_slice()
    if ports is not None:
        if not _cursor:
            _cursor.append(random.randrange(len(ports)))  # a second run at once starts elsewhere
        for _ in range(len(ports)):
            _cursor[0] = (_cursor[0] + 1) % len(ports)
            if _bindable(ports[_cursor[0]]):
                return ports[_cursor[0]]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
