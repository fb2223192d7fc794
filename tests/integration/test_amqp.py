"""``ocrwatch run`` with ``transport = "amqp"``: Ceph RGW publishes bucket notifications to a real
RabbitMQ (``push-endpoint=amqp://…``, ``amqp-exchange``, ``amqp-ack-level=broker``), real
Tesseract."""

from __future__ import annotations

import json
import re
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import DaemonProcess, wait_until
from tests.support import docs
from tests.support.rabbitmq import DEAD_EXCHANGE, RabbitServer
from tests.support.s3servers import RgwServer

pytestmark = [pytest.mark.integration, pytest.mark.s3]

URL_ENV = "OCRWATCH_S3_0_URL"  # [[s3]] url from the environment: no password in the file
EXCHANGE = "ocrwatch.s3"
"""One exchange for every bucket, routed by topic name: RGW (pacific) keeps one AMQP connection per
push endpoint, bound to the first exchange named with it ("AMQP connect: exchange mismatch")."""


def sidecar(client: Any, bucket: str, key: str) -> dict[str, Any] | None:
    try:
        return json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    except client.exceptions.NoSuchKey:
        return None


def bucket_with_amqp(rgw: RgwServer, rabbitmq: RabbitServer, bucket: str) -> str:
    """Make ``bucket`` publish created-object events to ``EXCHANGE`` (an SNS topic on RGW with an
    AMQP push endpoint, acknowledged by the broker before the upload is answered); the topic's
    name, which is the routing key RGW publishes with."""
    s3 = rgw.client("s3")
    s3.create_bucket(Bucket=bucket)
    attributes = {
        "push-endpoint": rabbitmq.push_endpoint,
        "amqp-exchange": EXCHANGE,
        "amqp-ack-level": "broker",
        "persistent": "false",
    }
    sns = rgw.client("sns")
    topic = sns.create_topic(Name=topic_of(bucket), Attributes=attributes)["TopicArn"]
    s3.put_bucket_notification_configuration(
        Bucket=bucket,
        NotificationConfiguration={
            "TopicConfigurations": [
                {"Id": "ocrwatch", "TopicArn": topic, "Events": ["s3:ObjectCreated:*"]}
            ]
        },
    )
    return topic_of(bucket)


def topic_of(bucket: str) -> str:
    return f"{bucket}-amqp"


def amqp_daemon(
    root: Path, rgw: RgwServer, rabbitmq: RabbitServer, queue: str, bucket: str, **s3_keys: Any
) -> DaemonProcess:
    """A daemon consuming ``queue``, bound to ``EXCHANGE`` with the routing key of ``bucket``'s
    topic."""
    s3 = rgw.s3_config(
        transport="amqp",
        queue=queue,
        exchange=EXCHANGE,
        routing_key=topic_of(bucket),
        **s3_keys,
    )
    return DaemonProcess(root, s3=[s3]).start(env={URL_ENV: rabbitmq.url})


def events(daemon: DaemonProcess, name: str) -> list[dict[str, Any]]:
    return [event for event in daemon.events() if event.get("event") == name]


def metric(daemon: DaemonProcess, event: str) -> float:
    found = re.search(
        rf'ocrwatch_amqp_messages_total{{event="{event}",source="s3:0"}} (\S+)', daemon.metrics()
    )
    return float(found.group(1)) if found else 0.0


def test_uploads_to_sidecars_through_rabbitmq_and_a_poison_message_is_dead_lettered(
    rgw: RgwServer, rabbitmq: RabbitServer, tmp_path: Path
) -> None:
    """Tricky keys through RGW → RabbitMQ → ocrwatch; a message bounced past ``max_receives`` gets
    its error sidecar and lands in the dead-letter queue while the others flow; messages of no
    use are acknowledged; a second upload of the same bytes is recognised by its ETag."""
    bucket = queue = "amqp-docs"
    dead_queue = rabbitmq.queue_with_dead_letters(queue, EXCHANGE, topic_of(bucket))
    topic = bucket_with_amqp(rgw, rabbitmq, bucket)
    s3 = rgw.client("s3")
    page = docs.write_png(
        tmp_path / "page.png", ["Document AMQP", "Quarterly report invoice"]
    ).read_bytes()
    s3.put_object(Bucket=bucket, Key="in/poison.png", Body=page)
    rabbitmq.bounce(queue, 2)  # two consumers died on it
    rabbitmq.publish(EXCHANGE, b"not json at all", topic)
    rabbitmq.publish(
        EXCHANGE, json.dumps({"Service": "Amazon S3", "Event": "s3:TestEvent"}).encode(), topic
    )
    # under archive_prefix: no document
    s3.put_object(Bucket=bucket, Key="archive/old.png", Body=page)

    daemon = amqp_daemon(
        tmp_path, rgw, rabbitmq, queue, bucket, max_receives=2, archive_prefix="archive/"
    )
    try:
        error = wait_until(
            lambda: sidecar(s3, bucket, "in/poison.png.error.json"),
            60,
            "the poison's error sidecar",
        )
        assert error["error"]["kind"] == "too_many_deliveries" and error["attempts"] == 3
        keys = [
            "inbox/first.png",
            "inbox/a+b c é.png",
            "scans/Report é+1.png",
            "odd/100% sure;x=1.png",
        ]
        bodies = {  # bytes of their own: a copy of done bytes would take that result, unrun
            key: docs.write_png(
                tmp_path / f"{n}.png", [f"Document {n}", "Quarterly report invoice"]
            ).read_bytes()
            for n, key in enumerate(keys)
        }
        for key, body in bodies.items():
            s3.put_object(Bucket=bucket, Key=key, Body=body)
        for key in keys:
            document = wait_until(
                lambda key=key: sidecar(s3, bucket, f"{key}.json"), 60, f"sidecars of {key}"
            )
            assert document["source"]["uri"] == f"s3://{bucket}/{key}"
            body = s3.get_object(Bucket=bucket, Key=f"{key}.md")["Body"].read().decode()
            assert "quarterly report" in body.lower()
        dead = wait_until(lambda: rabbitmq.take(dead_queue), 30, "the poison message dead-lettered")
        assert [r["s3"]["object"]["key"] for r in json.loads(dead[0])["Records"]] == [
            "in/poison.png"
        ]

        s3.put_object(Bucket=bucket, Key=keys[0], Body=bodies[keys[0]])  # again: done already
        wait_until(lambda: events(daemon, "job_already_done"), 30, "the duplicate recognised")
        wait_until(lambda: rabbitmq.depth(queue) == (0, 1), 30, "the queue drained")
        started = Counter(e["uri"] for e in events(daemon, "job_started"))
        assert started == Counter({f"s3://{bucket}/{key}": 1 for key in keys})
        assert sidecar(s3, bucket, "archive/old.png.json") is None
        assert any(e.get("reason") == "archive_prefix" for e in events(daemon, "s3_event_ignored"))
        assert any(
            "Expecting value" in str(e.get("reason")) for e in events(daemon, "s3_message_ignored")
        )
        assert metric(daemon, "dead_lettered") == 1
        assert metric(daemon, "redelivered") >= 1
        # each document, the duplicate, the test event, the garbage (and the sidecars' events)
        assert metric(daemon, "acknowledged") >= len(keys) + 1 + 2
        assert rabbitmq.password not in daemon.log_text()
    finally:
        daemon.stop()


def test_two_daemons_share_fifty_documents_through_a_kill_and_a_broker_restart(
    rgw: RgwServer, rabbitmq: RabbitServer, tmp_path: Path
) -> None:
    """Two daemons on one queue (declared by them); ``kill -9`` of the one working on a long PDF:
    the other finishes it; then RabbitMQ restarts mid-run and the survivor reconnects. Each of the
    50 documents is done exactly once, and both daemons took work."""
    bucket = queue = "amqp-fifty"
    daemons = {
        name: amqp_daemon(
            tmp_path / name,
            rgw,
            rabbitmq,
            queue,
            bucket,
            prefetch=2,
            dead_letter_exchange=DEAD_EXCHANGE,
        )
        for name in ("a", "b")
    }
    try:
        bucket_with_amqp(rgw, rabbitmq, bucket)
        s3 = rgw.client("s3")
        names = [f"batch/doc {n}+é.png" for n in range(49)]
        for n, key in enumerate(names):
            body = docs.write_png(
                tmp_path / f"{n}.png", [f"Document {n}", "Quarterly report"]
            ).read_bytes()
            s3.put_object(Bucket=bucket, Key=key, Body=body)
        pages = [[f"Page {n} of the long report", "Quarterly report invoice"] for n in range(8)]
        long_key = "batch/long report.pdf"
        long_pdf = docs.write_pdf(tmp_path / "long.pdf", pages).read_bytes()
        s3.put_object(Bucket=bucket, Key=long_key, Body=long_pdf)  # last: both daemons busy by then
        names.append(long_key)
        long_uri = f"s3://{bucket}/{long_key}"

        def on_long(candidates: dict[str, DaemonProcess]) -> str | None:
            for name, daemon in candidates.items():
                if any(e.get("uri") == long_uri for e in events(daemon, "job_started")):
                    return name
            return None

        victim = wait_until(lambda: on_long(daemons), 120, "the long PDF started")
        daemons[victim].signal(signal.SIGKILL)
        daemons[victim].proc.wait()  # type: ignore[union-attr]
        assert not any(e.get("uri") == long_uri for e in events(daemons[victim], "job_done"))
        name = "b" if victim == "a" else "a"
        survivor = daemons[name]
        wait_until(lambda: on_long({name: survivor}), 120, "the survivor took the long PDF")
        rabbitmq.restart()  # mid-document: its message goes back, and comes back to the survivor
        wait_until(lambda: events(survivor, "amqp_reachable"), 60, "the survivor reconnected")
        for key in names:
            wait_until(
                lambda key=key: sidecar(s3, bucket, f"{key}.json"), 180, f"sidecars of {key}"
            )
        wait_until(lambda: rabbitmq.depth(queue) == (0, 1), 30, "the queue drained")

        def written() -> Counter[str]:
            """Documents whose JSON sidecar was written, by either daemon: a kill between that and
            ``job_done`` leaves the redelivery to be recognised as done, not done again."""
            return Counter(
                e["uri"].removesuffix(".json")
                for d in daemons.values()
                for e in events(d, "s3_sidecar_written")
                if e["uri"].endswith(".png.json") or e["uri"].endswith(".pdf.json")
            )

        uris = {f"s3://{bucket}/{key}" for key in names}

        def unlogged() -> set[str]:
            """Documents the victim held at its kill that the survivor then found done: ``kill -9``
            can land between the victim's write and its log line, so their write is not logged."""
            victims = daemons[victim]
            held = {e["uri"] for e in events(victims, "job_started")}
            held -= {e["uri"] for e in events(victims, "job_done")}
            return held & {e["uri"] for e in events(survivor, "job_already_done")}

        def accounted() -> bool:
            counts, spared = written(), unlogged()
            return set(counts) <= uris and all(
                counts[uri] == 1 or (counts[uri] == 0 and uri in spared) for uri in uris
            )

        # A sidecar can be read (and the queue show nothing ready) a moment before its daemon
        # logs the write and acknowledges the message.
        wait_until(
            lambda: accounted() or max(written().values(), default=0) > 1,
            30,
            lambda: f"every document's sidecar logged: {sorted(written().items())}",
        )
        assert accounted() and max(written().values()) == 1, sorted(written().items())
        wait_until(
            lambda: any(e["uri"] == long_uri for e in events(survivor, "job_done")),
            30,
            "the survivor's job_done for the long PDF",
        )
        assert all(events(daemon, "job_done") for daemon in daemons.values()), (
            "one daemon took no work"
        )
        assert events(survivor, "amqp_connection_lost")
        assert len(sidecar(s3, bucket, f"{long_key}.json")["pages"]) == 8  # type: ignore[index]
    finally:
        for daemon in daemons.values():
            daemon.stop()
