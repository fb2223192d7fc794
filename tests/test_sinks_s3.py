"""S3Sink against real servers on 127.0.0.1 (moto_server; Ceph RGW where installed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ocrwatch.config import S3Config
from ocrwatch.errors import NameTooLong, OutputConflict, OutputNotWritable
from ocrwatch.sinks.base import markdown_bytes
from ocrwatch.s3client import new_client
from ocrwatch.sinks.s3 import S3Sink
from ocrwatch.sources.base import Job, S3Object
from tests.s3servers import MotoServer, RgwServer

pytestmark = pytest.mark.s3

KEY = "scans/2024/Report é+1.pdf"
DOCUMENT = {
    "schema": "ocrwatch/1",
    "status": "ok",
    "source": {"uri": f"s3://docs/{KEY}", "etag": "abc123"},
    "pages": [{"index": 1, "markdown": "Grüße"}],
}
ERROR = {
    "schema": "ocrwatch/1",
    "status": "failed",
    "source": {"uri": f"s3://docs/{KEY}"},
    "error": {"kind": "corrupt_pdf"},
}


def job(key: str = KEY, bucket: str = "docs") -> Job:
    return Job(S3Object(bucket, key, etag="abc123", version_id="v1", size=10), "s3")


def get(client: Any, bucket: str, key: str) -> tuple[bytes, dict[str, Any]]:
    response = client.get_object(Bucket=bucket, Key=key)
    return response["Body"].read(), response


def assert_round_trip(server: MotoServer | RgwServer, cfg: S3Config) -> None:
    s3, sink = server.client("s3"), S3Sink(cfg)
    s3.create_bucket(Bucket="docs")
    assert sink.recorded(job()) is None
    sink.write_error(job(), ERROR)
    sink.write(job(), "<!-- page 1 -->\nGrüße\n", DOCUMENT)

    markdown, response = get(s3, "docs", f"{KEY}.md")
    assert markdown.decode("utf-8") == "<!-- page 1 -->\nGrüße\n"
    assert response["ContentType"] == "text/markdown; charset=utf-8"
    assert response["Metadata"] == {
        "ocrwatch-source-etag": "abc123",
        "ocrwatch-source-version-id": "v1",
    }
    document, response = get(s3, "docs", f"{KEY}.json")
    assert json.loads(document) == DOCUMENT and response["ContentType"] == "application/json"
    assert response["Metadata"]["ocrwatch-source-etag"] == "abc123"
    # stale error removed
    assert "Contents" not in s3.list_objects_v2(Bucket="docs", Prefix=f"{KEY}.error")
    assert sink.recorded(job()) == DOCUMENT["source"]
    s3.put_object(Bucket="docs", Key=f"{KEY}.md", Body=b"")  # emptied by hand: still there
    assert sink.recorded(job()) == DOCUMENT["source"]
    # without its Markdown the document is done again
    s3.delete_object(Bucket="docs", Key=f"{KEY}.md")
    assert sink.recorded(job()) is None


def test_sidecars_beside_the_key_round_trip(moto: MotoServer) -> None:
    assert_round_trip(moto, S3Config(queue_url="q", **moto.s3_config()))


def test_sidecars_on_ceph_rgw(rgw: RgwServer) -> None:
    cfg = S3Config(transport="webhook", token="t", **rgw.s3_config())
    assert_round_trip(rgw, cfg)
    with pytest.raises(
        NameTooLong
    ):  # the key fits S3's 1024 bytes, its sidecar's does not (moto does not check)
        S3Sink(cfg).write_error(job("k" * 1020 + ".pdf"), ERROR)


@pytest.mark.parametrize("server_name", ["moto", "rgw"])
def test_a_key_whose_sidecars_cannot_exist_is_recorded_as_nothing_and_refused_before_writing(
    server_name: str, request: pytest.FixtureRequest
) -> None:
    """RGW refuses a read of a key over 1024 bytes (InvalidObjectName): that must mean "nothing
    recorded", not "storage unavailable", or the sender is asked to resend the event for ever."""
    server: MotoServer | RgwServer = request.getfixturevalue(server_name)
    s3 = server.client("s3")
    bucket = f"long-{server_name}"
    s3.create_bucket(Bucket=bucket)
    cfg = S3Config(transport="webhook", token="t", **server.s3_config())
    sink, long_key = S3Sink(cfg), "long/" + "y" * 1013 + ".png"  # 1022 bytes: a legal key
    s3.put_object(Bucket=bucket, Key=long_key, Body=b"png")
    assert sink.recorded(job(long_key, bucket)) is None
    with pytest.raises(NameTooLong, match="1025 bytes long; S3 allows 1024"):
        sink.write(job(long_key, bucket), "<!-- page 1 -->\n", DOCUMENT)
    with pytest.raises(NameTooLong):
        sink.write_error(job(long_key, bucket), ERROR)
    # nothing written
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == [long_key]


def test_a_failure_removes_the_previous_versions_result_but_never_a_users_object(
    moto: MotoServer,
) -> None:
    s3, sink = moto.client("s3"), S3Sink(S3Config(queue_url="q", **moto.s3_config()))
    s3.create_bucket(Bucket="docs")
    sink.write(job(), "<!-- page 1 -->\nold\n", DOCUMENT)
    sink.write_error(job(), ERROR)  # the new version failed: the old "ok" must not stand for it
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="docs")["Contents"]}
    assert keys == {f"{KEY}.error.json"}
    assert sink.recorded(job()) is None

    # a user's object at a sidecar's key
    s3.put_object(Bucket="docs", Key=f"{KEY}.md", Body=b"my own notes")
    sink.write_error(job(), ERROR)
    assert get(s3, "docs", f"{KEY}.md")[0] == b"my own notes"
    with pytest.raises(OutputConflict, match="did not write"):
        sink.write(job(), "<!-- page 1 -->\nnew\n", DOCUMENT)
    assert get(s3, "docs", f"{KEY}.md")[0] == b"my own notes"
    # nothing half-written
    assert "Contents" not in s3.list_objects_v2(Bucket="docs", Prefix=f"{KEY}.json")


def test_recorded_reads_only_the_head_of_a_large_sidecar(moto: MotoServer) -> None:
    s3, sink = moto.client("s3"), S3Sink(S3Config(queue_url="q", **moto.s3_config()))
    s3.create_bucket(Bucket="docs")
    # 3 MB
    large = DOCUMENT | {"pages": [{"index": n, "markdown": "x" * 1000} for n in range(3000)]}
    sink.write(job(), "<!-- page 1 -->\n", large)
    assert sink.recorded(job()) == DOCUMENT["source"]
    # not ours, and not JSON at all
    s3.put_object(Bucket="docs", Key=f"{KEY}.json", Body=b"[" * 5_000_000)
    assert sink.recorded(job()) is None


def test_output_bucket_prefix_and_template(moto: MotoServer) -> None:
    s3 = moto.client("s3")
    s3.create_bucket(Bucket="ocr-out")
    cfg = S3Config(
        queue_url="q", output_bucket="ocr-out", output_prefix="results/", **moto.s3_config()
    )
    sink = S3Sink(cfg, name_template="{stem}.ocr")
    assert sink.location(job()) == (
        "ocr-out",
        {
            "md": "results/scans/2024/Report é+1.ocr.md",
            "json": "results/scans/2024/Report é+1.ocr.json",
            "error": "results/scans/2024/Report é+1.ocr.error.json",
        },
    )
    sink.write_error(job("top.png"), ERROR)
    error, response = get(s3, "ocr-out", "results/top.ocr.error.json")
    assert json.loads(error) == ERROR
    assert response["ContentType"] == "application/json"


def test_recorded_is_none_for_an_unparseable_sidecar(moto: MotoServer) -> None:
    s3 = moto.client("s3")
    s3.create_bucket(Bucket="docs")
    sink = S3Sink(S3Config(queue_url="q", **moto.s3_config()))
    s3.put_object(Bucket="docs", Key=f"{KEY}.json", Body=b"{truncated")
    assert sink.recorded(job()) is None
    s3.put_object(Bucket="docs", Key=f"{KEY}.json", Body=b'{"source": "not a mapping"}')
    assert sink.recorded(job()) is None


def test_writing_to_a_missing_bucket_is_a_fault_of_the_place(moto: MotoServer) -> None:
    sink = S3Sink(S3Config(queue_url="q", **moto.s3_config()))
    with pytest.raises(OutputNotWritable) as raised:
        sink.write(job(bucket="no-such-bucket"), "x", DOCUMENT)
    # waited out until the bucket exists, never a failure of the document
    assert raised.value.retryable


def test_a_lone_surrogate_in_the_markdown_is_written_as_the_local_sink_writes_it(
    moto: MotoServer,
) -> None:
    """A model can answer with a lone surrogate, which strict UTF-8 cannot encode: the bucket's
    Markdown gets "?" for it, the bytes the local sink writes, rather than a failed document."""
    s3, sink = moto.client("s3"), S3Sink(S3Config(queue_url="q", **moto.s3_config()))
    s3.create_bucket(Bucket="docs")
    markdown = "<!-- page 1 -->\nbroken \ud800 reply\n"
    sink.write(job(), markdown, DOCUMENT)
    body, _ = get(s3, "docs", f"{KEY}.md")
    assert body == "<!-- page 1 -->\nbroken ? reply\n".encode() == markdown_bytes(markdown)
    assert sink.recorded(job()) == DOCUMENT["source"]


@pytest.mark.parametrize("server_name", ["moto", "rgw"])
def test_a_first_result_reads_no_key_that_does_not_exist_yet(
    server_name: str, request: pytest.FixtureRequest
) -> None:
    """The sink's calls for a document's first result, counted at the client: the one read
    ``recorded`` needs, then one listing stands for every sidecar and output key a write checks
    (it used to read each of them, six reads of keys not there), then the two PUTs."""
    server: MotoServer | RgwServer = request.getfixturevalue(server_name)
    bucket = f"counted-{server_name}"
    server.client("s3").create_bucket(Bucket=bucket)
    cfg = S3Config(transport="webhook", token="t", **server.s3_config())
    client = new_client(cfg, "s3")
    calls: list[tuple[str, str]] = []

    def count(params: dict[str, Any], model: Any, **kwargs: Any) -> None:
        calls.append((model.name, params.get("Key", params.get("Prefix", ""))))

    client.meta.events.register("before-parameter-build.s3", count)
    sink = S3Sink(cfg, client)
    assert sink.recorded(job(bucket=bucket)) is None
    sink.write(job(bucket=bucket), "<!-- page 1 -->\nGrüße\n", DOCUMENT)
    assert calls == [
        ("GetObject", f"{KEY}.json"),
        ("ListObjectsV2", f"{KEY}."),
        ("PutObject", f"{KEY}.md"),
        ("PutObject", f"{KEY}.json"),
    ]
    calls.clear()
    sink.write_error(job(bucket=bucket), ERROR)  # over a result: what is there is read, no other
    absent = (".error.json", ".ocr.pdf")
    assert [name for name, key in calls if key.endswith(absent)] == ["PutObject"]
    assert sink.recorded(job(bucket=bucket)) is None
    assert get(server.client("s3"), bucket, f"{KEY}.error.json")


def test_a_sidecar_nested_too_deep_for_the_parser_is_not_ocrwatchs_result(moto: MotoServer) -> None:
    """A JSON sidecar that opens as ocrwatch's and then nests deeper than Python's parser goes:
    nothing recorded, nothing to recall, and never a RecursionError out of the sink."""
    s3, sink = moto.client("s3"), S3Sink(S3Config(queue_url="q", **moto.s3_config()))
    s3.create_bucket(Bucket="docs")
    deep = b"[" * 200_000 + b"]" * 200_000
    nested = b'{"schema": "ocrwatch/1", "pages": ' + deep + b', "source": {}}'
    s3.put_object(Bucket="docs", Key=f"{KEY}.json", Body=nested)
    s3.put_object(Bucket="docs", Key=f"{KEY}.md", Body=b"<!-- page 1 -->\n")
    assert sink.recorded(job()) is None and sink.recall(job(), None) is None
    assert sink.status(job()) is None
    sink.write(job(), "<!-- page 1 -->\nx\n", DOCUMENT)  # opens with ocrwatch's schema: replaced
    assert sink.recorded(job()) == DOCUMENT["source"]


def test_an_edited_markdown_beside_ocrwatchs_json_is_the_users_as_it_is_locally(
    moto: MotoServer, tmp_path: Path
) -> None:
    """One mark rule for both sinks (the S3 copy used to take a Markdown as ocrwatch's by its JSON
    alone): a Markdown edited so it no longer opens with page 1 is the user's, in a bucket as beside
    a local file."""
    from ocrwatch.sinks.local import LocalSink
    from tests.test_sinks_local import job_for

    s3, sink = moto.client("s3"), S3Sink(S3Config(queue_url="q", **moto.s3_config()))
    s3.create_bucket(Bucket="docs")
    sink.write(job(), "<!-- page 1 -->\nold\n", DOCUMENT)
    s3.put_object(Bucket="docs", Key=f"{KEY}.md", Body=b"corrected by hand\n")
    with pytest.raises(OutputConflict, match="did not write"):
        sink.write(job(), "<!-- page 1 -->\nnew\n", DOCUMENT)
    assert get(s3, "docs", f"{KEY}.md")[0] == b"corrected by hand\n"

    source = tmp_path / "x.pdf"
    source.write_bytes(b"%PDF-1.4")
    local = LocalSink()  # no record of outputs: marks alone, as on S3
    local.write(job_for(source), "<!-- page 1 -->\nold\n", DOCUMENT)
    (tmp_path / "x.pdf.md").write_text("corrected by hand\n")
    with pytest.raises(OutputConflict):
        local.write(job_for(source), "<!-- page 1 -->\nnew\n", DOCUMENT)
    assert (tmp_path / "x.pdf.md").read_text() == "corrected by hand\n"
