"""The one HTTP layer: an aiohttp application on a HOST:PORT, guarded against connection floods.

The metrics/health endpoints and the S3 webhook both listen through ``Listener``. aiohttp parses
HTTP; this module bounds what a peer can hold, so a flood on one listener never takes file
descriptors or memory from the rest of the daemon (the inbox watcher, the ledger, the engine), nor
another listener's room:

- at most ``max_connections`` open connections per listener, and never more than a sixteenth of the
  process's descriptor limit (``RLIMIT_NOFILE``): all listeners together stay far from it, so
  ``accept()`` never meets ``EMFILE`` because of them;
- a listener that is full closes its least recently active connection that has no request in flight
  and has been quiet for ``GRACE_SECONDS`` to admit a new one, so idle connections cannot lock out
  a real request; while every such connection is younger, it stops accepting until one ends or ages
  (the kernel's queue holds the newcomers, in order), so a flood of connections that each carry a
  request is served at the pace the daemon can answer, never accepted only to be closed unread
  (asyncio's server accepts a whole backlog at once: each newcomer closed one accepted just before,
  and a sender among them got in by luck); it refuses a newcomer at once only when every
  connection has a request in flight;
- a connection that carries no request for ``idle_timeout`` seconds is closed, whether it never sent
  one, trickles its head, or sits on keep-alive: aiohttp's own ``keepalive_timeout`` (measured on
  3.14).

The listener accepts connections itself (``loop.add_reader`` on its sockets,
``loop.connect_accepted_socket``), since asyncio's server cannot be paused. A full listener is
logged once per episode, not per connection; so is an ``accept()`` that fails for want of
descriptors, tried again after ``ACCEPT_RETRY_SECONDS``. A handler that reads a body bounds that
read itself.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import resource
import socket
import termios
from typing import Any, Literal

import structlog
from aiohttp import web

log = structlog.get_logger()

DESCRIPTOR_SHARE = 16
"""A listener holds at most 1/16 of the soft descriptor limit (64 of systemd's default 1024), its
accept backlog as much again."""

MIN_CONNECTIONS = 4
GRACE_SECONDS = 0.25
"""How long a connection may be quiet before a newcomer may close it: time to send its request,
however many connections came just before it."""
ACCEPT_RETRY_SECONDS = 1.0
"""After ``accept()`` failed for want of descriptors: when it is tried again (asyncio's delay)."""
RELIEF_SECONDS = 1.0
"""A full episode ends once the listener has not been full for this long and holds half its
connections or fewer: a flood that fills it and lets go many times a second is one episode, not a
line pair each time."""
_EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def host_port(listen: str) -> tuple[str, int]:
    """``127.0.0.1:8787``, ``[::1]:8787`` or ``:8787`` (loopback) → (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"listen must be HOST:PORT, got {listen!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def connection_cap(wanted: int) -> int:
    """``wanted``, bounded by a listener's share of descriptors (``DESCRIPTOR_SHARE``; never under a
    few)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return min(wanted, max(MIN_CONNECTIONS, soft // DESCRIPTOR_SHARE))


class _Connection(asyncio.Protocol):
    """One accepted connection: admitted (then handed to aiohttp's request handler) or refused at
    once.

    Stands between the transport and aiohttp's protocol, so the listener counts open connections
    exactly and knows which are busy and when each was last active: aiohttp's server counts neither.
    """

    def __init__(self, listener: Listener) -> None:
        self._listener = listener
        self._inner: asyncio.Protocol | None = None
        self._transport: asyncio.Transport | None = None
        self.requests = 0
        self.last_active = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self.last_active = asyncio.get_running_loop().time()
        self._inner = self._listener._admit(transport, self)
        if self._inner is None:
            transport.close()
            return
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self.last_active = asyncio.get_running_loop().time()
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._inner is not None and self._transport is not None:
            self._listener._release(self._transport)
            self._inner.connection_lost(exc)

    @property
    def transport(self) -> asyncio.BaseTransport | None:
        return self._transport

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def unread(self) -> bool:
        """Whether bytes from the peer wait in the kernel, not yet read."""
        sock = self._transport.get_extra_info("socket") if self._transport is not None else None
        if sock is None:
            return False
        try:
            waiting = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
        except OSError:
            return False
        return waiting != b"\0\0\0\0"

    # -- busy while a request is handled: never the one evicted

    def request_started(self) -> None:
        self.requests += 1
        self.last_active = asyncio.get_running_loop().time()

    def request_ended(self) -> None:
        self.requests -= 1
        self.last_active = asyncio.get_running_loop().time()


class Listener:
    """Serve ``app`` on ``listen`` (``HOST:PORT``; port 0 picks a free one, ``.port`` tells which).

    ``max_connections`` is what the caller wants; ``connection_cap`` bounds it by the descriptor
    limit, and it is the accept queue's length as well. ``stop`` stops accepting, closes idle
    connections and gives requests in flight ``shutdown_timeout`` seconds in all to answer before
    they are cancelled. aiohttp's access log stays off: a request line may carry a token in its
    query.
    """

    def __init__(
        self,
        app: web.Application,
        listen: str,
        *,
        name: str,
        max_connections: int = 64,
        idle_timeout: float = 30.0,
        shutdown_timeout: float = 2.0,
    ) -> None:
        self.host, self._port = host_port(listen)
        self.name = name
        self.max_connections = connection_cap(max_connections)
        self.shutdown_timeout = shutdown_timeout
        self._handling: set[asyncio.Task[Any]] = set()  # requests being handled, for ``stop``
        self._connections: dict[asyncio.BaseTransport, _Connection] = {}
        self._opening: set[asyncio.Task[None]] = set()  # accepted, transport being made
        self._episode: dict[str, int] | None = None  # while full: connections evicted and refused
        self._full_at = 0.0  # when the listener was last full
        self._relief: asyncio.TimerHandle | None = None
        self._exhausted = False  # accept() failed for want of descriptors, not yet recovered
        self._sockets: list[socket.socket] = []
        self._accepting = False  # the loop watches the sockets for connections
        self._resume: asyncio.TimerHandle | None = None
        app.middlewares.append(self._track)
        self._runner = web.AppRunner(
            app, access_log=None, keepalive_timeout=idle_timeout, shutdown_timeout=shutdown_timeout
        )

    async def start(self) -> None:
        await self._runner.setup()
        try:
            self._sockets = await _bound(self.host, self._port, self.max_connections)
        except BaseException:  # the address is taken, say: leave nothing set up
            await self._runner.cleanup()
            raise
        self._accept_from_now(True)

    async def stop(self) -> None:
        if not self._sockets:
            return
        self._accept_from_now(False)
        for timer in (self._resume, self._relief):
            if timer is not None:
                timer.cancel()
        for sock in self._sockets:
            sock.close()
        self._sockets = []
        for opening in self._opening:
            opening.cancel()
        # aiohttp would wait twice as long, and not cancel a handler awaiting a shield
        if self._handling:
            await asyncio.wait(set(self._handling), timeout=self.shutdown_timeout)
            for task in self._handling:
                task.cancel()
        await self._runner.cleanup()

    @property
    def address(self) -> tuple[str, int]:
        """The bound address (the real port when ``listen`` asked for port 0)."""
        if not self._sockets:
            raise RuntimeError(f"{self.name} is not listening")
        host, port = self._sockets[0].getsockname()[:2]
        return str(host), int(port)

    @property
    def port(self) -> int:
        return self.address[1]

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    # -- accepting

    def _accept_from_now(self, accepting: bool) -> None:
        """Watch the sockets for connections, or stop: the kernel's queue holds them meanwhile."""
        if accepting == self._accepting or not self._sockets:
            return
        self._accepting = accepting
        loop = asyncio.get_running_loop()
        for sock in self._sockets:
            if accepting:
                loop.add_reader(sock.fileno(), self._accept, sock)
            else:
                loop.remove_reader(sock.fileno())

    def _resume_in(self, seconds: float) -> None:
        if self._resume is None:
            self._resume = asyncio.get_running_loop().call_later(seconds, self._resumed)

    def _resumed(self) -> None:
        self._resume = None
        self._accept_from_now(True)

    def _accept(self, sock: socket.socket) -> None:
        """Accept what the kernel queued while there is room (``_room``)."""
        loop = asyncio.get_running_loop()
        while (room := self._room()) != "wait":
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno not in _EXHAUSTED:
                    continue  # that connection's own fault (accept(2): treat it as EAGAIN)
                self._accept_failed(exc)
                self._accept_from_now(False)
                self._resume_in(ACCEPT_RETRY_SECONDS)
                return
            if self._exhausted:
                self._exhausted = False
                log.info("http_accept_recovered", listener=self.name)
            if room == "refuse":
                conn.close()
                continue
            opening = loop.create_task(self._open(conn))
            self._opening.add(opening)
            opening.add_done_callback(self._opening.discard)
        self._accept_from_now(False)

    async def _open(self, conn: socket.socket) -> None:
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                lambda: _Connection(self), conn
            )
        except OSError:  # gone before its transport was made
            conn.close()
        except asyncio.CancelledError:  # the listener stops
            conn.close()
            raise

    def _room(self) -> Literal["accept", "refuse", "wait"]:
        """Whether the next connection may come in: there is room, or the least recently active
        connection without a request in flight is closed to make it; ``refuse`` when every one has
        a request in flight and none has stirred for ``GRACE_SECONDS``. ``wait`` while those that
        could make room are younger than that: accepting resumes when one ends or ages."""
        if len(self._connections) + len(self._opening) < self.max_connections:
            return "accept"
        episode = self._full()
        now = asyncio.get_running_loop().time()
        idle = [c for c in self._connections.values() if c.requests == 0]
        busy, waited = not idle, 0.0
        while idle:
            victim = min(idle, key=lambda c: c.last_active)
            waited = now - victim.last_active
            if waited < GRACE_SECONDS:
                break
            if victim.unread():  # quiet only because the loop was too busy to read it
                victim.last_active, waited = now, 0.0
                idle.remove(victim)
                continue
            episode["evicted"] += 1
            victim.close()
            self._release(victim.transport)
            return "accept"
        if busy and not self._opening:
            waited = now - max(c.last_active for c in self._connections.values())
            if waited >= GRACE_SECONDS:
                episode["refused"] += 1
                return "refuse"
        self._resume_in(GRACE_SECONDS - waited)
        return "wait"

    def _admit(
        self, transport: asyncio.BaseTransport, connection: _Connection
    ) -> asyncio.Protocol | None:
        """aiohttp's protocol for a connection accepted with room for it; None while the listener
        stops."""
        server = self._runner.server
        if server is None or not self._sockets:
            return None
        self._connections[transport] = connection
        return server()

    def _full(self) -> dict[str, int]:
        self._full_at = asyncio.get_running_loop().time()
        if self._episode is None:
            log.warning(
                "http_connections_full",
                listener=self.name,
                max_connections=self.max_connections,
                action="closing the least recently active idle connection for each new one",
            )
            self._episode = {"evicted": 0, "refused": 0}
        return self._episode

    def _release(self, transport: asyncio.BaseTransport | None) -> None:
        if transport is not None:
            self._connections.pop(transport, None)
        if self._episode is not None and self._relief is None and self._sockets:
            self._relief = asyncio.get_running_loop().call_later(RELIEF_SECONDS, self._relieved)
        if not self._exhausted:
            self._accept_from_now(True)

    def _relieved(self) -> None:
        """End the episode if the listener holds half its connections or fewer and has not been
        full for ``RELIEF_SECONDS``; else look again then, or at the next connection's end."""
        self._relief = None
        if self._episode is None or len(self._connections) > self.max_connections // 2:
            return
        quiet = asyncio.get_running_loop().time() - self._full_at
        if quiet < RELIEF_SECONDS:
            self._relief = asyncio.get_running_loop().call_later(
                RELIEF_SECONDS - quiet, self._relieved
            )
            return
        log.info("http_connections_relieved", listener=self.name, **self._episode)
        self._episode = None

    def _accept_failed(self, exc: OSError) -> None:
        """``accept()`` met a descriptor limit; tried again after ``ACCEPT_RETRY_SECONDS``. Logged
        once until it recovers."""
        if not self._exhausted:
            self._exhausted = True
            log.error(
                "http_accept_exhausted",
                listener=self.name,
                error=str(exc),
                hint="the process is out of file descriptors; raise LimitNOFILE or find what "
                "holds them",
            )

    @web.middleware
    async def _track(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Mark the connection busy while a request is handled, so neither the idle timer nor a
        newcomer closes it."""
        connection = (
            self._connections.get(request.transport) if request.transport is not None else None
        )
        task = asyncio.current_task()
        if task is not None:
            self._handling.add(task)
        if connection is not None:
            connection.request_started()
        try:
            response: web.StreamResponse = await handler(request)
            return response
        finally:
            if task is not None:
                self._handling.discard(task)
            if connection is not None:
                connection.request_ended()


async def _bound(host: str, port: int, backlog: int) -> list[socket.socket]:
    """Listening sockets on every address ``host`` resolves to, as asyncio's ``create_server`` makes
    them (``SO_REUSEADDR``, IPv6 only on IPv6, its message when an address is taken)."""
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                raise OSError(
                    exc.errno,
                    f"error while attempting to bind on address {address!r}: "
                    f"{(exc.strerror or str(exc)).lower()}",
                ) from None
            sock.listen(backlog)
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets
