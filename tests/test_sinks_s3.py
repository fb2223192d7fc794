"""S3Sink against real servers on 127.0.0.1 (moto_server; Ceph RGW where installed)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ocrwatch.config import S3Config
from ocrwatch.errors import NameTooLong, OutputNotWritable
from ocrwatch.sinks.s3 import S3Sink
from ocrwatch.sources.base import Job, S3Object
from tests.s3servers import MotoServer, RgwServer

pytestmark = pytest.mark.s3

KEY = "scans/2024/Report é+1.pdf"
DOCUMENT = {"schema": "ocrwatch/1", "status": "ok", "source": {"uri": f"s3://docs/{KEY}", "etag": "abc123"},
            "pages": [{"index": 1, "markdown": "Grüße"}]}


def job(key: str = KEY, bucket: str = "docs") -> Job:
    return Job(S3Object(bucket, key, etag="abc123", version_id="v1", size=10), "s3")


def get(client: Any, bucket: str, key: str) -> tuple[bytes, dict[str, Any]]:
    response = client.get_object(Bucket=bucket, Key=key)
    return response["Body"].read(), response


def assert_round_trip(server: MotoServer | RgwServer, cfg: S3Config) -> None:
    s3, sink = server.client("s3"), S3Sink(cfg)
    s3.create_bucket(Bucket="docs")
    assert sink.recorded(job()) is None
    sink.write_error(job(), {"error": {"kind": "transient"}})
    sink.write(job(), "<!-- page 1 -->\nGrüße\n", DOCUMENT)

    markdown, response = get(s3, "docs", f"{KEY}.md")
    assert markdown.decode("utf-8") == "<!-- page 1 -->\nGrüße\n"
    assert response["ContentType"] == "text/markdown; charset=utf-8"
    assert response["Metadata"] == {"ocrwatch-source-etag": "abc123", "ocrwatch-source-version-id": "v1"}
    document, response = get(s3, "docs", f"{KEY}.json")
    assert json.loads(document) == DOCUMENT and response["ContentType"] == "application/json"
    assert response["Metadata"]["ocrwatch-source-etag"] == "abc123"
    assert "Contents" not in s3.list_objects_v2(Bucket="docs", Prefix=f"{KEY}.error")  # stale error removed
    assert sink.recorded(job()) == DOCUMENT["source"]


def test_sidecars_beside_the_key_round_trip(moto: MotoServer) -> None:
    assert_round_trip(moto, S3Config(queue_url="q", **moto.s3_config()))


def test_sidecars_on_ceph_rgw(rgw: RgwServer) -> None:
    cfg = S3Config(transport="webhook", token="t", **rgw.s3_config())
    assert_round_trip(rgw, cfg)
    with pytest.raises(NameTooLong):  # the key fits S3's 1024 bytes, its sidecar's does not (moto does not check)
        S3Sink(cfg).write_error(job("k" * 1020 + ".pdf"), {"error": {}})


def test_output_bucket_prefix_and_template(moto: MotoServer) -> None:
    s3 = moto.client("s3")
    s3.create_bucket(Bucket="ocr-out")
    cfg = S3Config(queue_url="q", output_bucket="ocr-out", output_prefix="results/", **moto.s3_config())
    sink = S3Sink(cfg, name_template="{stem}.ocr")
    assert sink.location(job()) == ("ocr-out", {"md": "results/scans/2024/Report é+1.ocr.md",
                                                 "json": "results/scans/2024/Report é+1.ocr.json",
                                                 "error": "results/scans/2024/Report é+1.ocr.error.json"})
    sink.write_error(job("top.png"), {"error": {"kind": "encrypted_pdf"}})
    error, response = get(s3, "ocr-out", "results/top.ocr.error.json")
    assert json.loads(error) == {"error": {"kind": "encrypted_pdf"}}
    assert response["ContentType"] == "application/json"


def test_recorded_is_none_for_an_unparseable_sidecar(moto: MotoServer) -> None:
    s3 = moto.client("s3")
    s3.create_bucket(Bucket="docs")
    sink = S3Sink(S3Config(queue_url="q", **moto.s3_config()))
    s3.put_object(Bucket="docs", Key=f"{KEY}.json", Body=b"{truncated")
    assert sink.recorded(job()) is None
    s3.put_object(Bucket="docs", Key=f"{KEY}.json", Body=b'{"source": "not a mapping"}')
    assert sink.recorded(job()) is None


def test_writing_to_a_missing_bucket_is_permanent(moto: MotoServer) -> None:
    sink = S3Sink(S3Config(queue_url="q", **moto.s3_config()))
    with pytest.raises(OutputNotWritable):
        sink.write(job(bucket="no-such-bucket"), "x", DOCUMENT)
