"""Talking to systemd: ``sd_notify`` (READY, RELOADING, STOPPING, WATCHDOG) and how often to ping
the watchdog.

Written against the socket protocol directly (a datagram to ``NOTIFY_SOCKET``), so there is no
dependency on libsystemd, and every call is a no-op when the daemon does not run under systemd.
"""

from __future__ import annotations

import os
import socket

import structlog

log = structlog.get_logger()


def sd_notify(message: str) -> bool:
    """Send one notification to systemd when ``NOTIFY_SOCKET`` is set; silently a no-op
    otherwise."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError as exc:
        log.warning("sd_notify_failed", error=str(exc))
        return False
    return True


def watchdog_interval(health_interval: float) -> float:
    """Seconds between health ticks: ``health_interval``, or half of systemd's ``WATCHDOG_USEC``
    when that is shorter, as sd_watchdog_enabled(3) advises, so one late tick does not get the
    daemon killed."""
    watchdog_usec = os.environ.get("WATCHDOG_USEC")
    if not watchdog_usec:
        return health_interval
    return min(health_interval, int(watchdog_usec) / 2e6)
