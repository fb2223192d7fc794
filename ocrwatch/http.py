"""The one HTTP layer: an aiohttp application on a HOST:PORT, guarded against connection floods.

The metrics/health endpoints and the S3 webhook both listen through ``Listener``. aiohttp parses HTTP; this
module bounds what a peer can hold: at most ``max_connections`` open connections per listener (beyond that a new
connection is closed at once, so a flood on the webhook never takes file descriptors or memory from the rest
of the daemon, nor the health endpoint's own room), and a connection that carries no request for
``idle_timeout`` seconds is closed, whether it never sent one, trickles its head, or sits on keep-alive.
A handler that reads a body bounds that read itself.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog
from aiohttp import web

log = structlog.get_logger()


def host_port(listen: str) -> tuple[str, int]:
    """``127.0.0.1:8787``, ``[::1]:8787`` or ``:8787`` (loopback) → (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"listen must be HOST:PORT, got {listen!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


class _Connection(asyncio.Protocol):
    """One accepted connection: admitted (then handed to aiohttp's request handler) or refused at once.

    Stands between the transport and aiohttp's protocol, so the listener counts open connections exactly and
    closes idle ones without relying on the aiohttp version's own keep-alive handling.
    """

    def __init__(self, listener: Listener) -> None:
        self._listener = listener
        self._inner: asyncio.Protocol | None = None
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._requests = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._inner = self._listener._admit(transport, self)
        if self._inner is None:
            transport.close()
            return
        self._inner.connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
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
        if self._timer is not None:
            self._timer.cancel()
        if self._inner is not None and self._transport is not None:
            self._listener._release(self._transport)
            self._inner.connection_lost(exc)

    # -- idleness: a timer runs only while no request is being handled

    def request_started(self) -> None:
        self._requests += 1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def request_ended(self) -> None:
        self._requests -= 1
        if self._requests == 0:
            self._arm()

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._listener.idle_timeout, self._expire)

    def _expire(self) -> None:
        self._timer = None
        if self._requests == 0 and self._transport is not None:
            log.debug("http_idle_closed", listener=self._listener.name)
            self._transport.close()


class Listener:
    """Serve ``app`` on ``listen`` (``HOST:PORT``; port 0 picks a free one, ``.port`` tells which).

    ``stop`` stops accepting, closes idle connections and gives requests in flight ``shutdown_timeout``
    seconds to answer before they are cancelled. aiohttp's access log stays off: a request line may carry a
    token in its query.
    """

    def __init__(self, app: web.Application, listen: str, *, name: str, max_connections: int = 64,
                 idle_timeout: float = 30.0, shutdown_timeout: float = 2.0) -> None:
        self.host, self._port = host_port(listen)
        self.name = name
        self.max_connections = max_connections
        self.idle_timeout = idle_timeout
        self._connections: dict[asyncio.BaseTransport, _Connection] = {}
        self._refused = 0
        app.middlewares.append(self._track)
        self._runner = web.AppRunner(app, access_log=None, keepalive_timeout=idle_timeout,
                                     shutdown_timeout=shutdown_timeout)
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        await self._runner.setup()
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(lambda: _Connection(self), self.host, self._port)
        except BaseException:  # the address is taken, say: leave nothing set up
            await self._runner.cleanup()
            raise

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
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

    def _admit(self, transport: asyncio.BaseTransport, connection: _Connection) -> asyncio.Protocol | None:
        """aiohttp's protocol for a new connection, or None when the listener is full."""
        server = self._runner.server
        if server is None:  # accepted while the listener stops
            return None
        if len(self._connections) >= self.max_connections:
            if self._refused == 0:
                log.warning("http_connections_full", listener=self.name, max_connections=self.max_connections)
            self._refused += 1
            return None
        if self._refused:
            log.info("http_connections_admitted_again", listener=self.name, refused=self._refused)
            self._refused = 0
        self._connections[transport] = connection
        return server()

    def _release(self, transport: asyncio.BaseTransport) -> None:
        self._connections.pop(transport, None)

    @web.middleware
    async def _track(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Mark the connection busy while a request is handled, so the idle timer leaves it alone."""
        connection = self._connections.get(request.transport) if request.transport is not None else None
        if connection is not None:
            connection.request_started()
        try:
            response: web.StreamResponse = await handler(request)
            return response
        finally:
            if connection is not None:
                connection.request_ended()
