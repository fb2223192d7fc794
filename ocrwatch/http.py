"""The one HTTP layer: an aiohttp application on a HOST:PORT, guarded against connection floods.

The metrics/health endpoints and the S3 webhook both listen through ``Listener``. aiohttp parses
HTTP; this module bounds what a peer can hold, so a flood on one listener never takes file
descriptors or memory from the rest of the daemon (the inbox watcher, the ledger, the engine), nor
another listener's room:

- at most ``max_connections`` open connections per listener, and never more than a sixteenth of the
  process's descriptor limit (``RLIMIT_NOFILE``): all listeners together stay far from it, so
  ``accept()`` never meets ``EMFILE`` because of them;
- a listener that is full closes its least recently active connection that has no request in flight
  to admit a new one (refusing the new one only when every connection is busy), so idle connections
  cannot lock out a real request;
- a connection that carries no request for ``idle_timeout`` seconds is closed, whether it never sent
  one, trickles its head, or sits on keep-alive: aiohttp's own ``keepalive_timeout`` (measured on
  3.14).

A full listener is logged once per episode, not per connection; so is an ``accept()`` that fails for
want of descriptors (asyncio would log a traceback per attempt). A handler that reads a body bounds
that read itself.
"""

from __future__ import annotations

import asyncio
import errno
import resource
from typing import Any

import structlog
from aiohttp import web

log = structlog.get_logger()

DESCRIPTOR_SHARE = 16
"""A listener holds at most 1/16 of the soft descriptor limit (64 of systemd's default 1024), its
accept backlog as much again."""

MIN_CONNECTIONS = 4
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

    # -- busy while a request is handled: never the one evicted

    def request_started(self) -> None:
        self.requests += 1

    def request_ended(self) -> None:
        self.requests -= 1
        self.last_active = asyncio.get_running_loop().time()


class Listener:
    """Serve ``app`` on ``listen`` (``HOST:PORT``; port 0 picks a free one, ``.port`` tells which).

    ``max_connections`` is what the caller wants; ``connection_cap`` bounds it by the descriptor
    limit. ``stop`` stops accepting, closes idle connections and gives requests in flight
    ``shutdown_timeout`` seconds in all to answer before they are cancelled. aiohttp's access log
    stays off: a request line may carry a token in its query.
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
        self._episode: dict[str, int] | None = None  # while full: connections evicted and refused
        self._exhausted = False  # accept() failed for want of descriptors, not yet recovered
        app.middlewares.append(self._track)
        self._runner = web.AppRunner(
            app, access_log=None, keepalive_timeout=idle_timeout, shutdown_timeout=shutdown_timeout
        )
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        await self._runner.setup()
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(
                lambda: _Connection(self), self.host, self._port, backlog=self.max_connections
            )
        except BaseException:  # the address is taken, say: leave nothing set up
            await self._runner.cleanup()
            raise
        _AcceptErrors.install(loop).listeners.add(self)

    async def stop(self) -> None:
        if self._server is None:
            return
        _AcceptErrors.install(asyncio.get_running_loop()).listeners.discard(self)
        self._server.close()
        if (
            self._handling
        ):  # aiohttp would wait twice as long, and not cancel a handler awaiting a shield
            await asyncio.wait(set(self._handling), timeout=self.shutdown_timeout)
            for task in self._handling:
                task.cancel()
        await self._runner.cleanup()
        await self._server.wait_closed()
        self._server = None

    @property
    def address(self) -> tuple[str, int]:
        """The bound address (the real port when ``listen`` asked for port 0)."""
        if self._server is None:
            raise RuntimeError(f"{self.name} is not listening")
        host, port = self._server.sockets[0].getsockname()[:2]
        return str(host), int(port)

    @property
    def port(self) -> int:
        return self.address[1]

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    def _admit(
        self, transport: asyncio.BaseTransport, connection: _Connection
    ) -> asyncio.Protocol | None:
        """aiohttp's protocol for a new connection, after making room if the listener is full; None
        when every connection is busy."""
        server = self._runner.server
        if server is None:  # accepted while the listener stops
            return None
        if self._exhausted:
            self._exhausted = False
            log.info("http_accept_recovered", listener=self.name)
        if len(self._connections) >= self.max_connections:
            episode = self._full()
            victim = min(
                (c for c in self._connections.values() if c.requests == 0),
                key=lambda c: c.last_active,
                default=None,
            )
            if victim is None:
                episode["refused"] += 1
                return None
            episode["evicted"] += 1
            victim.close()
            self._release(victim.transport)
        self._connections[transport] = connection
        return server()

    def _full(self) -> dict[str, int]:
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
        if self._episode is not None and len(self._connections) <= self.max_connections // 2:
            log.info("http_connections_relieved", listener=self.name, **self._episode)
            self._episode = None

    def _owns(self, sock: Any) -> bool:
        return self._server is not None and any(
            own.fileno() == sock.fileno() for own in self._server.sockets
        )

    def _accept_failed(self, exc: BaseException | None) -> None:
        """``accept()`` met a descriptor limit; asyncio retries every second. Logged once until it
        recovers."""
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


class _AcceptErrors:
    """The loop's exception handler, wrapped once per loop: asyncio reports an ``accept()`` that
    failed for want of descriptors there, with a traceback, at every retry; the listener concerned
    logs it once instead."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.listeners: set[Listener] = set()
        self._previous = loop.get_exception_handler()

    @classmethod
    def install(cls, loop: asyncio.AbstractEventLoop) -> _AcceptErrors:
        owner = getattr(loop.get_exception_handler(), "__self__", None)
        if isinstance(owner, cls):
            return owner
        errors = cls(loop)
        loop.set_exception_handler(errors.handle)
        return errors

    def handle(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc, sock = context.get("exception"), context.get("socket")
        if isinstance(exc, OSError) and exc.errno in _EXHAUSTED and sock is not None:
            for listener in self.listeners:
                if listener._owns(sock):
                    listener._accept_failed(exc)
                    return
        if self._previous is not None:
            self._previous(loop, context)
        else:
            loop.default_exception_handler(context)
