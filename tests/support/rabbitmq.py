"""A real RabbitMQ on 127.0.0.1 for the AMQP tests, started and stopped here.

``RabbitServer`` runs Debian's ``rabbitmq-server`` (``bash tests/install_rabbitmq.sh``) as a node of
its own: its own AMQP port (``RABBITMQ_NODE_PORT``), distribution port (``RABBITMQ_DIST_PORT``) and
epmd (``ERL_EPMD_PORT``, an ``epmd`` started and stopped here), its data and logs in a temporary
folder (``RABBITMQ_MNESIA_BASE``, ``RABBITMQ_LOG_BASE``), no plugins, no system configuration.
Users: ``guest`` (what RGW's push endpoint logs in as without credentials) and ``ocrwatch`` with a
random password, which the daemons use and which must never appear in their logs. It starts in about
6 s, so the fixture is session-scoped, and its tests join the ``rgw`` xdist group: one server per
run. ``restart`` keeps the data (durable queues, persistent messages), as a broker restart does.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest

from tests.support.ports import free_port

SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
DEAD_EXCHANGE = "ocrwatch.dead"


def _password_hash(password: str) -> str:
    """RabbitMQ's ``rabbit_password_hashing_sha256``: base64(salt + sha256(salt + password))."""
    salt = secrets.token_bytes(4)
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


class RabbitServer:
    """One RabbitMQ node in a temporary folder, on free loopback ports."""

    user = "ocrwatch"

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="ocrwatch-rabbitmq-"))
        self.port, self.dist_port, self.epmd_port = free_port(), free_port(), free_port()
        self.password = secrets.token_urlsafe(16)
        self._server: subprocess.Popen[bytes] | None = None
        self._epmd: subprocess.Popen[bytes] | None = None
        self._log = self.dir / "server.log"
        definitions = {
            "users": [
                {
                    "name": name,
                    "password_hash": _password_hash(password),
                    "tags": "administrator",
                    "hashing_algorithm": "rabbit_password_hashing_sha256",
                }
                for name, password in (("guest", "guest"), (self.user, self.password))
            ],
            "vhosts": [{"name": "/"}],
            "permissions": [
                {"user": name, "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}
                for name in ("guest", self.user)
            ],
        }
        (self.dir / "definitions.json").write_text(json.dumps(definitions))
        (self.dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = 127.0.0.1:{self.port}\n"
            f"load_definitions = {self.dir / 'definitions.json'}\n"
            "disk_free_limit.absolute = 10MB\n"
        )
        (self.dir / "enabled_plugins").write_text("[].\n")
        (self.dir / "rabbitmq-env.conf").write_text("")

    @property
    def url(self) -> str:
        """The daemons' URL: the ``ocrwatch`` user and its password."""
        return f"amqp://{self.user}:{self.password}@127.0.0.1:{self.port}/"

    @property
    def push_endpoint(self) -> str:
        """RGW's ``push-endpoint``: no credentials (RGW refuses them over plain HTTP), so
        ``guest``."""
        return f"amqp://127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        d = self.dir
        return {
            **os.environ,
            "HOME": str(d),
            "RABBITMQ_CONF_ENV_FILE": str(d / "rabbitmq-env.conf"),
            "RABBITMQ_NODENAME": f"ocrwatch{self.port}@localhost",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(d / "rabbitmq.pid"),
        }

    def start(self) -> RabbitServer:
        if not SERVER.exists() or shutil.which("epmd") is None:
            pytest.skip("rabbitmq-server not installed: run bash tests/install_rabbitmq.sh")
        env = self._env()
        if self._epmd is None:  # ours, so it is not left behind as the daemon erl would start
            self._epmd = subprocess.Popen(
                ["epmd", "-port", str(self.epmd_port), "-address", "127.0.0.1"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        with open(self._log, "ab") as out:
            self._server = subprocess.Popen(
                [str(SERVER)],
                env=env,
                cwd=self.dir,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self._server.poll() is not None:
                break
            # listening: the broker is about ready
            with (
                suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 0.5),
                suppress(Exception),
            ):
                asyncio.run(self._call(lambda channel: asyncio.sleep(0)))
                return self
            time.sleep(0.2)
        tail = self._log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"rabbitmq-server not ready on port {self.port}:\n{tail}")

    def stop_broker(self) -> None:
        """Stop the node (SIGTERM: a clean shutdown, as ``systemctl stop``); its data stays."""
        pid_file = self.dir / "rabbitmq.pid"
        with suppress(OSError, ValueError):
            pid = int(pid_file.read_text().strip())
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.1)
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self._server is not None:
            with suppress(subprocess.TimeoutExpired):
                self._server.wait(10)
            if self._server.poll() is None:
                self._server.kill()
                self._server.wait()
        self._server = None

    def restart(self) -> None:
        self.stop_broker()
        self.start()

    def stop(self) -> None:
        self.stop_broker()
        if self._epmd is not None:
            self._epmd.terminate()
            self._epmd.wait(10)
            self._epmd = None
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- a client for the tests (aio-pika, as the daemon's)

    async def _call(self, work: Any) -> Any:
        import aio_pika

        connection = await aio_pika.connect(self.url, timeout=5)
        try:
            channel = await connection.channel()
            return await work(channel)
        finally:
            await connection.close()

    def run(self, work: Any) -> Any:
        """``await work(channel)`` on a connection of its own, from synchronous test code."""
        return asyncio.run(self._call(work))

    def queue_with_dead_letters(self, queue: str, exchange: str, routing_key: str = "#") -> str:
        """The guide's recipe (docs/guide.md, RabbitMQ): ``exchange`` (topic) routes
        ``routing_key`` to the quorum queue ``queue``, whose dead letters go to ``DEAD_EXCHANGE``
        (fanout) and its queue ``queue.dead``."""
        import aio_pika

        async def declare(channel: Any) -> None:
            dead = await channel.declare_exchange(
                DEAD_EXCHANGE, aio_pika.ExchangeType.FANOUT, durable=True
            )
            dead_queue = await channel.declare_queue(f"{queue}.dead", durable=True)
            await dead_queue.bind(dead)
            events = await channel.declare_exchange(
                exchange, aio_pika.ExchangeType.TOPIC, durable=True
            )
            main = await channel.declare_queue(
                queue,
                durable=True,
                arguments={"x-queue-type": "quorum", "x-dead-letter-exchange": DEAD_EXCHANGE},
            )
            await main.bind(events, routing_key=routing_key)

        self.run(declare)
        return f"{queue}.dead"

    def depth(self, queue: str) -> tuple[int, int]:
        """(messages ready, consumers) of ``queue``."""

        async def count(channel: Any) -> tuple[int, int]:
            state = (await channel.declare_queue(queue, passive=True)).declaration_result
            return state.message_count, state.consumer_count

        return tuple(self.run(count))  # type: ignore[return-value]

    def publish(self, exchange: str, body: bytes, routing_key: str = "test") -> None:
        import aio_pika

        async def send(channel: Any) -> None:
            target = await channel.get_exchange(exchange)
            await target.publish(
                aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key=routing_key,
            )

        self.run(send)

    def bounce(self, queue: str, times: int) -> None:
        """Take the first message of ``queue`` and put it back ``times`` times, as consumers that
        died on it would have: a quorum queue counts each in ``x-delivery-count``."""

        async def bounce(channel: Any) -> None:
            source = await channel.declare_queue(queue, passive=True)
            for _ in range(times):
                message = None
                for _ in range(100):
                    message = await source.get(no_ack=False, fail=False)
                    if message is not None:
                        break
                    await asyncio.sleep(0.1)
                assert message is not None, f"no message in {queue}"
                await message.nack(requeue=True)

        self.run(bounce)

    def take(self, queue: str) -> list[bytes]:
        """Every message ready in ``queue``, acknowledged."""

        async def drain(channel: Any) -> list[bytes]:
            source = await channel.declare_queue(queue, passive=True)
            bodies = []
            while (message := await source.get(no_ack=True, fail=False)) is not None:
                bodies.append(message.body)
            return bodies

        return list(self.run(drain))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist the tests that use ``rabbitmq`` join the ``rgw`` group: one worker, one
    broker (and the RGW cluster its tests push through)."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if "rabbitmq" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("rgw"))


@pytest.fixture(scope="session")
def rabbitmq() -> Iterator[RabbitServer]:
    """One RabbitMQ for the session; skipped where it is not installed."""
    server = RabbitServer()
    try:
        yield server.start()
    finally:
        server.stop()
