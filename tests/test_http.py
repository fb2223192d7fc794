"""ocrwatch.http: the listener's address parsing, its connection limit and its idle timeout, over real sockets."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from aiohttp import web

from ocrwatch.http import Listener, host_port


def test_host_port() -> None:
    assert host_port("127.0.0.1:8787") == ("127.0.0.1", 8787)
    assert host_port("[::1]:9") == ("::1", 9)
    assert host_port(":0") == ("127.0.0.1", 0)  # no host: loopback, never every interface
    for bad in ("8787", "host:", "host:port"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            host_port(bad)


def app(delay: float = 0.0) -> web.Application:
    async def hello(request: web.Request) -> web.Response:
        await asyncio.sleep(delay)
        return web.Response(text="hello")

    application = web.Application()
    application.router.add_get("/", hello)
    return application


def connect(listener: Listener) -> socket.socket:
    sock = socket.create_connection(listener.address, timeout=10)
    return sock


def get(listener: Listener) -> bytes:
    """One ``GET /`` on a fresh connection; b"" when the listener closed it unanswered."""
    with connect(listener) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return read_all(sock)


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


def closed_within(sock: socket.socket, seconds: float) -> float:
    """How long until the peer closed ``sock`` (fails past ``seconds``)."""
    started = time.monotonic()
    sock.settimeout(seconds)
    read_all(sock)
    return time.monotonic() - started


async def test_port_zero_binds_a_free_port_on_the_given_host() -> None:
    listener = Listener(app(), "127.0.0.1:0", name="test")
    await listener.start()
    try:
        host, port = listener.address
        assert host == "127.0.0.1" and port == listener.port > 0
        assert (await asyncio.to_thread(get, listener)).endswith(b"hello")
    finally:
        await listener.stop()
    with pytest.raises(RuntimeError):
        listener.address  # noqa: B018 - stopped: no address


async def test_connections_beyond_the_limit_are_closed_at_once_and_room_comes_back() -> None:
    listener = Listener(app(), "127.0.0.1:0", name="test", max_connections=3, idle_timeout=30)
    await listener.start()
    held = []
    try:
        held = [await asyncio.to_thread(connect, listener) for _ in range(3)]
        await asyncio.sleep(0.1)
        assert listener.open_connections == 3
        assert await asyncio.to_thread(get, listener) == b""  # refused: closed without an answer
        assert listener.open_connections == 3
        held.pop().close()
        await asyncio.sleep(0.1)
        assert (await asyncio.to_thread(get, listener)).endswith(b"hello")
    finally:
        for sock in held:
            sock.close()
        await listener.stop()


async def test_idle_connections_are_closed_but_a_slow_answer_is_not_cut() -> None:
    listener = Listener(app(delay=1.0), "127.0.0.1:0", name="test", idle_timeout=0.5)
    await listener.start()
    try:
        silent = await asyncio.to_thread(connect, listener)
        trickling = await asyncio.to_thread(connect, listener)
        trickling.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # a head that never ends
        for sock in (silent, trickling):
            assert await asyncio.to_thread(closed_within, sock, 5) < 2
            sock.close()
        started = time.monotonic()
        assert (await asyncio.to_thread(get, listener)).endswith(b"hello")  # handled for 1 s > idle_timeout
        assert time.monotonic() - started >= 1.0

        kept = await asyncio.to_thread(connect, listener)  # keep-alive: idle again after its answer
        kept.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await asyncio.to_thread(closed_within, kept, 5) < 3
        kept.close()
        await asyncio.sleep(0.1)
        assert listener.open_connections == 0
    finally:
        await listener.stop()


async def test_stop_closes_held_connections() -> None:
    listener = Listener(app(), "127.0.0.1:0", name="test", idle_timeout=30)
    await listener.start()
    sock = await asyncio.to_thread(connect, listener)
    await asyncio.sleep(0.1)
    started = time.monotonic()
    await listener.stop()
    assert time.monotonic() - started < 2
    assert await asyncio.to_thread(closed_within, sock, 5) < 1
    sock.close()
