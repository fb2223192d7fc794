"""Real S3-compatible servers on 127.0.0.1 for the S3 tests, started and stopped here.

- ``MotoServer``: ``moto_server`` in a subprocess (S3 + SQS, the AWS event shape). It keeps its
  state in memory, so ``restart`` on the same port models an outage after which buckets and queues
  must be made again.
- ``RgwServer``: a throwaway one-node Ceph (one monitor, one in-memory OSD, no auth) and a real
  ``radosgw``, credentials ``testing``/``testing``, region ``default``, path-style. It starts in
  about 12 s, so the fixture is session-scoped; it pushes S3-format events over HTTP (SNS topic with
  a ``push-endpoint``).

Fixtures: ``moto_server`` (session), ``moto`` (that server, wiped before the test), ``rgw``
(session; skipped with the reason where ``radosgw`` is not installed: ``bash
tests/install_s3_servers.sh`` installs it). Under pytest-xdist each is one per worker, on that
worker's own ports (``tests.support.ports``) and in a folder of its own; the tests that use ``rgw``
are
grouped onto one worker: one cluster serves them. A test module uses them with ``pytest_plugins =
["tests.support.s3servers"]``. PYTEST_DONT_REWRITE (no asserts here, and test modules import it
before
pytest registers it as a plugin).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config as BotoConfig

from tests.support.ports import free_port

MOTO_ACCOUNT = "123456789012"


def _wait_http(url: str, timeout: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with suppress(OSError), urllib.request.urlopen(url, timeout=1):
            return
        time.sleep(0.1)
    tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
    raise RuntimeError(f"{what} not ready at {url} within {timeout} s\n{tail}")


class MotoServer:
    """``moto_server -H 127.0.0.1 -p PORT`` as a subprocess."""

    region = "us-east-1"

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen[bytes] | None = None
        self._log = Path(tempfile.mkstemp(prefix="moto-", suffix=".log")[1])

    def start(self) -> MotoServer:
        binary = shutil.which("moto_server")
        if binary is None:
            pytest.skip("moto_server not installed: pip install 'moto[server]'")
        with open(self._log, "ab") as out:
            self._process = subprocess.Popen(
                [binary, "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _wait_http(f"{self.endpoint}/moto-api/", 30, "moto_server", self._log)
        return self

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None
        self._log.unlink(missing_ok=True)

    def reset(self) -> None:
        urllib.request.urlopen(
            urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST"), timeout=10
        )

    def client(self, service: str) -> Any:
        return boto3.client(
            service,
            endpoint_url=self.endpoint,
            region_name=self.region,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def s3_config(self, **overrides: Any) -> dict[str, Any]:
        """The ``[[s3]]`` keys that reach this server (merge with test-specific ones)."""
        return {
            "endpoint_url": self.endpoint,
            "region": self.region,
            "access_key_id": "testing",
            "secret_access_key": "testing",
            **overrides,
        }

    def bucket_with_queue(self, bucket: str, queue: str, *, visibility: int = 30) -> str:
        """Make ``bucket`` announce created objects to a new queue ``queue``; return the queue
        URL."""
        s3, sqs = self.client("s3"), self.client("sqs")
        s3.create_bucket(Bucket=bucket)
        url = sqs.create_queue(QueueName=queue, Attributes={"VisibilityTimeout": str(visibility)})[
            "QueueUrl"
        ]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        s3.put_bucket_notification_configuration(
            Bucket=bucket,
            NotificationConfiguration={
                "QueueConfigurations": [{"QueueArn": arn, "Events": ["s3:ObjectCreated:*"]}]
            },
        )
        return str(url)


class RgwServer:
    """A one-node Ceph cluster with ``radosgw``, all in a temporary folder, on free loopback
    ports."""

    region = "default"
    access_key = secret_key = "testing"

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="ocrwatch-rgw-"))
        self.port = free_port()
        self.mon_port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.conf = self.dir / "ceph.conf"

    def _run(self, *argv: str, timeout: float = 60, attempts: int = 1) -> None:
        """Run a Ceph tool; ``attempts`` > 1 where a young monitor may refuse (it briefly answers
        'wrong fsid')."""
        for attempt in range(attempts):
            result = subprocess.run(argv, capture_output=True, timeout=timeout, check=False)
            if result.returncode == 0:
                return
            time.sleep(0.5 * (attempt + 1))
        raise RuntimeError(
            f"{' '.join(argv)} failed ({result.returncode}): "
            f"{result.stderr.decode(errors='replace')[-2000:]}"
        )

    def start(self) -> RgwServer:
        d, fsid = self.dir, str(uuid.uuid4())
        for sub in ("run", "log", "mon.a", "osd.0", "rgw.a"):
            (d / sub).mkdir()
        mon = f"v1:127.0.0.1:{self.mon_port}"
        self.conf.write_text(f"""[global]
fsid = {fsid}
mon host = {mon}
public addr = 127.0.0.1
ms bind msgr2 = false
auth cluster required = none
auth service required = none
auth client required = none
run dir = {d}/run
admin socket = {d}/run/$name.asok
log file = {d}/log/$name.log
keyring = {d}/keyring
osd objectstore = memstore
memstore device bytes = 1073741824
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd crush chooseleaf type = 0
mon allow pool size one = true
mon max pg per osd = 1000
mon warn on pool no redundancy = false
[mon.a]
mon data = {d}/mon.a
[osd.0]
osd data = {d}/osd.0
[client.rgw.a]
rgw frontends = beast endpoint=127.0.0.1:{self.port}
rgw data = {d}/rgw.a
""")
        c = ("-c", str(self.conf))
        self._run(
            "ceph-authtool",
            "--create-keyring",
            f"{d}/keyring",
            "--gen-key",
            "-n",
            "mon.",
            "--cap",
            "mon",
            "allow *",
        )
        self._run("monmaptool", "--create", "--fsid", fsid, "--add", "a", mon, f"{d}/monmap")
        self._run(
            "ceph-mon",
            *c,
            "--mkfs",
            "-i",
            "a",
            "--monmap",
            f"{d}/monmap",
            "--keyring",
            f"{d}/keyring",
        )
        self._run("ceph-mon", *c, "-i", "a", "--pid-file", f"{d}/run/mon.pid")  # daemonizes
        self._run("ceph", *c, "osd", "create", timeout=30, attempts=5)
        self._run("ceph-osd", *c, "-i", "0", "--mkfs")
        self._run("ceph-osd", *c, "-i", "0", "--pid-file", f"{d}/run/osd.pid", attempts=5)
        self.start_gateway()
        self._run(
            "radosgw-admin",
            *c,
            "user",
            "create",
            "--uid=test",
            "--display-name=test",
            f"--access-key={self.access_key}",
            f"--secret={self.secret_key}",
        )
        return self

    def start_gateway(self) -> None:
        """Start (or restart, after ``stop_gateway``) radosgw alone: the cluster behind it keeps the
        data."""
        self._run(
            "radosgw",
            "-c",
            str(self.conf),
            "-n",
            "client.rgw.a",
            "--pid-file",
            f"{self.dir}/run/rgw.pid",
        )
        _wait_http(f"{self.endpoint}/", 60, "radosgw", self.dir / "log" / "client.rgw.a.log")

    def stop_gateway(self) -> None:
        """Kill radosgw (as a crash would); the monitor and OSD keep the data for
        ``start_gateway``."""
        self._kill(["rgw"], signal.SIGKILL)

    def stop(self) -> None:
        self._kill(["rgw", "osd", "mon"], signal.SIGKILL)  # a throwaway cluster: nothing to flush
        shutil.rmtree(self.dir, ignore_errors=True)

    def _kill(self, daemons: list[str], how: signal.Signals = signal.SIGTERM) -> None:
        pids = []
        for daemon in daemons:
            pid_file = self.dir / "run" / f"{daemon}.pid"
            with suppress(OSError, ValueError):
                pids.append(int(pid_file.read_text().strip()))
                pid_file.unlink()
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, how)
        deadline = time.monotonic() + 20
        while pids and time.monotonic() < deadline:
            pids = [pid for pid in pids if _alive(pid)]
            time.sleep(0.2)
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def client(self, service: str) -> Any:
        return boto3.client(
            service,
            endpoint_url=self.endpoint,
            region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=BotoConfig(s3={"addressing_style": "path"}),
        )

    def s3_config(self, **overrides: Any) -> dict[str, Any]:
        return {
            "endpoint_url": self.endpoint,
            "region": self.region,
            "access_key_id": self.access_key,
            "secret_access_key": self.secret_key,
            "addressing_style": "path",
            **overrides,
        }

    def bucket_with_webhook(
        self, bucket: str, push_endpoint: str, *, persistent: bool = False
    ) -> None:
        """Make ``bucket`` POST created-object events to ``push_endpoint`` (an SNS topic with a push
        endpoint).

        ``persistent``: RGW queues the events and resends until the endpoint answers 2xx; otherwise
        the upload waits for the endpoint's answer and an event that fails is lost.
        """
        s3 = self.client("s3")
        s3.create_bucket(Bucket=bucket)
        attributes = {
            "push-endpoint": push_endpoint,
            "persistent": "true" if persistent else "false",
        }
        topic = self.client("sns").create_topic(Name=f"{bucket}-events", Attributes=attributes)[
            "TopicArn"
        ]
        s3.put_bucket_notification_configuration(
            Bucket=bucket,
            NotificationConfiguration={
                "TopicConfigurations": [
                    {"Id": "ocrwatch", "TopicArn": topic, "Events": ["s3:ObjectCreated:*"]}
                ]
            },
        )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with suppress(ChildProcessError):  # reap it if it was our child
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    return True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``--dist loadgroup``, through ``tests.support.xdist_groups``) send every
    test
    that uses ``rgw`` to one worker: each would otherwise start a cluster of its own (about 12 s
    each)."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        callspec = getattr(item, "callspec", None)  # a parameter may name it for getfixturevalue
        named = "rgw" in callspec.params.values() if callspec is not None else False
        if named or "rgw" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("rgw"))


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    server = MotoServer().start()
    yield server
    server.stop()


@pytest.fixture
def moto(moto_server: MotoServer) -> MotoServer:
    """The session's moto_server, wiped before the test."""
    moto_server.reset()
    return moto_server


@pytest.fixture(scope="session")
def rgw() -> Iterator[RgwServer]:
    """One Ceph RGW for the session; skipped where radosgw is not installed."""
    missing = [
        tool for tool in ("radosgw", "ceph-mon", "ceph-osd", "ceph") if shutil.which(tool) is None
    ]
    if missing:
        pytest.skip(
            f"Ceph RGW not installed ({', '.join(missing)} missing): run bash "
            "tests/install_s3_servers.sh"
        )
    server = RgwServer()
    try:
        yield server.start()
    finally:
        server.stop()
