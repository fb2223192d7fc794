"""archive: what becomes of a source once its document is ok, on real files and a real S3 server (moto).

Local files are moved and unlinked through folder descriptors; every test here checks what lies on disk
afterwards, and that nothing is touched when the document is not ok or the file is no longer what was read."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from ocrwatch.archive import Archiver, delete_local, move_local
from ocrwatch.config import InboxConfig, OutputConfig, S3Config
from ocrwatch.errors import SourceChanged, SourceGone
from ocrwatch.metrics import Metrics
from ocrwatch.sinks.local import LocalSink, dump_json
from ocrwatch.sources.base import Job, LocalFile, S3Object
from ocrwatch.sources.local import LocalSource
from tests.s3servers import MotoServer

CONTENT = b"%PDF-1.4 the bytes that were read\n%%EOF\n"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def document_files(folder: Path, name: str = "report.pdf", status: str = "ok") -> Path:
    """A source as the sinks leave it: Markdown linking a figure, the figure, a searchable PDF, the JSON."""
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / name
    source.write_bytes(CONTENT)
    (folder / f"{name}.md").write_text(f"<!-- page 1 -->\n\n![]({name}.assets/page-1-figure-1.png)\n")
    (folder / f"{name}.assets").mkdir()
    (folder / f"{name}.assets" / "page-1-figure-1.png").write_bytes(b"\x89PNG figure")
    (folder / f"{name}.ocr.pdf").write_bytes(b"%PDF searchable")
    body = {"schema": "ocrwatch/1", "status": status, "source": {"name": name, "sha256": sha(CONTENT)},
            "searchable_pdf": {"path": f"{name}.ocr.pdf"},
            "figures": [{"path": f"{name}.assets/page-1-figure-1.png"}],
            "pages": [{"markdown": f"![]({name}.assets/page-1-figure-1.png)"}]}  # fmt: skip
    (folder / f"{name}.json").write_bytes(dump_json(body))
    return source


def archiver(inbox: Path, archive: Path, on_success: str = "move", metrics: Metrics | None = None) -> Archiver:
    source = LocalSource([InboxConfig(path=inbox, on_success=on_success)], reconcile_seconds=60, name_template="{name}")
    cfg = OutputConfig(archive_dir=archive)
    return Archiver(cfg, {"local": source}, {"local": LocalSink()}, metrics or Metrics())


def local_job(path: Path, inbox: Path) -> Job:
    return Job(LocalFile(path, inbox.resolve()), "local")


def test_move_takes_the_sidecars_and_outputs_into_the_mirrored_folder(tmp_path: Path) -> None:
    inbox, archive = tmp_path / "scans", tmp_path / "archive"
    source = document_files(inbox / "2024" / "march")
    moved = archiver(inbox, archive).settle(local_job(source, inbox), "ok", sha(CONTENT), lambda: False)

    folder = archive / "scans" / "2024" / "march"
    assert moved == {"json": str(folder / "report.pdf.json"), "md": str(folder / "report.pdf.md")}
    assert sorted(p.name for p in folder.iterdir()) == [
        "report.pdf", "report.pdf.assets", "report.pdf.json", "report.pdf.md", "report.pdf.ocr.pdf",
    ]  # fmt: skip
    assert (folder / "report.pdf").read_bytes() == CONTENT
    assert (folder / "report.pdf.assets" / "page-1-figure-1.png").read_bytes() == b"\x89PNG figure"
    assert list((inbox / "2024" / "march").iterdir()) == []


def test_a_taken_name_moves_the_group_under_a_number_and_its_links_follow(tmp_path: Path) -> None:
    inbox, archive = tmp_path / "scans", tmp_path / "archive"
    first = document_files(inbox)
    archiver(inbox, archive).settle(local_job(first, inbox), "ok", sha(CONTENT), None)
    again = document_files(inbox)
    moved = archiver(inbox, archive).settle(local_job(again, inbox), "ok", sha(CONTENT), None)

    folder = archive / "scans"
    assert moved == {"json": str(folder / "report.1.pdf.json"), "md": str(folder / "report.1.pdf.md")}
    assert (folder / "report.pdf.md").read_text().endswith("![](report.pdf.assets/page-1-figure-1.png)\n")
    assert (folder / "report.1.pdf").read_bytes() == CONTENT
    assert "![](report.1.pdf.assets/page-1-figure-1.png)" in (folder / "report.1.pdf.md").read_text()
    assert (folder / "report.1.pdf.assets" / "page-1-figure-1.png").is_file()
    body = json.loads((folder / "report.1.pdf.json").read_text())
    assert body["searchable_pdf"]["path"] == "report.1.pdf.ocr.pdf" and (folder / "report.1.pdf.ocr.pdf").is_file()
    assert body["figures"][0]["path"] == "report.1.pdf.assets/page-1-figure-1.png"
    assert body["pages"][0]["markdown"] == "![](report.1.pdf.assets/page-1-figure-1.png)"
    assert not any(inbox.iterdir())


def test_move_across_filesystems_copies_what_was_verified(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another filesystem than the temporary folder")
    archive = Path(tempfile.mkdtemp(dir=shm))
    try:
        inbox = tmp_path / "scans"
        source = document_files(inbox)
        os.utime(source, ns=(1_000_000_000, 1_000_000_000))
        moved = move_local(source.resolve(), inbox.resolve(), sha(CONTENT), archive / "scans", "{name}", True)
        assert moved.read_bytes() == CONTENT and moved.stat().st_mtime_ns == 1_000_000_000
        assert (archive / "scans" / "report.pdf.assets" / "page-1-figure-1.png").is_file()
        assert not any(inbox.iterdir())
    finally:
        shutil.rmtree(archive)


def test_delete_removes_only_the_source(tmp_path: Path) -> None:
    inbox = tmp_path / "scans"
    source = document_files(inbox)
    metrics = Metrics()
    deleter = archiver(inbox, tmp_path / "archive", "delete", metrics)
    assert deleter.settle(local_job(source, inbox), "ok", sha(CONTENT), None) is None  # the sidecars stay
    assert metrics.registry.get_sample_value("ocrwatch_sources_archived_total", {"action": "delete"}) == 1
    assert sorted(p.name for p in inbox.iterdir()) == [
        "report.pdf.assets", "report.pdf.json", "report.pdf.md", "report.pdf.ocr.pdf",
    ]  # fmt: skip
    assert not (tmp_path / "archive").exists()


@pytest.mark.parametrize("action", ["move", "delete"])
def test_a_partial_document_stays(tmp_path: Path, action: str) -> None:
    inbox = tmp_path / "scans"
    source = document_files(inbox, status="partial")
    job = local_job(source, inbox)
    archiver(inbox, tmp_path / "archive", action).settle(job, "partial", sha(CONTENT), None)
    archiver(inbox, tmp_path / "archive", action).settle(job, None, sha(CONTENT), None)  # read from the JSON
    assert source.read_bytes() == CONTENT and not (tmp_path / "archive").exists()


@pytest.mark.parametrize("action", ["move", "delete"])
def test_a_file_changed_since_it_was_read_stays(tmp_path: Path, action: str) -> None:
    inbox = tmp_path / "scans"
    source = document_files(inbox)
    source.write_bytes(CONTENT + b"appended later")
    metrics = Metrics()
    refused = archiver(inbox, tmp_path / "archive", action, metrics)
    assert refused.settle(local_job(source, inbox), "ok", sha(CONTENT), None) is None
    failures = {"action": action, "reason": "changed"}
    assert metrics.registry.get_sample_value("ocrwatch_source_archive_failures_total", failures) == 1
    assert metrics.registry.get_sample_value("ocrwatch_sources_archived_total", {"action": action}) == 0
    assert source.read_bytes() == CONTENT + b"appended later"
    assert (inbox / "report.pdf.json").is_file() and not (tmp_path / "archive").exists()

    source.write_bytes(CONTENT)  # the very bytes again, but the fetch's own check says it was replaced
    archiver(inbox, tmp_path / "archive", action).settle(local_job(source, inbox), "ok", sha(CONTENT), lambda: True)
    assert source.exists()


def test_a_link_put_in_the_source_place_is_never_followed(tmp_path: Path) -> None:
    inbox, outside = tmp_path / "scans", tmp_path / "outside.pdf"
    source = document_files(inbox)
    outside.write_bytes(CONTENT)
    source.unlink()
    source.symlink_to(outside)
    with pytest.raises(SourceChanged):
        delete_local(source, inbox, sha(CONTENT))
    with pytest.raises(SourceChanged):
        move_local(source, inbox, sha(CONTENT), tmp_path / "archive", "{name}", True)
    assert outside.read_bytes() == CONTENT and source.is_symlink()
    source.unlink()
    with pytest.raises(SourceGone):
        delete_local(source, inbox, sha(CONTENT))


def test_sidecars_under_an_output_dir_stay_there(tmp_path: Path) -> None:
    inbox, archive = tmp_path / "scans", tmp_path / "archive"
    source = document_files(inbox)
    source_cfg = LocalSource([InboxConfig(path=inbox)], reconcile_seconds=60, name_template="{name}")
    mover = Archiver(OutputConfig(archive_dir=archive, on_success="move"), {"local": source_cfg},
                     {"local": LocalSink("{name}", tmp_path / "out")}, Metrics())  # fmt: skip
    assert mover.settle(local_job(source, inbox), "ok", sha(CONTENT), None) is None  # the hooks' paths stand
    assert sorted(p.name for p in (archive / "scans").iterdir()) == ["report.pdf"]


def test_keep_and_jobs_of_no_inbox_are_left_alone(tmp_path: Path) -> None:
    inbox = tmp_path / "scans"
    source = document_files(inbox)
    archiver(inbox, tmp_path / "archive", "keep").settle(local_job(source, inbox), "ok", sha(CONTENT), None)
    cli = Archiver(OutputConfig(on_success="delete"), {}, {}, Metrics())
    cli.settle(Job(LocalFile(source, inbox), "ocr-1"), "ok", sha(CONTENT), None)
    assert source.read_bytes() == CONTENT


# --- S3 ---------------------------------------------------------------------------------------------------


class _S3Source:
    """What the archiver asks of an S3 source: its configuration and its client."""

    def __init__(self, server: MotoServer, **cfg: Any) -> None:
        self.cfg = S3Config(**server.s3_config(queue_url="http://unused", **cfg))
        self.client = server.client("s3")


def s3_archiver(server: MotoServer, **cfg: Any) -> Archiver:
    return Archiver(OutputConfig(), {"s3:0": _S3Source(server, **cfg)}, {}, Metrics())  # type: ignore[dict-item]


def put(server: MotoServer, bucket: str, key: str, body: bytes = CONTENT) -> S3Object:
    response = server.client("s3").put_object(Bucket=bucket, Key=key, Body=body)
    return S3Object(bucket, key, etag=response["ETag"].strip('"'), version_id=response.get("VersionId"))


def keys(server: MotoServer, bucket: str) -> list[str]:
    return sorted(item["Key"] for item in server.client("s3").list_objects_v2(Bucket=bucket).get("Contents", []))


def test_s3_delete_and_move(moto: MotoServer) -> None:
    s3 = moto.client("s3")
    s3.create_bucket(Bucket="docs")
    gone = put(moto, "docs", "in/a.pdf")
    s3_archiver(moto, on_success="delete").settle(Job(gone, "s3:0"), "ok", None, None)
    moved = put(moto, "docs", "in/b.pdf")
    mover = s3_archiver(moto, on_success="move", archive_prefix="done/")
    assert mover.settle(Job(moved, "s3:0"), "ok", None, None) is None  # its sidecars stay at their keys
    assert keys(moto, "docs") == ["done/in/b.pdf"]
    assert s3.get_object(Bucket="docs", Key="done/in/b.pdf")["Body"].read() == CONTENT

    replaced = put(moto, "docs", "in/c.pdf")
    put(moto, "docs", "in/c.pdf", b"a new version")
    s3_archiver(moto, on_success="delete").settle(Job(replaced, "s3:0"), "ok", None, None)
    s3_archiver(moto, on_success="move", archive_prefix="done/").settle(Job(replaced, "s3:0"), "ok", None, None)
    partial = put(moto, "docs", "in/d.pdf")
    s3_archiver(moto, on_success="delete").settle(Job(partial, "s3:0"), "partial", None, None)
    assert keys(moto, "docs") == ["done/in/b.pdf", "in/c.pdf", "in/d.pdf"]


def test_s3_versioned_bucket_acts_on_the_version_read(moto: MotoServer) -> None:
    s3 = moto.client("s3")
    s3.create_bucket(Bucket="versioned")
    s3.put_bucket_versioning(Bucket="versioned", VersioningConfiguration={"Status": "Enabled"})
    read = put(moto, "versioned", "scan.pdf")
    assert read.version_id
    newer = put(moto, "versioned", "scan.pdf", b"written after the read")
    s3_archiver(moto, on_success="move", archive_prefix="archive/").settle(Job(read, "s3:0"), "ok", None, None)

    assert s3.get_object(Bucket="versioned", Key="archive/scan.pdf")["Body"].read() == CONTENT
    versions = s3.list_object_versions(Bucket="versioned", Prefix="scan.pdf")["Versions"]
    assert [v["VersionId"] for v in versions] == [newer.version_id]  # the version read is gone, the newer stays
    assert s3.get_object(Bucket="versioned", Key="scan.pdf")["Body"].read() == b"written after the read"
