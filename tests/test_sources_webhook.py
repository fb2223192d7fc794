"""WebhookSource on 127.0.0.1: its HTTP answers, and Ceph RGW pushing real events to it."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import gzip
import http.client
import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from ocrwatch.config import S3Config
from ocrwatch.infra.s3client import InvalidRequest
from ocrwatch.sources.base import S3Object
from ocrwatch.sources.webhook import WebhookSource
from tests.support.outboxes import fed
from tests.support.s3servers import RgwServer
from tests.test_http import Flood
from tests.test_sources_s3 import ODD_KEYS, Submitted, record, run, until

pytestmark = pytest.mark.s3

TOKEN = "s3cret-token"


def webhook_config(**keys: Any) -> S3Config:
    return S3Config(
        transport="webhook",
        listen="127.0.0.1:0",
        token=TOKEN,
        region="default",
        access_key_id="testing",
        secret_access_key="testing",
        **keys,
    )


def post(
    address: tuple[str, int],
    target: str,
    body: bytes,
    headers: dict[str, str] | None = None,
    method: str = "POST",
) -> tuple[int, dict[str, Any], float]:
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
        source = WebhookSource(cfg)
        source.reject_delay_seconds = 0.05
        await source.start(fed(submitted, submitted.reject))
        address = source.address

        async def status(
            target: str,
            body: bytes = event,
            headers: dict[str, str] | None = None,
            method: str = "POST",
        ) -> int:
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
        source = WebhookSource(cfg)
        await source.start(fed(slow, slow.reject))
        status, payload, answered = await asyncio.to_thread(
            post, source.address, f"/s3/events?token={TOKEN}", event
        )
        assert (status, payload) == (200, {"accepted": 1}) and answered > slow.returned_at[0]
        await source.stop()

        failing = Submitted(fail=True)
        source = WebhookSource(cfg)
        await source.start(fed(failing, failing.reject))
        started = time.monotonic()
        status, _, answered = await asyncio.to_thread(
            post, source.address, f"/s3/events?token={TOKEN}", event
        )
        assert status == 503  # not in the ledger: the sender must try again, but not at once
        assert answered - started >= source.reject_delay_seconds
        await source.stop()

    run(scenario)


def test_webhook_answers_expect_100_continue_before_the_body() -> None:
    """A sender that waits for ``100 Continue`` learns of a refusal (too large) without sending the
    body."""
    cfg = webhook_config(max_body_bytes=2048)
    event = json.dumps({"Records": [record("in/expect.pdf", "ceph:s3")]}).encode()

    def exchange(address: tuple[str, int], length: int, body: bytes) -> tuple[bytes, bytes]:
        with socket.create_connection(address, timeout=10) as sock:
            sock.sendall(
                f"POST /s3/events?token={TOKEN} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n"
                "Expect: 100-continue\r\nConnection: close\r\n\r\n".encode()
            )
            first = sock.recv(65536)
            if not first.startswith(b"HTTP/1.1 100"):
                return first, b""
            sock.sendall(body)
            rest = b""
            while chunk := sock.recv(65536):
                rest += chunk
            return first, rest

    async def scenario() -> None:
        submitted = Submitted()
        source = WebhookSource(cfg)
        source.reject_delay_seconds = 0.05
        await source.start(fed(submitted, submitted.reject))
        refused, _ = await asyncio.to_thread(exchange, source.address, 4096, b"")
        assert refused.startswith(b"HTTP/1.1 413")
        invited, answer = await asyncio.to_thread(exchange, source.address, len(event), event)
        assert invited.startswith(b"HTTP/1.1 100") and answer.startswith(b"HTTP/1.1 200")
        assert [job.origin.key for job in submitted.jobs] == ["in/expect.pdf"]
        await source.stop()

    run(scenario)


def test_a_token_less_flood_is_answered_at_once_counted_and_lets_the_sender_in() -> None:
    """96 connections at a time without the token, from the sender's own address (127.0.0.1):
    each is answered at once and closed (401 or 403 while the peer is within its budget, a bare 429
    after it), counted in one line per interval rather than a line each, and the sender's requests
    with the token are served throughout. Held for ``reject_delay_seconds`` each, 64 of them kept
    every connection busy: the sender got none."""
    cfg = webhook_config()

    async def scenario() -> None:
        submitted = Submitted()
        source = WebhookSource(cfg)
        source.refusals_log_seconds = 0.5
        with capture_logs() as logs:
            await source.start(fed(submitted, submitted.reject))
            flood = await asyncio.to_thread(Flood, source.address, 96, "POST", "/s3/events")
            started = time.monotonic()
            try:
                await until(
                    lambda: sum(entry["event"] == "s3_webhook_refused" for entry in logs) >= 2,
                    30,
                    "an interval's count",
                )
                for n in range(5):
                    event = json.dumps({"Records": [record(f"in/real{n}.pdf", "ceph:s3")]})
                    answer = await asyncio.to_thread(
                        post, source.address, f"/s3/events?token={TOKEN}", event.encode()
                    )
                    assert answer[:2] == (200, {"accepted": 1})
            finally:
                tally = await asyncio.to_thread(flood.stop)
            flooded = time.monotonic() - started
            await source.stop()
            refused = [entry for entry in logs if entry["event"] == "s3_webhook_refused"]
        print(f"token-less flood for {flooded:.1f}s: {tally}, {len(refused)} log lines")
        assert [job.origin.key for job in submitted.jobs] == [f"in/real{n}.pdf" for n in range(5)]
        answered = tally.get("401", 0) + tally.get("429", 0)
        assert tally.get("429", 0) > tally.get("401", 0) > 0
        assert answered >= sum(tally.values()) * 0.95 and "kept open" not in tally
        assert refused[0]["count"] == 1 and refused[0]["peer"] == "127.0.0.1"
        assert answered <= sum(entry["count"] for entry in refused) <= sum(tally.values())
        # at most a line per interval, and one more where a quiet interval came between
        assert len(refused) <= 2 + 2 * flooded / source.refusals_log_seconds
        assert {entry.get("loudest", entry.get("peer")) for entry in refused} == {"127.0.0.1"}
        assert not [entry for entry in logs if entry["event"] == "s3_webhook_rejected"]

    run(scenario)


def test_rgw_pushes_raw_keys_to_the_webhook(rgw: RgwServer, tmp_path: Path) -> None:
    cfg = S3Config(transport="webhook", listen="127.0.0.1:0", token=TOKEN, **rgw.s3_config())
    s3 = rgw.client("s3")

    async def scenario() -> None:
        submitted = Submitted()
        source = WebhookSource(cfg)
        await source.start(fed(submitted, submitted.reject))
        host, port = source.address
        await asyncio.to_thread(
            rgw.bucket_with_webhook, "webhook-docs", f"http://{host}:{port}{cfg.path}?token={TOKEN}"
        )
        for key in ODD_KEYS:
            await asyncio.to_thread(
                s3.put_object, Bucket="webhook-docs", Key=key, Body=key.encode()
            )
        await asyncio.to_thread(
            s3.put_object, Bucket="webhook-docs", Key="inbox/a.pdf.json", Body=b"{}"
        )
        key = "inbox/multi part+.pdf"
        upload = s3.create_multipart_upload(Bucket="webhook-docs", Key=key)["UploadId"]
        parts = [
            {
                "PartNumber": n,
                "ETag": s3.upload_part(
                    Bucket="webhook-docs", Key=key, UploadId=upload, PartNumber=n, Body=body
                )["ETag"],
            }
            for n, body in ((1, b"a" * 5 * 1024 * 1024), (2, b"b" * 10))
        ]
        await asyncio.to_thread(
            s3.complete_multipart_upload,
            Bucket="webhook-docs",
            Key=key,
            UploadId=upload,
            MultipartUpload={"Parts": parts},
        )
        jobs = await submitted.wait(len(ODD_KEYS) + 1)
        await asyncio.sleep(0.5)
        # one event per multipart upload
        assert [job.origin.key for job in submitted.jobs] == [*ODD_KEYS, key]
        for job in jobs:
            head = s3.head_object(Bucket="webhook-docs", Key=job.origin.key)
            assert job.origin == S3Object(
                "webhook-docs",
                job.origin.key,
                etag=head["ETag"].strip('"'),
                size=head["ContentLength"],
            )
        fetched = await source.fetch(jobs[1], tmp_path)
        assert fetched.path.read_bytes() == ODD_KEYS[1].encode()
        await source.stop()

    run(scenario)


def test_rgw_persistent_topic_resends_what_the_webhook_refused(rgw: RgwServer) -> None:
    cfg = S3Config(transport="webhook", listen="127.0.0.1:0", token=TOKEN, **rgw.s3_config())

    async def scenario() -> None:
        submitted = Submitted(fail=True)
        source = WebhookSource(cfg)
        with capture_logs() as logs:
            await source.start(fed(submitted, submitted.reject))
            host, port = source.address
            await asyncio.to_thread(
                rgw.bucket_with_webhook,
                "persistent-docs",
                f"http://{host}:{port}{cfg.path}?token={TOKEN}",
                persistent=True,
            )
            await asyncio.to_thread(
                rgw.client("s3").put_object, Bucket="persistent-docs", Key="again.pdf", Body=b"x"
            )
            await until(
                lambda: sum(e["event"] == "s3_webhook_rejected" for e in logs) >= 2,
                40,
                "two refusals",
            )
            submitted.fail = False
            [job] = await submitted.wait(1, timeout=40)
        assert job.origin.key == "again.pdf"
        await source.stop()

    run(scenario)


def test_every_bad_request_gets_a_4xx_answer_and_the_listener_stays_healthy() -> None:
    """Bodies built to break the parser or the event walk: each answered 4xx (or 200 with nothing
    accepted where the body is an event with unusable records), never a dropped connection or a
    5xx."""
    cfg = webhook_config(max_body_bytes=1024 * 1024)
    good = record("in/good.pdf", "ceph:s3", size=5, eTag="abc")

    def event(**s3: Any) -> bytes:
        return json.dumps(
            {"Records": [{"eventSource": "ceph:s3", "eventName": "ObjectCreated:Put", "s3": s3}]}
        ).encode()

    refused = {
        "nested arrays": b"[" * 100_000 + b"]" * 100_000,
        "nested objects": b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
        "nested inside the records": b'{"Records": [' + b"[" * 100_000 + b"]" * 100_000 + b"]}",
        "nested inside an SNS message": json.dumps(
            {"Type": "Notification", "Message": "[" * 100_000}
        ).encode(),
        "not UTF-8": b'{"Records": [\xff\xfe\xfd]}',
        "a number too long to convert": b'{"Records": [' + b"7" * 100_000 + b"]}",
        "not an object": b"[]",
        "records not a list": b'{"Records": {"0": {}}}',
        "an SNS message that is not JSON": json.dumps(
            {"Type": "Notification", "Message": "{no"}
        ).encode(),
    }
    ignored = {
        "records of every type": json.dumps({"Records": [1, "x", None, [], True, 1e308]}).encode(),
        "s3 a list": event().replace(b'"s3": {}', b'"s3": []'),
        "bucket a string": event(bucket="docs", object={"key": "a.pdf"}),
        "bucket name a number": event(bucket={"name": 7}, object={"key": "a.pdf"}),
        "object a list": event(bucket={"name": "docs"}, object=["a.pdf"]),
        "key an object": event(bucket={"name": "docs"}, object={"key": {"a": 1}}),
        "eTag an object": event(bucket={"name": "docs"}, object={"key": "a.pdf", "eTag": {"x": 1}}),
        "versionId a list": event(
            bucket={"name": "docs"}, object={"key": "a.pdf", "versionId": [1]}
        ),
        "eventName an object": json.dumps({"Records": [{**good, "eventName": {"x": 1}}]}).encode(),
        "a key longer than S3 allows": event(
            bucket={"name": "docs"}, object={"key": "k" * 1025 + ".pdf"}
        ),
        "a key with a lone surrogate": event(
            bucket={"name": "docs"}, object={"key": "a\ud800.pdf"}
        ),
        "a key with a NUL": event(bucket={"name": "docs"}, object={"key": "a\u0000.pdf"}),
    }

    async def scenario() -> None:
        submitted = Submitted()
        source = WebhookSource(cfg)
        source.reject_delay_seconds = 0.01
        await source.start(fed(submitted, submitted.reject))
        target = f"/s3/events?token={TOKEN}"
        for name, body in refused.items():
            status, payload, _ = await asyncio.to_thread(post, source.address, target, body)
            assert status == 400 and "not an S3 event" in payload["error"], name
        with capture_logs() as logs:
            for name, body in ignored.items():
                status, payload, _ = await asyncio.to_thread(post, source.address, target, body)
                assert (status, payload) == (200, {"accepted": 0}), name
            many = json.dumps({"Records": [{**good, "s3": []}] * 5000}).encode()
            assert (await asyncio.to_thread(post, source.address, target, many))[:2] == (
                200,
                {"accepted": 0},
            )
        # a line per body
        assert sum(entry.get("reason") == "malformed" for entry in logs) <= len(ignored) + 1
        strange = {
            "Authorization": "Bearer \udcff\udcfe".encode("utf-8", "surrogateescape").decode(
                "latin-1"
            )
        }
        assert (await asyncio.to_thread(post, source.address, "/s3/events", b"{}", strange))[
            0
        ] == 403
        bomb = gzip.compress(b" " * (64 * 1024 * 1024))  # 64 kB that inflate to 64 MB
        status, _, _ = await asyncio.to_thread(
            post, source.address, target, bomb, {"Content-Encoding": "gzip"}
        )
        assert status == 413
        # still healthy: a good event is accepted
        good_body = json.dumps({"Records": [good]}).encode()
        assert (await asyncio.to_thread(post, source.address, target, good_body))[:2] == (
            200,
            {"accepted": 1},
        )
        assert [job.origin.key for job in submitted.jobs] == ["in/good.pdf"]
        await source.stop()

    run(scenario)


def test_a_failure_no_retry_can_cure_is_given_up_and_answered_2xx() -> None:
    """A 5xx would make the sender resend the event for ever (RGW: every later event with it); an
    event whose failure is permanent is handed to ``reject`` (recorded, logged, counted) and
    answered 200."""
    cfg = webhook_config()
    event = json.dumps({"Records": [record("in/poison.pdf", "ceph:s3")]}).encode()

    class Poisoned(Submitted):
        async def __call__(self, job: Any) -> None:
            raise InvalidRequest("reading s3://bucket/in/poison.pdf.json: InvalidObjectName")

    async def scenario() -> None:
        poisoned = Poisoned()
        source = WebhookSource(cfg)
        await source.start(fed(poisoned, poisoned.reject))
        status, payload, _ = await asyncio.to_thread(
            post, source.address, f"/s3/events?token={TOKEN}", event
        )
        assert (status, payload) == (200, {"accepted": 1})
        [(job, error, attempts)] = poisoned.rejected
        assert (
            job.origin.key == "in/poison.pdf"
            and error.kind == "s3_request_invalid"
            and attempts == 0
        )
        await source.stop()

    run(scenario)


def test_a_submit_outliving_its_request_at_stop_leaves_nothing_unretrieved() -> None:
    """Stopping cancels a request whose submit is still running (shielded); that submit must not
    fail later with nobody to take its exception, which asyncio prints as a traceback outside the
    JSON log."""
    cfg = webhook_config()
    event = json.dumps({"Records": [record("in/slow.pdf", "ceph:s3")]}).encode()

    async def scenario() -> None:
        reported: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(
            lambda loop, context: reported.append(context)
        )
        slow = Submitted(delay=3.0, fail=True)  # fails after the listener's 2 s of shutdown time
        source = WebhookSource(cfg)
        await source.start(fed(slow, slow.reject))
        answer = asyncio.create_task(
            asyncio.to_thread(post, source.address, f"/s3/events?token={TOKEN}", event)
        )
        await asyncio.sleep(0.5)
        await source.stop()
        with contextlib.suppress(Exception):  # the request was cut: no answer
            await answer
        await asyncio.sleep(3.0)  # past the moment the submit would have failed
        gc.collect()
        assert reported == []

    run(scenario)
