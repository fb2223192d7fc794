"""``ocrwatch run`` as a real process with S3 sources: moto_server (SQS) and Ceph RGW (webhook),
real Tesseract."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import DaemonProcess, free_port, wait_until
from tests.support import docs
from tests.support.s3servers import MotoServer, RgwServer

pytestmark = [pytest.mark.integration, pytest.mark.s3]

TOKEN = "integration-token"


def sidecar(client: Any, bucket: str, key: str) -> dict[str, Any] | None:
    try:
        return json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    except client.exceptions.NoSuchKey:
        return None


def text(client: Any, bucket: str, key: str) -> str:
    return client.get_object(Bucket=bucket, Key=key)["Body"].read().decode("utf-8")


def queue_empty(server: MotoServer, queue: str) -> bool:
    attributes = server.client("sqs").get_queue_attributes(
        QueueUrl=queue,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return attributes == {
        "ApproximateNumberOfMessages": "0",
        "ApproximateNumberOfMessagesNotVisible": "0",
    }


def sqs_daemon(
    root: Path,
    server: MotoServer,
    queue: str,
    s3_keys: dict[str, Any] | None = None,
    **overrides: Any,
) -> DaemonProcess:
    s3 = server.s3_config(
        transport="sqs",
        queue_url=queue,
        wait_time_seconds=2,
        visibility_timeout_seconds=30,
        **(s3_keys or {}),
    )
    return DaemonProcess(root, s3=[s3], **overrides)


def started(daemon: DaemonProcess, uri: str) -> int:
    return sum(
        1
        for event in daemon.events()
        if event.get("event") == "job_started" and event.get("uri") == uri
    )


def test_upload_to_sidecars_beside_the_key(moto: MotoServer, tmp_path: Path) -> None:
    queue = moto.bucket_with_queue("docs", "events")
    daemon = sqs_daemon(tmp_path, moto, queue).start()
    try:
        s3, key = moto.client("s3"), "scans/Report é+1.png"
        body = docs.write_png(
            tmp_path / "page.png", ["Document S3", "Quarterly report invoice"]
        ).read_bytes()
        uploaded = time.monotonic()
        etag = s3.put_object(Bucket="docs", Key=key, Body=body)["ETag"].strip('"')
        document = wait_until(lambda: sidecar(s3, "docs", f"{key}.json"), 60, "the JSON sidecar")
        print(f"moto SQS upload-to-sidecar, one page: {time.monotonic() - uploaded:.2f}s")
        assert (
            document["source"]["uri"] == f"s3://docs/{key}" and document["source"]["etag"] == etag
        )
        assert "quarterly report" in text(s3, "docs", f"{key}.md").lower()
        head = s3.head_object(Bucket="docs", Key=f"{key}.md")
        assert head["ContentType"] == "text/markdown; charset=utf-8"
        assert head["Metadata"]["ocrwatch-source-etag"] == etag
        wait_until(lambda: queue_empty(moto, queue), 10, "every message deleted")

        s3.put_object(Bucket="docs", Key=key, Body=body)  # the same bytes again: recognised as done
        wait_until(
            lambda: any(e.get("event") == "job_already_done" for e in daemon.events()), 30, "dedup"
        )
        wait_until(lambda: queue_empty(moto, queue), 10, "the duplicate's message deleted")
        assert started(daemon, f"s3://docs/{key}") == 1
    finally:
        daemon.stop()


def test_an_upload_of_bytes_done_under_another_key_takes_that_result(
    moto: MotoServer, tmp_path: Path
) -> None:
    queue = moto.bucket_with_queue("dupes", "dupe-events")
    daemon = sqs_daemon(tmp_path, moto, queue).start()
    try:
        s3 = moto.client("s3")
        body = docs.write_png(
            tmp_path / "invoice.png", ["INVOICE 4711", "Total 120 EUR"]
        ).read_bytes()
        s3.put_object(Bucket="dupes", Key="in/invoice.png", Body=body)
        first = wait_until(
            lambda: sidecar(s3, "dupes", "in/invoice.png.json"), 60, "the first sidecars"
        )
        s3.put_object(Bucket="dupes", Key="again/invoice.1.png", Body=body)
        copy = wait_until(
            lambda: sidecar(s3, "dupes", "again/invoice.1.png.json"), 60, "the copy's sidecars"
        )
        assert copy["reused_from"] == "s3://dupes/in/invoice.png"
        assert (
            copy["source"]["uri"] == "s3://dupes/again/invoice.1.png"
            and copy["pages"] == first["pages"]
        )
        assert text(s3, "dupes", "again/invoice.1.png.md") == text(s3, "dupes", "in/invoice.png.md")
        assert [e for e in daemon.events() if e.get("event") == "job_reused"]
    finally:
        daemon.stop()


def test_poison_object_gets_an_error_sidecar_and_is_not_redelivered(
    moto: MotoServer, tmp_path: Path
) -> None:
    queue = moto.bucket_with_queue("docs", "events")
    daemon = sqs_daemon(tmp_path, moto, queue).start()
    try:
        s3, key = moto.client("s3"), "in/locked.pdf"
        s3.put_object(
            Bucket="docs",
            Key=key,
            Body=docs.write_encrypted_pdf(tmp_path / "locked.pdf").read_bytes(),
        )
        error = wait_until(
            lambda: sidecar(s3, "docs", f"{key}.error.json"), 60, "the error sidecar"
        )
        assert error["error"]["kind"] == "encrypted_pdf"
        wait_until(lambda: queue_empty(moto, queue), 10, "the poison message deleted")
        assert (
            sidecar(s3, "docs", f"{key}.json") is None and started(daemon, f"s3://docs/{key}") == 1
        )
    finally:
        daemon.stop()


def test_a_message_delivered_too_often_is_given_up_through_the_pipeline(
    moto: MotoServer, tmp_path: Path
) -> None:
    """Past ``max_receives`` the source rejects the job unprocessed; the pipeline writes its error
    sidecar and the message is deleted once that job is finished."""
    queue = moto.bucket_with_queue("docs", "events")
    s3, key = moto.client("s3"), "in/crashed on.png"
    s3.put_object(
        Bucket="docs", Key=key, Body=docs.write_png(tmp_path / "p.png", ["Poison"]).read_bytes()
    )
    for _ in range(2):  # two deliveries that never finished, as if two daemons had crashed on it
        moto.client("sqs").receive_message(
            QueueUrl=queue, MaxNumberOfMessages=10, VisibilityTimeout=0
        )
    daemon = sqs_daemon(tmp_path, moto, queue, s3_keys={"max_receives": 2}).start()
    try:
        error = wait_until(
            lambda: sidecar(s3, "docs", f"{key}.error.json"), 60, "the error sidecar"
        )
        assert error["error"]["kind"] == "too_many_deliveries" and error["attempts"] == 3
        assert error["source"]["uri"] == f"s3://docs/{key}"
        wait_until(lambda: queue_empty(moto, queue), 10, "the poison message deleted")
        assert (
            sidecar(s3, "docs", f"{key}.json") is None and started(daemon, f"s3://docs/{key}") == 0
        )
    finally:
        daemon.stop()


def test_two_daemons_on_one_queue_process_each_document_once(
    moto: MotoServer, tmp_path: Path
) -> None:
    queue = moto.bucket_with_queue("docs", "events")
    daemons = [sqs_daemon(tmp_path / name, moto, queue) for name in ("a", "b")]
    try:
        for daemon in daemons:
            daemon.start()
        s3 = moto.client("s3")
        keys = [f"batch/doc {n}+.png" for n in range(8)]
        for n, key in enumerate(keys):
            page = docs.write_png(tmp_path / f"{n}.png", [f"Document {n}", "Quarterly report"])
            s3.put_object(Bucket="docs", Key=key, Body=page.read_bytes())
        for key in keys:
            wait_until(
                lambda key=key: sidecar(s3, "docs", f"{key}.json"), 120, f"sidecars of {key}"
            )
        wait_until(lambda: queue_empty(moto, queue), 10, "every message deleted")

        def done() -> Counter[str]:  # job_done is logged just after the message is deleted
            return Counter(
                e["uri"] for d in daemons for e in d.events() if e.get("event") == "job_done"
            )

        expected = Counter({f"s3://docs/{key}": 1 for key in keys})
        wait_until(
            lambda: done() == expected or sum(done().values()) > len(keys),
            10,
            "every job_done logged",
        )
        assert done() == expected
    finally:
        for daemon in daemons:
            daemon.stop()


def webhook_daemon(root: Path, rgw: RgwServer, bucket: str, **overrides: Any) -> DaemonProcess:
    port = free_port()
    s3 = rgw.s3_config(transport="webhook", listen=f"127.0.0.1:{port}", token=TOKEN)
    daemon = DaemonProcess(root, s3=[s3], **overrides).start()
    rgw.bucket_with_webhook(bucket, f"http://127.0.0.1:{port}/s3/events?token={TOKEN}")
    return daemon


def test_rgw_webhook_upload_to_sidecars(rgw: RgwServer, tmp_path: Path) -> None:
    daemon = webhook_daemon(tmp_path, rgw, "daemon-docs")
    try:
        s3 = rgw.client("s3")
        body = docs.write_png(
            tmp_path / "page.png", ["Document RGW", "Quarterly report invoice"]
        ).read_bytes()
        # RGW's first write to a bucket takes ~2 s
        for key in (
            "inbox/first.png",
            "inbox/a+b c é.png",
        ):
            uploaded = time.monotonic()
            s3.put_object(Bucket="daemon-docs", Key=key, Body=body)
            document = wait_until(
                lambda key=key: sidecar(s3, "daemon-docs", f"{key}.json"), 60, "the sidecar"
            )
            print(
                "Ceph RGW webhook upload-to-sidecar, one page: "
                f"{time.monotonic() - uploaded:.2f}s ({key})"
            )
            assert document["source"]["uri"] == f"s3://daemon-docs/{key}"
            assert "quarterly report" in text(s3, "daemon-docs", f"{key}.md").lower()
    finally:
        daemon.stop()


def test_daemon_finishes_through_an_s3_outage(rgw: RgwServer, tmp_path: Path) -> None:
    retry = {"attempts": 8, "backoff_initial_seconds": 1.0, "backoff_max_seconds": 5.0}
    daemon = webhook_daemon(tmp_path, rgw, "outage-docs", retry=retry)
    try:
        s3, key = rgw.client("s3"), "long report.pdf"
        pages = [[f"Page {n} of the long report", "Quarterly report invoice"] for n in range(10)]
        s3.put_object(
            Bucket="outage-docs",
            Key=key,
            Body=docs.write_pdf(tmp_path / "long.pdf", pages).read_bytes(),
        )
        wait_until(lambda: started(daemon, f"s3://outage-docs/{key}"), 30, "the job started")
        # Mid-job: the gateway stays down until the daemon meets it (the download or the sidecar
        # writes), however long the pages take to read on a loaded machine.
        rgw.stop_gateway()
        try:
            wait_until(lambda: noticed(daemon), 180, "the daemon to meet the outage")
        finally:
            rgw.start_gateway()
        document = wait_until(
            lambda: sidecar(s3, "outage-docs", f"{key}.json"), 120, "the JSON sidecar"
        )
        assert len(document["pages"]) == 10
        assert daemon.proc is not None and daemon.proc.poll() is None
    finally:
        daemon.stop()


def test_two_buckets_sharing_an_output_bucket_keep_their_own_sidecars(
    moto: MotoServer, tmp_path: Path
) -> None:
    """Two ``[[s3]]`` tables writing into one ``output_bucket``: the same key uploaded to both gets
    sidecars of its own in each bucket's folder (each used to overwrite the other's, both ``ok``),
    and a user's own object at a sidecar's key stays: the document fails as ``output_conflict``."""
    s3 = moto.client("s3")
    s3.create_bucket(Bucket="shared-out")
    tables = [
        moto.s3_config(
            transport="sqs",
            queue_url=moto.bucket_with_queue(bucket, f"{bucket}-events"),
            bucket=bucket,
            output_bucket="shared-out",
            wait_time_seconds=1,
        )
        for bucket in ("tenant-a", "tenant-b")
    ]
    daemon = DaemonProcess(tmp_path, s3=tables).start()
    try:
        for bucket in ("tenant-a", "tenant-b"):
            page = docs.write_png(tmp_path / f"{bucket}.png", [f"Report of {bucket}", "Invoice"])
            s3.put_object(Bucket=bucket, Key="in/scan.png", Body=page.read_bytes())
        for bucket in ("tenant-a", "tenant-b"):
            key = f"{bucket}/in/scan.png"
            document = wait_until(
                lambda key=key: sidecar(s3, "shared-out", f"{key}.json"), 60, f"{key}.json"
            )
            assert document["source"]["uri"] == f"s3://{bucket}/in/scan.png"
            assert f"report of {bucket}" in text(s3, "shared-out", f"{key}.md").lower()
        assert not [k for k in keys_of(s3, "shared-out") if k.startswith("in/")]

        s3.put_object(Bucket="shared-out", Key="tenant-b/in/notes.png.md", Body=b"my own notes")
        page = docs.write_png(tmp_path / "notes.png", ["Meeting notes"])
        s3.put_object(Bucket="tenant-b", Key="in/notes.png", Body=page.read_bytes())
        error = wait_until(
            lambda: sidecar(s3, "shared-out", "tenant-b/in/notes.png.error.json"), 60, "the error"
        )
        assert error["error"]["kind"] == "output_conflict"
        assert text(s3, "shared-out", "tenant-b/in/notes.png.md") == "my own notes"
    finally:
        daemon.stop()


def noticed(daemon: DaemonProcess) -> bool:
    """Whether the daemon logged meeting a dead S3 endpoint, as a retry of the call or the job."""
    return any(e.get("event") in {"s3_call_retry", "job_retry"} for e in daemon.events())


def keys_of(client: Any, bucket: str) -> list[str]:
    return [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]
