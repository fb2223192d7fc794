"""S3Source against real servers on 127.0.0.1: moto_server (S3 + SQS, AWS event shape) and Ceph RGW (webhook)."""

from __future__ import annotations

import asyncio
import http.client
import json
import stat
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from ocrwatch.config import LimitsConfig, S3Config
from ocrwatch.errors import FileTooLarge, SourceGone
from ocrwatch.sources.base import Job, S3Object
from ocrwatch.sources.s3 import S3Source, created_object, event_records, refusal
from tests.s3servers import MotoServer, RgwServer

pytestmark = pytest.mark.s3

ODD_KEYS = ["inbox/My Scan é+1.pdf", "inbox/a+b.pdf", "inbox/déjà vu/ü 100%.png"]


class Submitted:
    """A ``submit`` that records jobs, optionally slowly or failing, so tests can observe the source."""

    def __init__(self, delay: float = 0.0, fail: bool = False) -> None:
        self.jobs: list[Job] = []
        self.returned_at: list[float] = []
        self.delay, self.fail = delay, fail

    async def __call__(self, job: Job) -> None:
        await asyncio.sleep(self.delay)
        if self.fail:
            raise RuntimeError("ledger unavailable")
        self.jobs.append(job)
        self.returned_at.append(time.monotonic())

    async def wait(self, count: int, timeout: float = 20.0) -> list[Job]:
        await until(lambda: len(self.jobs) >= count, timeout, f"{count} jobs (have {len(self.jobs)})")
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
    return S3Config(**server.s3_config(**{"transport": "sqs", "queue_url": queue_url, "wait_time_seconds": 1, **keys}))


def queue_counts(server: MotoServer, queue_url: str) -> tuple[int, int]:
    """(visible, in flight) messages."""
    attributes = server.client("sqs").get_queue_attributes(QueueUrl=queue_url, AttributeNames=[
        "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]), int(attributes["ApproximateNumberOfMessagesNotVisible"])


# --- events, without a server ---------------------------------------------------------------------------------


def record(key: str, source: str = "aws:s3", name: str = "ObjectCreated:Put", **obj: Any) -> dict[str, Any]:
    return {"eventSource": source, "eventName": name,
            "s3": {"bucket": {"name": "bucket"}, "object": {"key": key, **obj}}}


def test_keys_are_decoded_as_their_producer_encoded_them() -> None:
    aws = created_object(record("inbox%2FMy+Scan+%C3%A9%2B1.pdf", size=14, eTag="abc"))
    assert aws == S3Object("bucket", "inbox/My Scan é+1.pdf", etag="abc", size=14)
    minio = created_object(record("inbox/a%2Bb+c.pdf", "minio:s3", "s3:ObjectCreated:Put", eTag='"q"'))
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
    cfg = S3Config(queue_url="q", prefix="inbox/", suffixes=(".pdf", ".md", ".json"), output_prefix="ocr/")
    for key in ("inbox/a.pdf.md", "inbox/a.pdf.json", "inbox/a.pdf.error.json"):
        assert refusal(cfg, S3Object("b", key)) == "own_sidecar"
    assert refusal(cfg, S3Object("b", "inbox/A.PDF")) is None
    assert refusal(cfg, S3Object("b", "other/a.pdf")) == "prefix"
    assert refusal(cfg, S3Object("b", "inbox/a.docx")) == "suffix"
    assert refusal(cfg, S3Object("b", "inbox/")) == "folder"
    assert refusal(S3Config(queue_url="q", bucket="b"), S3Object("c", "a.pdf")) == "other_bucket"


# --- SQS (moto) ------------------------------------------------------------------------------------------------


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
        await source.start(submitted)
        jobs = await submitted.wait(len(ODD_KEYS))
        await asyncio.sleep(1.5)  # time for anything wrongly accepted to show up
        assert sorted(job.origin.key for job in jobs) == sorted(ODD_KEYS)
        for job in jobs:
            head = s3.head_object(Bucket="docs", Key=job.origin.key)
            assert job.origin == S3Object("docs", job.origin.key, etag=head["ETag"].strip('"'),
                                          size=head["ContentLength"])
            assert job.source == "s3-test" and job.key == f"s3://docs/{job.origin.key}"
        assert queue_counts(moto, queue) == (0, len(ODD_KEYS))  # test event and sidecars deleted, jobs held
        for job in jobs:
            await source.finish(job, "done")
        assert queue_counts(moto, queue) == (0, 0)
        started = time.monotonic()
        await source.stop()  # a 20 s long poll is pending: stop must not wait for it
        assert time.monotonic() - started < 2

    run(scenario)


def test_multipart_upload_announced_twice_is_one_ledger_key(moto: MotoServer) -> None:
    queue = moto.bucket_with_queue("docs", "events")
    cfg = sqs_config(moto, queue)
    s3, key = moto.client("s3"), "scans/big scan+1.pdf"
    upload = s3.create_multipart_upload(Bucket="docs", Key=key)["UploadId"]
    parts = [{"PartNumber": n, "ETag": s3.upload_part(Bucket="docs", Key=key, UploadId=upload, PartNumber=n,
                                                       Body=body)["ETag"]}
             for n, body in ((1, b"a" * 5 * 1024 * 1024), (2, b"b" * 10))]
    s3.complete_multipart_upload(Bucket="docs", Key=key, UploadId=upload, MultipartUpload={"Parts": parts})

    async def scenario() -> None:
        submitted = Submitted()
        source = S3Source(cfg)
        await source.start(submitted)
        jobs = await submitted.wait(2)
        assert {job.key for job in jobs} == {f"s3://docs/{key}"}
        assert jobs[-1].origin.etag == s3.head_object(Bucket="docs", Key=key)["ETag"].strip('"')
        await source.finish(jobs[-1], "done")  # the daemon folds the duplicate into one job: one finish
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
        await source.start(submitted)
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
    body = {"Records": [record("two%2Fa.pdf", size=1, eTag="1"), record("two%2Fb.pdf", size=1, eTag="2")]}
    sqs = moto.client("sqs")

    async def scenario() -> None:
        submitted = Submitted()
        source = S3Source(cfg)
        await source.start(submitted)
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
            sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({"Records": [record("d.pdf", eTag=etag)]}))
        [*_, old, new] = await submitted.wait(5)
        assert (old.origin.etag, new.origin.etag) == ("old", "new") and old.key == new.key
        await source.finish(old, "done")
        assert queue_counts(moto, queue) == (0, 2)  # the new version's message is not deleted with the old one
        await source.stop()

    run(scenario)


def test_max_receives_writes_the_error_sidecar_and_deletes(moto: MotoServer) -> None:
    queue = moto.bucket_with_queue("docs", "events")
    moto.client("s3").put_object(Bucket="docs", Key="in/poison.pdf", Body=b"%PDF-1.4 bad")
    sqs = moto.client("sqs")
    for _ in range(3):  # three failed deliveries, as if three daemons had crashed on it
        sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, VisibilityTimeout=0)
    cfg = sqs_config(moto, queue, max_receives=3)

    async def scenario() -> None:
        submitted = Submitted()
        source = S3Source(cfg)
        await source.start(submitted)
        await until(lambda: queue_counts(moto, queue) == (0, 0), 15, "the poison message deleted")
        await source.stop()
        assert submitted.jobs == []

    run(scenario)
    sidecar = json.loads(moto.client("s3").get_object(Bucket="docs", Key="in/poison.pdf.error.json")["Body"].read())
    assert sidecar["error"]["kind"] == "too_many_deliveries" and sidecar["attempts"] == 4
    assert sidecar["source"]["uri"] == "s3://docs/in/poison.pdf"


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
            await source.start(submitted)
            await until(lambda: any(e["event"] == "s3_max_receives" for e in logs), 15, "s3_max_receives")
        await source.stop()
        assert submitted.jobs == [] and queue_counts(moto, queue) == (0, 1)

    run(scenario)
    assert "Contents" not in moto.client("s3").list_objects_v2(Bucket="docs", Prefix="poison.pdf.")


def test_polling_survives_an_outage_of_the_server() -> None:
    server = MotoServer().start()
    try:
        queue = server.bucket_with_queue("docs", "events")
        cfg = sqs_config(server, queue)

        async def scenario() -> None:
            submitted = Submitted()
            source = S3Source(cfg, backoff_max_seconds=3)
            with capture_logs() as logs:
                await source.start(submitted)
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


# --- fetch ---------------------------------------------------------------------------------------------------------


def test_fetch_streams_to_a_private_spool_file(moto: MotoServer, tmp_path: Path) -> None:
    s3 = moto.client("s3")
    s3.create_bucket(Bucket="docs")
    data = bytes(range(256)) * 20000
    etag = s3.put_object(Bucket="docs", Key="a b+é.pdf", Body=data)["ETag"].strip('"')
    cfg = sqs_config(moto, "unused")

    async def scenario() -> None:
        source = S3Source(cfg, limits=LimitsConfig(max_bytes=len(data)))
        await source.start(Submitted())
        path = await source.fetch(Job(S3Object("docs", "a b+é.pdf", etag=etag, size=len(data)), "s3"), tmp_path)
        assert path.parent == tmp_path and path.suffix == ".pdf" and path.read_bytes() == data
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        unknown_size = await source.fetch(Job(S3Object("docs", "a b+é.pdf"), "s3"), tmp_path)
        assert unknown_size.read_bytes() == data
        await source.stop()

    run(scenario)


def test_fetch_refuses_oversize_before_downloading_and_reports_gone(moto: MotoServer, tmp_path: Path) -> None:
    s3 = moto.client("s3")
    s3.create_bucket(Bucket="docs")
    s3.put_object(Bucket="docs", Key="big.pdf", Body=b"x" * 5000)
    cfg = sqs_config(moto, "unused")

    async def scenario() -> None:
        source = S3Source(cfg, limits=LimitsConfig(max_bytes=4096))
        await source.start(Submitted())
        with pytest.raises(FileTooLarge):  # decided from the event: the key need not even exist
            await source.fetch(Job(S3Object("docs", "never-uploaded.pdf", size=4097), "s3"), tmp_path)
        with pytest.raises(FileTooLarge):  # no size in the event: decided from Content-Length
            await source.fetch(Job(S3Object("docs", "big.pdf"), "s3"), tmp_path)
        with pytest.raises(SourceGone):
            await source.fetch(Job(S3Object("docs", "missing.pdf", size=10), "s3"), tmp_path)
        with pytest.raises(SourceGone):  # overwritten since the event: If-Match fails
            await source.fetch(Job(S3Object("docs", "big.pdf", etag="0" * 32), "s3"), tmp_path)
        assert list(tmp_path.iterdir()) == []
        await source.stop()

    run(scenario)


# --- webhook ---------------------------------------------------------------------------------------------------

TOKEN = "s3cret-token"


def webhook_config(**keys: Any) -> S3Config:
    return S3Config(transport="webhook", listen="127.0.0.1:0", token=TOKEN, region="default",
                    access_key_id="testing", secret_access_key="testing", **keys)


def post(address: tuple[str, int], target: str, body: bytes, headers: dict[str, str] | None = None,
         method: str = "POST") -> tuple[int, dict[str, Any], float]:
    connection = http.client.HTTPConnection(*address, timeout=10)
    try:
        connection.request(method, target, body=body, headers=headers or {})
        response = connection.getresponse()
        payload = json.loads(response.read() or b"{}")
        return response.status, payload, time.monotonic()
    finally:
        connection.close()


def test_webhook_authentication_and_limits() -> None:
    cfg = webhook_config(max_body_bytes=2048)
    event = json.dumps({"Records": [record("in/x+y.pdf", "ceph:s3", size=5)]}).encode()
    bearer = {"Authorization": f"Bearer {TOKEN}"}

    async def scenario() -> None:
        submitted = Submitted()
        source = S3Source(cfg)
        source.reject_delay_seconds = 0.05
        await source.start(submitted)
        address = source.address

        async def status(target: str, body: bytes = event, headers: dict[str, str] | None = None,
                         method: str = "POST") -> int:
            return (await asyncio.to_thread(post, address, target, body, headers, method))[0]

        assert await status("/s3/events") == 401
        assert await status("/s3/events?token=wrong") == 403
        assert await status("/s3/events", headers={"Authorization": "Bearer wrong"}) == 403
        assert await status("/s3/events", headers={"Authorization": f"Basic {TOKEN}"}) == 401
        assert await status("/elsewhere?token=" + TOKEN) == 404
        assert await status("/s3/events", b"", bearer, method="GET") == 405
        assert await status("/s3/events", b"x" * 4096, bearer) == 413
        assert await status("/s3/events", b"not json", bearer) == 400
        assert submitted.jobs == []
        assert await status("/s3/events", headers=bearer) == 200
        assert await status(f"/s3/events?token={TOKEN}") == 200
        assert [job.origin.key for job in submitted.jobs] == ["in/x+y.pdf", "in/x+y.pdf"]
        await source.stop()

    run(scenario)


def test_webhook_answers_only_after_submit_returned() -> None:
    cfg = webhook_config()
    event = json.dumps({"Records": [record("slow.pdf", "ceph:s3")]}).encode()

    async def scenario() -> None:
        slow = Submitted(delay=0.5)
        source = S3Source(cfg)
        await source.start(slow)
        status, payload, answered = await asyncio.to_thread(post, source.address, f"/s3/events?token={TOKEN}", event)
        assert (status, payload) == (200, {"accepted": 1}) and answered > slow.returned_at[0]
        await source.stop()

        failing = Submitted(fail=True)
        source = S3Source(cfg)
        await source.start(failing)
        started = time.monotonic()
        status, _, answered = await asyncio.to_thread(post, source.address, f"/s3/events?token={TOKEN}", event)
        assert status == 503  # not in the ledger: the sender must try again, but not at once
        assert answered - started >= source.reject_delay_seconds
        await source.stop()

    run(scenario)


def test_rgw_pushes_raw_keys_to_the_webhook(rgw: RgwServer, tmp_path: Path) -> None:
    cfg = S3Config(transport="webhook", listen="127.0.0.1:0", token=TOKEN, **rgw.s3_config())
    s3 = rgw.client("s3")

    async def scenario() -> None:
        submitted = Submitted()
        source = S3Source(cfg)
        await source.start(submitted)
        host, port = source.address
        await asyncio.to_thread(rgw.bucket_with_webhook, "webhook-docs",
                                f"http://{host}:{port}{cfg.path}?token={TOKEN}")
        for key in ODD_KEYS:
            await asyncio.to_thread(s3.put_object, Bucket="webhook-docs", Key=key, Body=key.encode())
        await asyncio.to_thread(s3.put_object, Bucket="webhook-docs", Key="inbox/a.pdf.json", Body=b"{}")
        key = "inbox/multi part+.pdf"
        upload = s3.create_multipart_upload(Bucket="webhook-docs", Key=key)["UploadId"]
        parts = [{"PartNumber": n, "ETag": s3.upload_part(Bucket="webhook-docs", Key=key, UploadId=upload,
                                                           PartNumber=n, Body=body)["ETag"]}
                 for n, body in ((1, b"a" * 5 * 1024 * 1024), (2, b"b" * 10))]
        await asyncio.to_thread(s3.complete_multipart_upload, Bucket="webhook-docs", Key=key, UploadId=upload,
                                MultipartUpload={"Parts": parts})
        jobs = await submitted.wait(len(ODD_KEYS) + 1)
        await asyncio.sleep(0.5)
        assert [job.origin.key for job in submitted.jobs] == [*ODD_KEYS, key]  # one event per multipart upload
        for job in jobs:
            head = s3.head_object(Bucket="webhook-docs", Key=job.origin.key)
            assert job.origin == S3Object("webhook-docs", job.origin.key, etag=head["ETag"].strip('"'),
                                          size=head["ContentLength"])
        path = await source.fetch(jobs[1], tmp_path)
        assert path.read_bytes() == ODD_KEYS[1].encode()
        await source.stop()

    run(scenario)


def test_rgw_persistent_topic_resends_what_the_webhook_refused(rgw: RgwServer) -> None:
    cfg = S3Config(transport="webhook", listen="127.0.0.1:0", token=TOKEN, **rgw.s3_config())

    async def scenario() -> None:
        submitted = Submitted(fail=True)
        source = S3Source(cfg)
        with capture_logs() as logs:
            await source.start(submitted)
            host, port = source.address
            await asyncio.to_thread(rgw.bucket_with_webhook, "persistent-docs",
                                    f"http://{host}:{port}{cfg.path}?token={TOKEN}", persistent=True)
            await asyncio.to_thread(rgw.client("s3").put_object, Bucket="persistent-docs", Key="again.pdf", Body=b"x")
            await until(lambda: sum(e["event"] == "s3_webhook_rejected" for e in logs) >= 2, 40, "two refusals")
            submitted.fail = False
            [job] = await submitted.wait(1, timeout=40)
        assert job.origin.key == "again.pdf"
        await source.stop()

    run(scenario)
