"""S3Sink against real servers on 127.0.0.1 (moto_server; Ceph RGW where installed)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from ocrwatch.config import S3Config
from ocrwatch.errors import NameTooLong, OutputConflict, OutputNotWritable
from ocrwatch.infra.s3client import new_client
from ocrwatch.sinks.base import markdown_bytes
from ocrwatch.sinks.s3 import S3Sink, shares_output
from ocrwatch.sources.base import Job, S3Object
from ocrwatch.store.written import object_record
from tests.support.s3servers import MotoServer, RgwServer

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
        # the record of what ocrwatch wrote, and for which source (bucket and key)
        **object_record(f"s3://docs/{KEY}", hashlib.md5(markdown).hexdigest()),
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
    # the key fits S3's 1024 bytes, its sidecar's does not (moto does not check)
    with pytest.raises(NameTooLong):
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
    assert body == b"<!-- page 1 -->\nbroken ? reply\n" == markdown_bytes(markdown)
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
    older = {"ocrwatch-source-etag": "abc123"}  # as an ocrwatch older than the record wrote them
    s3.put_object(Bucket="docs", Key=f"{KEY}.json", Body=nested, Metadata=older)
    s3.put_object(Bucket="docs", Key=f"{KEY}.md", Body=b"<!-- page 1 -->\n", Metadata=older)
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


# --- whose an object is: the record each output carries, for its source's bucket and key ---------


def tenants(server: MotoServer | RgwServer, shared: str, *buckets: str) -> list[S3Config]:
    """One ``[[s3]]`` table per bucket, all writing into the output bucket ``shared``."""
    s3 = server.client("s3")
    for bucket in (shared, *buckets):
        s3.create_bucket(Bucket=bucket)
    return [
        S3Config(
            transport="webhook", token="t", bucket=b, output_bucket=shared, **server.s3_config()
        )
        for b in buckets
    ]


def result(uri: str, text: str) -> tuple[str, dict[str, Any]]:
    return f"<!-- page 1 -->\n{text}\n", DOCUMENT | {"source": {"uri": uri, "etag": "abc123"}}


@pytest.mark.parametrize("template", ["{name}", "{stem}"])
@pytest.mark.parametrize("server_name", ["moto", "rgw"])
def test_two_buckets_sharing_an_output_bucket_keep_their_own_sidecars(
    server_name: str, template: str, request: pytest.FixtureRequest
) -> None:
    """Two tables, one ``output_bucket``: each source bucket's sidecars under a folder of its own,
    so the same key in both never shares a sidecar (each used to overwrite the other's, all ok)."""
    server: MotoServer | RgwServer = request.getfixturevalue(server_name)
    shared = f"shared-{server_name}-{template.strip('{}')}"
    tables = tenants(server, shared, f"{shared}-a", f"{shared}-b")
    s3, done = server.client("s3"), {}
    for cfg, bucket in zip(tables, (f"{shared}-a", f"{shared}-b"), strict=True):
        sink, mine = S3Sink(cfg, name_template=template, tables=tables), job("in/scan.pdf", bucket)
        sink.write(mine, *result(mine.origin.uri, f"text of {bucket}"))
        done[bucket] = sink, mine
    for bucket, (sink, mine) in done.items():
        where, keys = sink.location(mine)
        assert where == shared and keys["md"].startswith(f"{bucket}/in/scan.")
        assert get(s3, shared, keys["md"])[0].decode() == f"<!-- page 1 -->\ntext of {bucket}\n"
        assert (sink.recorded(mine) or {})["uri"] == f"s3://{bucket}/in/scan.pdf"


@pytest.mark.parametrize(
    ("template", "other"), [("{name}", "in/scan.pdf"), ("{stem}", "in/scan.png")]
)
@pytest.mark.parametrize("server_name", ["moto", "rgw"])
def test_what_the_configuration_cannot_keep_apart_the_record_does(
    server_name: str, template: str, other: str, request: pytest.FixtureRequest
) -> None:
    """One table whose events come from two buckets (``bucket`` unset) into one output bucket: the
    second source whose sidecars take the first's keys is ``output_conflict``, naming the first,
    and neither counts as done, nor is recalled, by the other's result; the first's stays whole."""
    server: MotoServer | RgwServer = request.getfixturevalue(server_name)
    shared = f"one-{server_name}-{template.strip('{}')}"
    (cfg,) = tenants(server, shared, f"{shared}-a")
    cfg = cfg.model_copy(update={"bucket": None})
    s3, sink = server.client("s3"), S3Sink(cfg, name_template=template, tables=[cfg])
    first, second = job("in/scan.pdf", f"{shared}-a"), job(other, f"{shared}-b")
    sink.write(first, *result(first.origin.uri, "the first"))
    _, keys = sink.location(first)
    before = {key: get(s3, shared, key)[0] for key in (keys["md"], keys["json"])}

    assert sink.recorded(second) is None and sink.recall(second, None) is None
    assert sink.status(second) is None
    with pytest.raises(OutputConflict, match=f"ocrwatch's output for {first.origin.uri}"):
        sink.write(second, *result(second.origin.uri, "the second"))
    sink.write_error(second, ERROR)  # its error sidecar: the first's result is not its to remove
    assert {key: get(s3, shared, key)[0] for key in before} == before
    assert (sink.recorded(first) or {})["uri"] == first.origin.uri

    # a new version of the first source replaces its own, from another daemon too (the record
    # travels with the object, not in one host's ledger)
    newer = Job(S3Object(f"{shared}-a", "in/scan.pdf", etag="e2", size=10), "s3")
    S3Sink(cfg, name_template=template, tables=[cfg]).write(newer, *result(newer.origin.uri, "v2"))
    assert get(s3, shared, sink.location(first)[1]["md"])[0] == b"<!-- page 1 -->\nv2\n"


@pytest.mark.parametrize("server_name", ["moto", "rgw"])
def test_a_users_object_at_a_sidecar_key_in_a_shared_output_bucket_stays(
    server_name: str, request: pytest.FixtureRequest
) -> None:
    """Whatever a user put at a sidecar's key stays, ocrwatch's mark copied into it or not, and so
    does ocrwatch's own Markdown once a user edited it (its page mark kept): only the record the
    object carries, matching its bytes, makes it ocrwatch's."""
    server: MotoServer | RgwServer = request.getfixturevalue(server_name)
    shared = f"users-{server_name}"
    tables = tenants(server, shared, f"{shared}-a", f"{shared}-b")
    s3, sink = server.client("s3"), S3Sink(tables[0], tables=tables)
    mine = job("in/scan.pdf", f"{shared}-a")
    _, keys = sink.location(mine)
    planted = {
        keys["md"]: b"<!-- page 1 -->\nmy own notes, in ocrwatch's shape\n",
        keys["json"]: json.dumps(DOCUMENT | {"source": {"uri": mine.origin.uri}}).encode(),
    }
    for key, body in planted.items():
        s3.put_object(Bucket=shared, Key=key, Body=body)
        with pytest.raises(OutputConflict, match="an object ocrwatch did not write"):
            sink.write(mine, *result(mine.origin.uri, "ocr"))
        assert get(s3, shared, key)[0] == body
        assert sink.recorded(mine) is None
        sink.write_error(mine, ERROR)
        assert get(s3, shared, key)[0] == body
        s3.delete_object(Bucket=shared, Key=key)
    s3.delete_object(Bucket=shared, Key=keys["error"])

    sink.write(mine, *result(mine.origin.uri, "ocr"))
    edited = b"<!-- page 1 -->\nocr, corrected by hand\n"
    s3.put_object(Bucket=shared, Key=keys["md"], Body=edited)  # the record is not the user's
    with pytest.raises(OutputConflict, match="an object ocrwatch did not write"):
        sink.write(mine, *result(mine.origin.uri, "ocr again"))
    sink.write_error(mine, ERROR)
    assert get(s3, shared, keys["md"])[0] == edited


def test_an_object_whose_etag_is_no_md5_is_judged_by_its_bytes(moto: MotoServer) -> None:
    """Where the server's ETag is not the MD5 of the bytes (SSE-KMS; here a multipart upload), the
    bytes are read again and compared with the MD5 the record holds."""
    s3, sink = moto.client("s3"), S3Sink(S3Config(queue_url="q", **moto.s3_config()))
    s3.create_bucket(Bucket="docs")
    markdown = b"<!-- page 1 -->\nwritten in parts\n"

    def multipart(key: str, md5: str) -> None:
        record = object_record(f"s3://docs/{KEY}", md5)
        upload = s3.create_multipart_upload(Bucket="docs", Key=key, Metadata=record)["UploadId"]
        part = s3.upload_part(Bucket="docs", Key=key, UploadId=upload, PartNumber=1, Body=markdown)
        parts = {"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]}
        s3.complete_multipart_upload(Bucket="docs", Key=key, UploadId=upload, MultipartUpload=parts)

    multipart(f"{KEY}.md", hashlib.md5(markdown).hexdigest())
    assert "-" in s3.head_object(Bucket="docs", Key=f"{KEY}.md")["ETag"]
    sink.write(job(), "<!-- page 1 -->\nnew\n", DOCUMENT)
    assert get(s3, "docs", f"{KEY}.md")[0] == b"<!-- page 1 -->\nnew\n"

    multipart(f"{KEY}.md", hashlib.md5(b"other bytes").hexdigest())
    with pytest.raises(OutputConflict, match="changed since ocrwatch wrote it"):
        sink.write(job(), "<!-- page 1 -->\nnewer\n", DOCUMENT)
    assert get(s3, "docs", f"{KEY}.md")[0] == markdown


def test_a_folder_per_bucket_only_where_tables_share_an_output_bucket() -> None:
    def table(**keys: Any) -> S3Config:
        return S3Config(queue_url="q", **keys)

    a, b = table(bucket="a", output_bucket="out"), table(bucket="b", output_bucket="out")
    assert shares_output(a, [a, b]) and shares_output(b, [b, a])
    assert not shares_output(a, [a]) and not shares_output(a, [a, table(bucket="b")])
    # another table that reads any bucket; one that writes beside its keys in the output bucket
    assert shares_output(a, [a, table(output_bucket="out")])
    assert shares_output(a, [a, table(bucket="out")])
    # the same bucket read twice is one tenant; prefixes that do not overlap keep them apart
    assert not shares_output(a, [a, table(bucket="a", output_bucket="out", prefix="x/")])
    apart = [table(bucket=n, output_bucket="out", output_prefix=f"{n}/") for n in "ab"]
    assert not shares_output(apart[0], apart)
    nested = [
        table(bucket="a", output_bucket="out"),
        table(bucket="b", output_bucket="out", output_prefix="r/"),
    ]
    assert shares_output(nested[0], nested) and shares_output(nested[1], nested)
    # a table writing beside its keys gets no folder
    assert not shares_output(table(bucket="out"), [table(bucket="out"), a])
