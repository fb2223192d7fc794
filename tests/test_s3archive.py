"""s3archive: an S3 archive move never replaces an object at its key, on real servers (moto, and
Ceph RGW where installed), through the archiver as the pipeline calls it."""

from __future__ import annotations

import pytest
import structlog

from ocrwatch.jobs import s3archive
from ocrwatch.sources.base import Job
from tests.support.s3servers import MotoServer, RgwServer
from tests.test_archive import keys, put, s3_archiver

pytestmark = pytest.mark.s3


def archived(server: MotoServer | RgwServer, bucket: str, prefix: str) -> dict[str, bytes]:
    s3 = server.client("s3")
    found = s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return {o["Key"]: s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in found}


@pytest.mark.parametrize("versioned", [False, True])
@pytest.mark.parametrize("server_name", ["moto", "rgw"])
def test_s3_a_move_never_replaces_an_object_at_the_archive_key(
    server_name: str, versioned: bool, request: pytest.FixtureRequest
) -> None:
    """A user's own object at ``archive_prefix`` + key, then the archive of the key's first
    version: each stays, and each later version gets a numbered key of its own (``stem.N.suffix``,
    as the local archive numbers a taken name). A move used to copy over both."""
    server: MotoServer | RgwServer = request.getfixturevalue(server_name)
    s3, bucket = server.client("s3"), f"moved-{server_name}-{int(versioned)}"
    s3.create_bucket(Bucket=bucket)
    if versioned:
        s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    s3.put_object(Bucket=bucket, Key="done/in/scan.pdf", Body=b"the user's own")
    mover = s3_archiver(server, on_success="move", archive_prefix="done/")
    for number, body in ((1, b"version 1"), (2, b"version 2")):
        read = put(server, bucket, "in/scan.pdf", body)
        moved = mover.apply_on_success(Job(read, "s3:0"), "ok", None, None)
        assert moved == {"source": f"s3://{bucket}/done/in/scan.{number}.pdf"}
    assert archived(server, bucket, "done/") == {
        "done/in/scan.pdf": b"the user's own",
        "done/in/scan.1.pdf": b"version 1",
        "done/in/scan.2.pdf": b"version 2",
    }
    assert keys(server, bucket) == sorted(archived(server, bucket, "done/"))
    if versioned:  # the empty object that claimed each key is gone, not kept as a version of it
        versions = s3.list_object_versions(Bucket=bucket, Prefix="done/").get("Versions", [])
        assert sorted(v["Key"] for v in versions) == sorted(archived(server, bucket, "done/"))


@pytest.mark.parametrize("server_name", ["moto", "rgw"])
def test_s3_a_move_that_fails_leaves_no_claim_behind(
    server_name: str, request: pytest.FixtureRequest
) -> None:
    """The version read is gone once the key is claimed: the move fails as ``gone`` and the claim
    goes with it."""
    server: MotoServer | RgwServer = request.getfixturevalue(server_name)
    s3, bucket = server.client("s3"), f"claims-{server_name}"
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    read = put(server, bucket, "scan.pdf")
    assert read.version_id
    s3.delete_object(Bucket=bucket, Key="scan.pdf", VersionId=read.version_id)
    mover = s3_archiver(server, on_success="move", archive_prefix="done/")
    assert mover.apply_on_success(Job(read, "s3:0"), "ok", None, None) is None
    assert "Versions" not in s3.list_object_versions(Bucket=bucket, Prefix="done/")


def test_s3_a_key_taken_under_every_number_tried_keeps_the_source(
    moto: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the numbers a move tries, the source stays where it is and the log says why."""
    monkeypatch.setattr(s3archive, "ARCHIVE_NUMBERS", 2)
    s3 = moto.client("s3")
    s3.create_bucket(Bucket="full")
    for key in ("done/scan.pdf", "done/scan.1.pdf"):
        s3.put_object(Bucket="full", Key=key, Body=b"taken")
    read = put(moto, "full", "scan.pdf")
    mover = s3_archiver(moto, on_success="move", archive_prefix="done/")
    with structlog.testing.capture_logs() as logs:
        assert mover.apply_on_success(Job(read, "s3:0"), "ok", None, None) is None
    assert [(e["event"], e["kind"]) for e in logs] == [("source_not_archived", "output_conflict")]
    assert keys(moto, "full") == ["done/scan.1.pdf", "done/scan.pdf", "scan.pdf"]
