"""ocrwatch.infra.http: the listener's address parsing, its connection limit and its idle timeout,
over real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from aiohttp import web
from structlog.testing import capture_logs

from ocrwatch.infra.http import Listener, connection_cap, host_port

REPO = Path(__file__).resolve().parents[1]


async def until(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Wait for what the listener's own task does in its time, however loaded the machine."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


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


FLOOD = """
import collections, json, socket, sys, threading
host, port, threads, method, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:6]
body = b'{"Records": []}' if method == "POST" else b""
close = "Connection: close\\r\\n" if method == "GET" else ""  # a POST must be closed unasked
ask = f"{method} {path} HTTP/1.1\\r\\nHost: x\\r\\n{close}Content-Length: {len(body)}\\r\\n\\r\\n"
ask = ask.encode() + body
tally, lock, stop = collections.Counter(), threading.Lock(), threading.Event()

def one():
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(ask)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer[9:12].decode() if answer.startswith(b"HTTP/1.1 ") else "closed unanswered"

def keep_asking():
    while not stop.is_set():
        try:
            said = one()
        except socket.timeout:
            said = "kept open"
        except ConnectionResetError:
            said = "reset"
        except OSError as exc:
            said = type(exc).__name__
        with lock:
            tally[said] += 1

workers = [threading.Thread(target=keep_asking) for _ in range(threads)]
for worker in workers:
    worker.start()
print("flooding", flush=True)
sys.stdin.read()
stop.set()
for worker in workers:
    worker.join()
print(json.dumps(tally), flush=True)
"""
"""A flood from another process (the GIL stays the listener's): ``threads`` connections at a time,
each one request (``method path``, no token; a small JSON body for a POST, ``Connection: close``
for a GET), read to its end; the
tally of what came back: the status, ``closed unanswered``, ``reset`` or ``kept open`` (not closed
within 10 s)."""


class Flood:
    """``FLOOD`` from a child process until ``stop``, which returns the tally. Both block: an async
    test calls them through ``asyncio.to_thread``, so that its listener answers meanwhile."""

    def __init__(
        self, address: tuple[str, int], threads: int, method: str = "GET", path: str = "/"
    ) -> None:
        host, port = address
        self._child = subprocess.Popen(
            [sys.executable, "-c", FLOOD, host, str(port), str(threads), method, path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._child.stdout is not None
        assert self._child.stdout.readline().strip() == "flooding"

    def stop(self) -> dict[str, int]:
        assert self._child.stdin is not None and self._child.stdout is not None
        self._child.stdin.close()
        said = self._child.stdout.read()
        self._child.wait(60)
        tally: dict[str, int] = json.loads(said)
        return tally


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


async def test_a_full_listener_closes_its_longest_idle_connection_for_a_newcomer() -> None:
    """Idle connections cannot lock a real request out: the one quiet the longest makes room."""
    listener = Listener(app(), "127.0.0.1:0", name="test", max_connections=3, idle_timeout=30)
    await listener.start()
    held: list[socket.socket] = []
    try:
        with capture_logs() as logs:
            for count in range(1, 4):
                held.append(await asyncio.to_thread(connect, listener))
                await until(
                    lambda count=count: listener.open_connections == count, f"{count} connections"
                )
                await asyncio.sleep(0.05)
            # the oldest stirs: the second is now the quietest
            held[0].sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
            await asyncio.sleep(0.1)
            assert listener.open_connections == 3
            for _ in range(5):
                assert (await asyncio.to_thread(get, listener)).endswith(b"hello")
            assert await asyncio.to_thread(closed_within, held[1], 5) < 1
            assert listener.open_connections <= 3
            for sock in held:
                sock.close()
            await until(
                lambda: any(entry["event"] == "http_connections_relieved" for entry in logs),
                "the episode's end, a second after the listener was last full",
            )
        full = [entry for entry in logs if entry["event"] == "http_connections_full"]
        # once per episode, not per connection
        assert len(full) == 1 and full[0]["max_connections"] == 3
        relieved = [entry for entry in logs if entry["event"] == "http_connections_relieved"]
        assert len(relieved) == 1 and relieved[0]["evicted"] >= 1 and relieved[0]["refused"] == 0
    finally:
        for sock in held:
            sock.close()
        await listener.stop()


async def test_a_full_listener_of_busy_connections_refuses_a_newcomer_until_one_ends() -> None:
    listener = Listener(
        app(delay=1.5), "127.0.0.1:0", name="test", max_connections=3, idle_timeout=30
    )
    await listener.start()
    try:
        busy = [asyncio.create_task(asyncio.to_thread(get, listener)) for _ in range(3)]
        await until(lambda: listener.open_connections == 3, "three busy connections")
        # every connection is answering: refused at once
        assert await asyncio.to_thread(get, listener) == b""
        assert all(answer.endswith(b"hello") for answer in await asyncio.gather(*busy))
        await asyncio.sleep(0.1)
        assert (await asyncio.to_thread(get, listener)).endswith(b"hello")
    finally:
        await listener.stop()


async def test_a_flood_of_requests_is_answered_at_the_listeners_pace_none_closed_unread() -> None:
    """Connections that each carry a request, many more at once than the listener holds: it stops
    accepting while those it holds are new, so each is read and answered in its turn and a sender
    among them gets in. asyncio's server accepted a whole backlog at once, each newcomer closing
    one accepted just before, unread."""
    listener = Listener(app(), "127.0.0.1:0", name="test", max_connections=4, idle_timeout=30)
    await listener.start()
    flood = await asyncio.to_thread(Flood, listener.address, 32)
    try:
        await asyncio.sleep(1.0)
        for _ in range(5):
            assert (await asyncio.to_thread(get, listener)).endswith(b"hello")
        await asyncio.sleep(1.0)
    finally:
        tally = await asyncio.to_thread(flood.stop)
        await listener.stop()
    print(f"32 connections at a time to a listener of 4: {tally}")
    assert tally.get("200", 0) > 100
    assert tally.get("closed unanswered", 0) + tally.get("reset", 0) <= tally["200"] // 20


def test_the_connection_cap_follows_the_descriptor_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
        assert (connection_cap(64), connection_cap(32), connection_cap(3)) == (64, 32, 3)
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        assert Listener(app(), "127.0.0.1:0", name="test", max_connections=64).max_connections == 16
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


EXHAUSTED_CHILD = """
import asyncio, os, resource, sys
from aiohttp import web
from ocrwatch.infra import logging as ocrlog
from ocrwatch.config import LogConfig
from ocrwatch.infra.http import Listener

async def main():
    ocrlog.configure(LogConfig(format="json"), sys.stdout)
    application = web.Application()
    application.router.add_get("/", lambda request: web.Response(text="hello"))
    listener = Listener(application, "127.0.0.1:0", name="test")
    await listener.start()
    # Its thread exists before descriptors run out.
    await asyncio.get_running_loop().run_in_executor(None, int)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    hogs = []
    try:
        while True:
            hogs.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    print("PORT", listener.port, flush=True)
    # "free" from the parent:
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    for fd in hogs:
        os.close(fd)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # "stop"
    await listener.stop()

asyncio.run(main())
"""


def test_accept_out_of_descriptors_is_logged_once_and_recovers() -> None:
    """asyncio logs a traceback at every accept retry when descriptors run out; the listener logs
    one line."""
    child = subprocess.Popen(
        [sys.executable, "-c", EXHAUSTED_CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        port = int(child.stdout.readline().split()[1])
        deadline = time.monotonic() + 3.5  # three retries or more
        attempts = []
        while time.monotonic() < deadline:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                sock.settimeout(0.5)
                with contextlib.suppress(OSError):
                    attempts.append(sock.recv(100))
        child.stdin.write("free\n")
        child.stdin.flush()
        answered = b""
        for _ in range(50):  # asyncio tries again a second after the failure
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                sock.settimeout(5)
                answered = read_all(sock)
            if answered:
                break
            time.sleep(0.1)
        assert answered.endswith(b"hello")
        child.stdin.write("stop\n")
        child.stdin.flush()
        output = child.communicate(timeout=30)[0]
    finally:
        child.kill()
        child.wait()
    lines = output.splitlines()
    assert "Traceback" not in output, output
    assert sum('"http_accept_exhausted"' in line for line in lines) == 1, output
    assert sum('"http_accept_recovered"' in line for line in lines) == 1, output
    assert not any(b"hello" in answer for answer in attempts)  # it really was out of descriptors


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
        # handled for 1 s > idle_timeout
        assert (await asyncio.to_thread(get, listener)).endswith(b"hello")
        assert time.monotonic() - started >= 1.0

        kept = await asyncio.to_thread(connect, listener)  # keep-alive: idle again after its answer
        kept.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await asyncio.to_thread(closed_within, kept, 5) < 3
        kept.close()
        await until(lambda: listener.open_connections == 0, "every connection closed")
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


async def test_stop_cancels_a_request_still_in_flight_after_shutdown_timeout() -> None:
    """A handler awaiting a shielded step (the webhook's ledger submit) is cancelled once
    ``shutdown_timeout`` has passed, within ``stop``: aiohttp alone would wait twice as long and
    leave it pending."""
    outcome: list[str] = []

    async def stuck(request: web.Request) -> web.Response:
        outcome.append("started")
        try:
            await asyncio.shield(asyncio.sleep(30))
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise
        return web.Response(text="late")

    application = web.Application()
    application.router.add_get("/", stuck)
    listener = Listener(application, "127.0.0.1:0", name="test", shutdown_timeout=2.0)
    await listener.start()
    answer = asyncio.create_task(asyncio.to_thread(get, listener))
    for _ in range(100):
        if outcome:
            break
        await asyncio.sleep(0.05)
    started = time.monotonic()
    await listener.stop()
    stopped_in = time.monotonic() - started
    assert outcome == ["started", "cancelled"]
    assert stopped_in < 3.5, stopped_in  # aiohttp alone: 4 s
    assert await answer == b""
