"""The AMQP transport's rules without a broker: its URL (env, file, never shown with a password),
delivery counts from a quorum queue's or a dead-letter loop's headers, the configuration, and
notification bodies as MinIO and Ceph RGW publish them to RabbitMQ (written from their documented
formats: MinIO's ``event.Log`` with ``EventName``/``Key``/``Records``, RGW's ``Records``).
The broker itself is exercised in tests/integration/test_amqp.py."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from ocrwatch import config
from ocrwatch.config import S3Config
from ocrwatch.errors import ConfigError
from ocrwatch.sources.amqpmessages import broker_url, receives, redacted
from ocrwatch.sources.base import S3Object

pytest.importorskip(
    "aio_pika", reason="the amqp extra is not installed: pip install 'ocrwatch[amqp]'"
)
from ocrwatch.sources.amqp import AmqpSource, probe  # after the skip
from tests.support.rabbitmq import RabbitServer

BASE = {
    "transport": "amqp",
    "queue": "ocr",
    "endpoint_url": "http://127.0.0.1:1",
    "region": "x",
    "access_key_id": "a",
    "secret_access_key": "b",
}


def minio_record(
    key: str,
    event: str = "s3:ObjectCreated:Put",
    etag: str = "d41d8cd98f00b204e9800998ecf8427e",
    size: int = 1024,
    bucket: str = "scans",
) -> dict[str, Any]:
    """One record as MinIO's AMQP target sends it (``mc event add … arn:minio:sqs::1:amqp``)."""
    return {
        "eventVersion": "2.0",
        "eventSource": "minio:s3",
        "awsRegion": "",
        "eventTime": "2026-03-02T09:14:07.412Z",
        "eventName": event,
        "userIdentity": {"principalId": "minioadmin"},
        "requestParameters": {
            "principalId": "minioadmin",
            "region": "",
            "sourceIPAddress": "10.0.4.17",
        },
        "responseElements": {
            "x-amz-id-2": "dd9025bab4ad464b049177c95eb6ebf374d3b3fd1af9251148b658df7ac2e3e8",
            "x-amz-request-id": "1898E5B4F2A1C3D0",
            "x-minio-deployment-id": "4c1f7e55-9d2c",
            "x-minio-origin-endpoint": "http://10.0.4.2:9000",
        },
        "s3": {
            "s3SchemaVersion": "1.0",
            "configurationId": "Config",
            "bucket": {
                "name": bucket,
                "ownerIdentity": {"principalId": "minioadmin"},
                "arn": f"arn:aws:s3:::{bucket}",
            },
            "object": {
                "key": key,
                "size": size,
                "eTag": etag,
                "contentType": "image/png",
                "userMetadata": {"content-type": "image/png"},
                "sequencer": "1898E5B4F3C7A6E2",
            },
        },
        "source": {
            "host": "10.0.4.17",
            "port": "",
            "userAgent": "MinIO (linux; amd64) minio-go/v7.0.70",
        },
    }


def minio_body(bucket: str, raw_key: str, record: dict[str, Any]) -> bytes:
    """MinIO's ``event.Log``: the event name and ``bucket/key`` beside the records."""
    return json.dumps(
        {"EventName": record["eventName"], "Key": f"{bucket}/{raw_key}", "Records": [record]}
    ).encode()


def rgw_body(key: str, etag: str = "9b2cf535f27731c974343645a3985328") -> bytes:
    """What Ceph RGW (pacific) publishes to its topic's ``amqp-exchange``."""
    return json.dumps(
        {
            "Records": [
                {
                    "eventVersion": "2.2",
                    "eventSource": "ceph:s3",
                    "awsRegion": "default",
                    "eventTime": "2026-03-02T09:14:07.412331Z",
                    "eventName": "ObjectCreated:Put",
                    "userIdentity": {"principalId": "test"},
                    "requestParameters": {"sourceIPAddress": ""},
                    "responseElements": {
                        "x-amz-request-id": "1c2f0d1e-3a5b-4a8e-9a70-4b3c8e2f5d11.4137.1",
                        "x-amz-id-2": "1029-default-default",
                    },
                    "s3": {
                        "s3SchemaVersion": "1.0",
                        "configurationId": "ocrwatch",
                        "bucket": {
                            "name": "scans",
                            "ownerIdentity": {"principalId": "test"},
                            "arn": "arn:aws:s3:::scans",
                            "id": "1c2f0d1e.4137.1",
                        },
                        "object": {
                            "key": key,
                            "size": 2048,
                            "eTag": etag,
                            "versionId": "",
                            "sequencer": "0F9B3F66A4C2D911",
                            "metadata": [],
                            "tags": [],
                        },
                    },
                    "eventId": "1709370847.412331.9b2cf535f27731c974343645a3985328",
                    "opaqueData": "",
                }
            ]
        }
    ).encode()


@pytest.fixture
def source() -> AmqpSource:
    return AmqpSource(
        S3Config(**BASE, url="amqp://u:p@127.0.0.1/", archive_prefix="archive/"), name="s3:0"
    )


def accepted(source: AmqpSource, body: bytes) -> list[S3Object]:
    return source._accepted(json.loads(body))


def test_minio_keys_are_url_decoded_and_its_extra_fields_ignored(source: AmqpSource) -> None:
    raw = "scans/Report+%C3%A9%2B1.png"  # "scans/Report é+1.png" as MinIO encodes it
    [obj] = accepted(source, minio_body("scans", raw, minio_record(raw)))
    assert (obj.bucket, obj.key, obj.etag, obj.size) == (
        "scans",
        "scans/Report é+1.png",
        "d41d8cd98f00b204e9800998ecf8427e",
        1024,
    )
    assert obj.version_id is None


def test_minio_multipart_uploads_count_and_other_events_do_not(source: AmqpSource) -> None:
    multipart = minio_record(
        "big.pdf", "s3:ObjectCreated:CompleteMultipartUpload", etag="3858f62230ac3c915f300c6-2"
    )
    [obj] = accepted(source, minio_body("scans", "big.pdf", multipart))
    assert obj.etag == "3858f62230ac3c915f300c6-2"
    removed = minio_record("gone.pdf", "s3:ObjectRemoved:Delete")
    assert accepted(source, minio_body("scans", "gone.pdf", removed)) == []
    for ours in ("big.pdf.json", "big.pdf.md", "archive/big.pdf"):  # our sidecars, a moved copy
        assert accepted(source, minio_body("scans", ours, minio_record(ours))) == []


def test_rgw_keys_are_raw(source: AmqpSource) -> None:
    [obj] = accepted(source, rgw_body("inbox/a+b c é.png"))
    assert (obj.key, obj.etag, obj.version_id) == (
        "inbox/a+b c é.png",
        "9b2cf535f27731c974343645a3985328",
        None,
    )


def test_deliveries_are_counted_from_the_headers() -> None:
    assert receives(None, False, "ocr") == 1
    assert receives({}, True, "ocr") == 2  # classic queue: at least one earlier delivery
    assert receives({"x-delivery-count": 4}, True, "ocr") == 5  # quorum queue
    # another queue's deaths are not ours
    deaths = [
        {"count": 3, "reason": b"rejected", "queue": b"ocr", "exchange": "s3"},
        {"count": 7, "reason": "rejected", "queue": "other"},
    ]
    assert receives({"x-death": deaths}, False, "ocr") == 4
    assert receives({"x-delivery-count": True, "x-death": "junk"}, False, "ocr") == 1


def test_the_url_comes_from_the_environment_or_a_file_and_is_never_shown_with_its_password(
    tmp_path: Path,
) -> None:
    secret = "amqps://ocr:s3cr3t@mq.example:5671/prod"
    toml = "[[s3]]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in BASE.items())
    (tmp_path / "ocrwatch.toml").write_text(toml)
    cfg = config.load(tmp_path / "ocrwatch.toml", {"OCRWATCH_S3_0_URL": secret})
    assert broker_url(cfg.s3[0], 0) == secret
    (tmp_path / "url").write_text(secret + "\n")
    assert broker_url(S3Config(**BASE, url_file=tmp_path / "url"), 0) == secret
    assert redacted(secret) == "amqps://ocr@mq.example:5671/prod"
    with pytest.raises(ConfigError, match=r"s3\[2\]\.url_file: .* cannot be read"):
        broker_url(S3Config(**BASE, url_file=tmp_path / "missing"), 2)
    with pytest.raises(ConfigError) as caught:
        broker_url(S3Config(**BASE, url="http://ocr:s3cr3t@mq.example/"), 0)
    assert "s3cr3t" not in caught.value.message and "s3[0].url" in caught.value.message
    assert "s3cr3t" not in repr(S3Config(**BASE, url=secret))


@pytest.mark.parametrize(
    ("keys", "needle"),
    [
        ({}, r"s3\[0\]\.url: transport 'amqp' needs exactly one of url and url_file"),
        ({"url": "amqp://h/", "url_file": "/u"}, "exactly one of url and url_file"),
        ({"url": "amqp://h/", "queue": None}, r"s3\[0\]\.queue: required with transport 'amqp'"),
        ({"url_file": "relative/url"}, r"url_file: an absolute path"),
    ],
)
def test_config_errors_name_the_key(keys: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        config.from_mapping({"s3": [{**BASE, **keys}]})


def test_without_aio_pika_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "aio_pika" else real(name, *a)
    )
    with pytest.raises(
        ConfigError, match=r"s3\[0\]\.transport: 'amqp'.*pip install 'ocrwatch\[amqp\]'"
    ):
        config.from_mapping({"s3": [{**BASE, "url": "amqp://h/"}]})


def test_check_probes_the_broker_and_the_queue(rabbitmq: RabbitServer) -> None:
    """``ocrwatch check``'s lines for a live broker: the queue, the exchanges, and a wrong password
    refused without being shown."""
    cfg = S3Config(
        **{**BASE, "queue": "probe-q"},
        url=rabbitmq.url,
        exchange="probe-ex",
        dead_letter_exchange="probe-dead",
    )
    broker, queue, exchange, dead = probe(cfg, 0)
    assert broker[0] and "ocrwatch@127.0.0.1" in broker[1] and rabbitmq.password not in broker[1]
    assert queue[:3] == (True, "s3[0] queue probe-q", "absent: declared at start (durable, quorum)")
    assert exchange[0] and "absent" in exchange[2]
    assert not dead[0] and "dropped" in dead[2]
    rabbitmq.queue_with_dead_letters("probe-q", "probe-ex")
    rabbitmq.publish("probe-ex", b"{}", "any")
    _, queue, exchange = probe(cfg.model_copy(update={"dead_letter_exchange": ""}), 0)
    assert queue[2] == "1 message(s) ready, 0 consumer(s)" and exchange[2] == "exists"
    wrong = rabbitmq.url.replace(rabbitmq.password, "not-the-password")
    [refused] = probe(cfg.model_copy(update={"url": wrong}), 0)
    assert not refused[0] and "cannot be reached" in refused[2]
    assert "not-the-password" not in " ".join(refused[1:])
