"""S3 events, and S3Source (SQS) against moto_server on 127.0.0.1 (S3 + SQS, the AWS event
shape)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import stat
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from ocrwatch.config import LimitsConfig, S3Config
from ocrwatch.errors import FileTooLarge, OcrwatchError, SourceGone
from ocrwatch.results.assemble import error_document
from ocrwatch.sinks.s3 import S3Sink
from ocrwatch.sources.base import Job, S3Object
from ocrwatch.sources.s3 import S3Source
from ocrwatch.sources.s3events import created_object, event_records, refusal
from tests.support.outboxes import fed
from tests.support.s3servers import MotoServer

pytestmark = pytest.mark.s3

ODD_KEYS = ["inbox/My Scan é+1.pdf", "inbox/a+b.pdf", "inbox/déjà vu/ü 100%.png"]


class Submitted:
    """A ``submit`` that records jobs, optionally slowly or failing, so tests can observe the
    source; its ``reject`` records the jobs a source gives up."""

    def __init__(self, delay: float = 0.0, fail: bool = False) -> None:
        self.jobs: list[Job] = []
        self.rejected: list[tuple[Job, OcrwatchError, int]] = []
        self.returned_at: list[float] = []
        self.delay, self.fail = delay, fail

    async def __call__(self, job: Job) -> None:
        await asyncio.sleep(self.delay)
        if self.fail:
            raise RuntimeError("ledger unavailable")
        self.jobs.append(job)
        self.returned_at.append(time.monotonic())

    async def reject(self, job: Job, error: OcrwatchError, attempts: int) -> None:
        self.rejected.append((job, error, attempts))

    async def wait(self, count: int, timeout: float = 20.0) -> list[Job]:
        await until(
            lambda: len(self.jobs) >= count, timeout, f"{count} jobs (have {len(self.jobs)})"
        )
        return self.jobs


async def until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())


def sqs_config(server: MotoServer, queue_url: str, **keys: Any) -> S3Config:
    return S3Config(
        **server.s3_config(
            **{"transport": "sqs", "queue_url": queue_url, "wait_time_seconds": 1, **keys}
        )
    )


def queue_counts(server: MotoServer, queue_url: str) -> tuple[int, int]:
    """(visible, in flight) messages."""
    attributes = server.client("sqs").get_queue_attributes(
        QueueUrl=queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]), int(
        attributes["ApproximateNumberOfMessagesNotVisible"]
    )


# --- events, without a server ---------------------------------------------------------------------


def record(
    key: str, source: str = "aws:s3", name: str = "ObjectCreated:Put", **obj: Any
) -> dict[str, Any]:
    return {
        "eventSource": source,
        "eventName": name,
        "s3": {"bucket": {"name": "bucket"}, "object": {"key": key, **obj}},
    }


def test_keys_are_decoded_as_their_producer_encoded_them() -> None:
    aws = created_object(record("inbox%2FMy+Scan+%C3%A9%2B1.pdf", size=14, eTag="abc"))
    assert aws == S3Object("bucket", "inbox/My Scan é+1.pdf", etag="abc", size=14)
    minio = created_object(
        record("inbox/a%2Bb+c.pdf", "minio:s3", "s3:ObjectCreated:Put", eTag='"q"')
    )
    assert minio is not None and (minio.key, minio.etag) == ("inbox/a+b c.pdf", "q")
    ceph = created_object(record("inbox/a+b c%20.pdf", "ceph:s3", versionId="", eTag="e", size=3))
    assert ceph == S3Object("bucket", "inbox/a+b c%20.pdf", etag="e", version_id=None, size=3)
    assert created_object(record("x.pdf", name="ObjectRemoved:Delete")) is None


def test_notification_bodies() -> None:
    assert event_records({"Service": "Amazon S3", "Event": "s3:TestEvent", "Bucket": "b"}) == []
    wrapped = {"Type": "Notification", "Message": json.dumps({"Records": [record("a.pdf")]})}
    assert event_records(wrapped) == [record("a.pdf")]
    with pytest.raises(ValueError):
        event_records({"hello": "world"})


def test_own_sidecars_are_refused_whatever_the_suffix_filter_says() -> None:
    cfg = S3Config(
        queue_url="q", prefix="inbox/", suffixes=(".pdf", ".md", ".json"), output_prefix="ocr/"
    )
    for key in ("inbox/a.pdf.md", "inbox/a.pdf.json", "inbox/a.pdf.error.json"):
        assert refusal(cfg, S3Object("b", key)) == "own_sidecar"
    assert refusal(cfg, S3Object("b", "inbox/A.PDF")) is None
    assert refusal(cfg, S3Object("b", "other/a.pdf")) == "prefix"
    assert refusal(cfg, S3Object("b", "inbox/a.docx")) == "suffix"
    assert refusal(cfg, S3Object("b", "inbox/")) == "folder"
    assert refusal(S3Config(queue_url="q", bucket="b"), S3Object("c", "a.pdf")) == "other_bucket"


# --- SQS (moto) -----------------------------------------------------------------------------------


def test_sqs_events_become_jobs_and_are_deleted_after_finish(moto: MotoServer) -> None:
    queue = moto.bucket_with_queue("docs", "events")
    cfg = sqs_config(moto, queue, suffixes=(".pdf", ".png", ".json", ".md"), wait_time_seconds=20)
    s3 = moto.client("s3")
    for key in ODD_KEYS:
        s3.put_object(Bucket="docs", Key=key, Body=b"%PDF-1.4 " + key.encode())
    for key in ("inbox/a.pdf.md", "inbox/a.pdf.json", "inbox/a.pdf.error.json", "inbox/notes.txt"):
        s3.put_object(Bucket="docs", Key=key, Body=b"{}")

    async def scenario() -> None:
        submitted = Submitted()
        source = S3Source(cfg, name="s3-test")
        await source.start(fed(submitted, submitted.reject))
        jobs = await submitted.wait(len(ODD_KEYS))
        await asyncio.sleep(1.5)  # time for anything wrongly accepted to show up
        assert sorted(job.origin.key for job in jobs) == sorted(ODD_KEYS)
        for job in jobs:
            head = s3.head_object(Bucket="docs", Key=job.origin.key)
            assert job.origin == S3Object(
                "docs", job.origin.key, etag=head["ETag"].strip('"'), size=head["ContentLength"]
            )
            assert job.source == "s3-test" and job.key == f"s3://docs/{job.origin.key}"
        # test event and sidecars deleted, jobs held
        assert queue_counts(moto, queue) == (0, len(ODD_KEYS))
        for job in jobs:
            await source.finish(job, "done")
        assert queue_counts(moto, queue) == (0, 0)
        started = time.monotonic()
        await source.stop()  # a 20 s long poll is pending: stop must not wait for it
        assert time.monotonic() - started < 5

    run(scenario)


def test_a_message_the_parser_cannot_take_is_deleted_not_redelivered_for_ever(
    moto: MotoServer,
) -> None:
    """A body nested too deeply for the JSON parser (a RecursionError, not a ValueError) is a
    message like any unreadable one: deleted with a log line, never left to come back."""
    sqs = moto.client("sqs")
    queue = sqs.create_queue(QueueName="poison", Attributes={"VisibilityTimeout": "1"})["QueueUrl"]
    sqs.send_message(QueueUrl=queue, MessageBody="[" * 100_000 + "]" * 100_000)

    async def scenario() -> None:
        submitted = Submitted()
        source = S3Source(sqs_config(moto, queue), name="s3-test")
        with capture_logs() as logs:
            await source.start(fed(submitted, submitted.reject))
            await until(lambda: queue_counts(moto, queue) == (0, 0), 20, "the message deleted")
            await source.stop()
        assert [entry["reason"] for entry in logs if entry["event"] == "s3_message_ignored"] == [
            "JSON nested too deeply"
        ]
        assert not [entry for entry in logs if entry["event"] == "s3_message_failed"]

    run(scenario)


def test_multipart_upload_announced_twice_is_one_ledger_key(moto: MotoServer) -> None:
    queue = moto.bucket_with_queue("docs", "events")
    cfg = sqs_config(moto, queue)
    s3, key = moto.client("s3"), "scans/big scan+1.pdf"
    upload = s3.create_multipart_upload(Bucket="docs", Key=key)["UploadId"]
    parts = [
        {
            "PartNumber": n,
            "ETag": s3.upload_part(
                Bucket="docs", Key=key, UploadId=upload, PartNumber=n, Body=body
            )["ETag"],
        }
        for n, body in ((1, b"a" * 5 * 1024 * 1024), (2, b"b" * 10))
    ]
    s3.complete_multipart_upload(
        Bucket="docs", Key=key, UploadId=upload, MultipartUpload={"Parts": parts}
    )

    async def scenario() -> None:
        submitted = Submitted()
        source = S3Source(cfg)
        await source.start(fed(submitted, submitted.reject))
        jobs = await submitted.wait(2)
        assert {job.key for job in jobs} == {f"s3://docs/{key}"}
        assert jobs[-1].origin.etag == s3.head_object(Bucket="docs", Key=key)["ETag"].strip('"')
        # the daemon folds the duplicate into one job: one finish
        await source.finish(jobs[-1], "done")
        assert queue_counts(moto, queue) == (0, 0)
        await source.finish(jobs[0], "done")  # a second finish is harmless
        await source.stop()

    run(scenario)


def test_heartbeat_keeps_the_message_invisible_until_finish(moto: MotoServer) -> None:
    queue = moto.bucket_with_queue("docs", "events")
    cfg = sqs_config(moto, queue, visibility_timeout_seconds=10)
    moto.client("s3").put_object(Bucket="docs", Key="slow.pdf", Body=b"%PDF-1.4")

    async def scenario() -> None:
        submitted = Submitted()
        source = S3Source(cfg)
        await source.start(fed(submitted, submitted.reject))
        [job] = await submitted.wait(1)
        await asyncio.sleep(14)  # past the 10 s visibility timeout
        peek = moto.client("sqs").receive_message(QueueUrl=queue, WaitTimeSeconds=0)
        assert peek.get("Messages", []) == [] and queue_counts(moto, queue) == (0, 1)
        await source.finish(job, "done")
        assert queue_counts(moto, queue) == (0, 0)
        await source.stop()

    run(scenario)


def test_retry_leaves_the_message_and_a_message_waits_for_all_its_records(moto: MotoServer) -> None:
    queue = moto.bucket_with_queue("docs", "events")
    cfg = sqs_config(moto, queue)
    body = {
        "Records": [
            record("two%2Fa.pdf", size=1, eTag="1"),
            record("two%2Fb.pdf", size=1, eTag="2"),
        ]
    }
    sqs = moto.client("sqs")

    async def scenario() -> None:
        submitted = Submitted()
        source = S3Source(cfg)
        await source.start(fed(submitted, submitted.reject))
        sqs.send_message(QueueUrl=queue, MessageBody=json.dumps(body))
        first, second = await submitted.wait(2)  # one job per record (the test event is none)
        assert [first.origin.key, second.origin.key] == ["two/a.pdf", "two/b.pdf"]
        await source.finish(first, "done")
        assert queue_counts(moto, queue) == (0, 1)  # still waits for the second record
        await source.finish(second, "done")
        assert queue_counts(moto, queue) == (0, 0)

        sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({"Records": [record("c.pdf")]}))
        [*_, third] = await submitted.wait(3)
        await source.finish(third, "retry")
        assert queue_counts(moto, queue) == (0, 1)  # left to reappear when its visibility lapses

        for etag in ("old", "new"):  # the key overwritten while its first version is processed
            sqs.send_message(
                QueueUrl=queue, MessageBody=json.dumps({"Records": [record("d.pdf", eTag=etag)]})
            )
        [*_, old, new] = await submitted.wait(5)
        assert (old.origin.etag, new.origin.etag) == ("old", "new") and old.key == new.key
        await source.finish(old, "done")
        # the new version's message is not deleted with the old one
        assert queue_counts(moto, queue) == (0, 2)
        await source.stop()

    run(scenario)


class RejectedLikeThePipeline(Submitted):
    """``reject`` as the pipeline does it: the error sidecar through the job's sink, then
    ``finish(failed)``."""

    def __init__(self, source: S3Source) -> None:
        super().__init__()
        self.source, self.sink = source, S3Sink(source.cfg, source.client)

    async def reject(self, job: Job, error: OcrwatchError, attempts: int) -> None:
        await super().reject(job, error, attempts)
        obj = job.origin
        assert isinstance(obj, S3Object)
        source = {
            "uri": obj.uri,
            "name": obj.name,
            "bytes": obj.size or 0,
            "sha256": None,
            "etag": obj.etag,
            "version_id": obj.version_id,
        }
        document = error_document(source, error.as_dict(), attempts, time.time())
        await asyncio.to_thread(self.sink.write_error, job, document)
        await self.source.finish(job, "failed")


def test_max_receives_rejects_the_job_and_deletes_once_it_is_finished(moto: MotoServer) -> None:
    queue = moto.bucket_with_queue("docs", "events")
    moto.client("s3").put_object(Bucket="docs", Key="in/poison.pdf", Body=b"%PDF-1.4 bad")
    sqs = moto.client("sqs")
    for _ in range(3):  # three failed deliveries, as if three daemons had crashed on it
        sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, VisibilityTimeout=0)
    cfg = sqs_config(moto, queue, max_receives=3)

    async def scenario() -> None:
        source = S3Source(cfg)
        pipeline = RejectedLikeThePipeline(source)
        await source.start(fed(pipeline, pipeline.reject))
        await until(lambda: queue_counts(moto, queue) == (0, 0), 15, "the poison message deleted")
        await source.stop()
        assert pipeline.jobs == []
        [(job, error, attempts)] = pipeline.rejected
        assert (job.origin.uri, error.kind, attempts) == (
            "s3://docs/in/poison.pdf",
            "too_many_deliveries",
            4,
        )

    run(scenario)
    sidecar = json.loads(
        moto.client("s3").get_object(Bucket="docs", Key="in/poison.pdf.error.json")["Body"].read()
    )
    assert sidecar["error"]["kind"] == "too_many_deliveries" and sidecar["attempts"] == 4
    assert sidecar["source"]["uri"] == "s3://docs/in/poison.pdf"


def test_a_failed_reject_leaves_the_message_to_come_back(moto: MotoServer) -> None:
    queue = moto.bucket_with_queue("docs", "events")
    moto.client("s3").put_object(Bucket="docs", Key="poison.pdf", Body=b"%PDF-1.4 bad")
    moto.client("sqs").receive_message(QueueUrl=queue, MaxNumberOfMessages=10, VisibilityTimeout=0)
    cfg = sqs_config(moto, queue, max_receives=1)

    async def scenario() -> None:
        source = S3Source(cfg)

        async def failing(job: Job, error: OcrwatchError, attempts: int) -> None:
            raise RuntimeError("ledger unavailable")

        with capture_logs() as logs:
            await source.start(fed(Submitted(), failing))
            await until(
                lambda: any(e["event"] == "s3_message_left" for e in logs), 15, "the message left"
            )
        await source.stop()
        assert queue_counts(moto, queue) == (0, 1)  # reappears when its visibility lapses

    run(scenario)


def test_max_receives_left_to_the_dead_letter_queue(moto: MotoServer) -> None:
    queue = moto.bucket_with_queue("docs", "events")
    moto.client("s3").put_object(Bucket="docs", Key="poison.pdf", Body=b"%PDF-1.4 bad")
    sqs = moto.client("sqs")
    sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, VisibilityTimeout=0)
    cfg = sqs_config(moto, queue, max_receives=1, on_max_receives="dead_letter")

    async def scenario() -> None:
        submitted = Submitted()
        source = S3Source(cfg)
        with capture_logs() as logs:
            await source.start(fed(submitted, submitted.reject))
            await until(
                lambda: any(e["event"] == "s3_max_receives" for e in logs), 15, "s3_max_receives"
            )
        await source.stop()
        assert submitted.jobs == [] and queue_counts(moto, queue) == (0, 1)

    run(scenario)
    assert "Contents" not in moto.client("s3").list_objects_v2(Bucket="docs", Prefix="poison.pdf.")


@pytest.mark.slow
def test_polling_survives_an_outage_of_the_server() -> None:
    server = MotoServer().start()
    try:
        queue = server.bucket_with_queue("docs", "events")
        cfg = sqs_config(server, queue)

        async def scenario() -> None:
            submitted = Submitted()
            source = S3Source(cfg.model_copy(update={"receive_backoff_max_seconds": 3}))
            with capture_logs() as logs:
                await source.start(fed(submitted, submitted.reject))
                await asyncio.sleep(1)
                await asyncio.to_thread(server.stop)
                await asyncio.sleep(20)
                await asyncio.to_thread(server.start)
                server.bucket_with_queue("docs", "events")  # moto forgot everything
                server.client("s3").put_object(Bucket="docs", Key="after.pdf", Body=b"%PDF-1.4")
                [job] = await submitted.wait(1, timeout=30)
            await source.finish(job, "done")
            await source.stop()
            events = [entry["event"] for entry in logs]
            assert events.count("s3_unreachable") >= 3 and "s3_reachable" in events
            assert job.origin.key == "after.pdf"

        run(scenario)
    finally:
        server.stop()


# --- fetch ----------------------------------------------------------------------------------------


def test_fetch_streams_to_a_private_spool_file(moto: MotoServer, tmp_path: Path) -> None:
    s3 = moto.client("s3")
    s3.create_bucket(Bucket="docs")
    data = bytes(range(256)) * 20000
    etag = s3.put_object(Bucket="docs", Key="a b+é.pdf", Body=data)["ETag"].strip('"')
    cfg = sqs_config(moto, "unused")

    async def scenario() -> None:
        source = S3Source(cfg, limits=LimitsConfig(max_bytes=len(data)))
        submitted = Submitted()
        await source.start(fed(submitted, submitted.reject))
        fetched = await source.fetch(
            Job(S3Object("docs", "a b+é.pdf", etag=etag, size=len(data)), "s3"), tmp_path
        )
        path = fetched.path
        assert path.parent == tmp_path and path.suffix == ".pdf" and path.read_bytes() == data
        # taken of the very bytes downloaded
        assert fetched.sha256 == hashlib.sha256(data).hexdigest()
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        unknown_size = await source.fetch(Job(S3Object("docs", "a b+é.pdf"), "s3"), tmp_path)
        assert unknown_size.path.read_bytes() == data
        await source.stop()

    run(scenario)


def test_fetch_refuses_oversize_before_downloading_and_reports_gone(
    moto: MotoServer, tmp_path: Path
) -> None:
    s3 = moto.client("s3")
    s3.create_bucket(Bucket="docs")
    s3.put_object(Bucket="docs", Key="big.pdf", Body=b"x" * 5000)
    cfg = sqs_config(moto, "unused")

    async def scenario() -> None:
        source = S3Source(cfg, limits=LimitsConfig(max_bytes=4096))
        submitted = Submitted()
        await source.start(fed(submitted, submitted.reject))
        with pytest.raises(FileTooLarge):  # decided from the event: the key need not even exist
            await source.fetch(
                Job(S3Object("docs", "never-uploaded.pdf", size=4097), "s3"), tmp_path
            )
        with pytest.raises(FileTooLarge):  # no size in the event: decided from Content-Length
            await source.fetch(Job(S3Object("docs", "big.pdf"), "s3"), tmp_path)
        with pytest.raises(SourceGone):
            await source.fetch(Job(S3Object("docs", "missing.pdf", size=10), "s3"), tmp_path)
        with pytest.raises(SourceGone):  # overwritten since the event: If-Match fails
            await source.fetch(Job(S3Object("docs", "big.pdf", etag="0" * 32), "s3"), tmp_path)
        assert list(tmp_path.iterdir()) == []
        await source.stop()

    run(scenario)
