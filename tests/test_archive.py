"""archive: what becomes of a source once its document is ok, on real files and a real S3 server
(moto).

Local files are moved and unlinked through folder descriptors; the outputs that go along are those
the record of outputs holds as the document's, written here by the real local sink. Every test
checks what lies on disk afterwards, and that nothing is touched when the document is not ok, the
file is no longer what was read, it has another name, or a process still holds it open for writing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from ocrwatch.config import InboxConfig, OutputConfig, S3Config
from ocrwatch.errors import SourceChanged, SourceGone, SourceInUse
from ocrwatch.infra.metrics import Metrics
from ocrwatch.jobs.archive import Archiver, delete_local
from ocrwatch.jobs.quarantine import move
from ocrwatch.safefs import FolderGone
from ocrwatch.sinks.base import dump_json
from ocrwatch.sinks.local import LocalSink
from ocrwatch.sources import sourcefile
from ocrwatch.sources.base import Job, LocalFile, Quarantine, S3Object
from ocrwatch.sources.local import LocalSource
from ocrwatch.store.ledger import Ledger
from ocrwatch.store.written import Written
from tests.support.s3servers import MotoServer, RgwServer
from tests.support.sparse import TIB, Reads

CONTENT = b"%PDF-1.4 the bytes that were read\n%%EOF\n"
FIGURE = "page-1-figure-1.png"
OTHER_UID = (
    54321  # a user of the files, not the daemon's (root): no account is needed to own a file
)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


READ = sourcefile.Content(len(CONTENT), sha(CONTENT))
"""What the document's run read: the size and sha256 its JSON sidecar records."""
RECORDED = {"bytes": READ.size, "sha256": READ.sha256}


@pytest.fixture
def written(tmp_path: Path) -> Iterator[Written]:
    with Ledger(tmp_path / "state" / "ledger.sqlite3") as ledger:
        yield Written(ledger)


def local_job(path: Path, inbox: Path) -> Job:
    return Job(LocalFile(path.resolve(), inbox.resolve()), "local")


def document_files(
    folder: Path,
    inbox: Path,
    written: Written | None,
    name: str = "report.pdf",
    status: str = "ok",
    owner: int = 0,
    mode: int = 0o644,
    out: Path | None = None,
) -> Path:
    """A source of ``owner`` and what the real sink writes for it (the record kept in ``written``):
    Markdown linking a figure, the figure, a searchable PDF, the JSON; beside it, or under ``out``
    (``[output] dir``)."""
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / name
    source.write_bytes(CONTENT)
    os.chown(source, owner, owner)
    source.chmod(mode)
    body = {
        "schema": "ocrwatch/1",
        "status": status,
        "source": {"name": name, **RECORDED},
        "searchable_pdf": {"path": f"{name}.ocr.pdf"},
        "figures": [{"path": f"{name}.assets/{FIGURE}"}],
        "pages": [{"markdown": f"![]({name}.assets/{FIGURE})"}],
    }
    extras = {f"{name}.ocr.pdf": b"%PDF searchable", f"{name}.assets/{FIGURE}": b"\x89PNG figure"}
    markdown = f"<!-- page 1 -->\n\n![]({name}.assets/{FIGURE})\n"
    LocalSink(out_dir=out, written=written).write(local_job(source, inbox), markdown, body, extras)
    return source


def archiver(
    inbox: Path,
    archive: Path,
    written: Written | None,
    on_success: str = "move",
    metrics: Metrics | None = None,
) -> Archiver:
    source = LocalSource(
        [InboxConfig(path=inbox, on_success=on_success)],
        reconcile_seconds=60,
        name_template="{name}",
    )
    archive.mkdir(exist_ok=True)  # as the daemon's start makes it (roots.prepare)
    cfg = OutputConfig(archive_dir=archive)
    return Archiver(
        cfg, {"local": source}, {"local": LocalSink(written=written)}, metrics or Metrics(), written
    )


def test_move_takes_the_recorded_outputs_into_the_mirrored_folder_and_their_records_follow(
    tmp_path: Path, written: Written
) -> None:
    inbox, archive = tmp_path / "scans", tmp_path / "archive"
    source = document_files(inbox / "2024" / "march", inbox, written)
    job = local_job(source, inbox)
    moved = archiver(inbox, archive, written).apply_on_success(
        job, "ok", sha(CONTENT), lambda: False
    )

    folder = archive / "scans" / "2024" / "march"
    assert moved == {
        "source": (folder / "report.pdf").as_uri(),
        "json": str(folder / "report.pdf.json"),
        "md": str(folder / "report.pdf.md"),
    }
    assert sorted(p.name for p in folder.iterdir()) == [
        "report.pdf",
        "report.pdf.assets",
        "report.pdf.json",
        "report.pdf.md",
        "report.pdf.ocr.pdf",
    ]
    assert (folder / "report.pdf").read_bytes() == CONTENT
    assert (folder / "report.pdf.assets" / FIGURE).read_bytes() == b"\x89PNG figure"
    assert list((inbox / "2024" / "march").iterdir()) == []
    rows = {(row.root, row.name): row.inode for row in written.of_job(job.key)}
    assert set(rows) == {
        (archive.resolve(), f"scans/2024/march/{name}")
        for name in (
            "report.pdf.md",
            "report.pdf.ocr.pdf",
            f"report.pdf.assets/{FIGURE}",
            "report.pdf.json",
        )
    }
    assert (
        rows[(archive.resolve(), "scans/2024/march/report.pdf.json")]
        == (folder / "report.pdf.json").stat().st_ino
    )


def test_a_taken_name_moves_the_group_under_a_number_and_its_links_follow(
    tmp_path: Path, written: Written
) -> None:
    inbox, archive = tmp_path / "scans", tmp_path / "archive"
    first = document_files(inbox, inbox, written)
    archiver(inbox, archive, written).apply_on_success(
        local_job(first, inbox), "ok", sha(CONTENT), None
    )
    again = document_files(inbox, inbox, written, owner=OTHER_UID, mode=0o640)
    moved = archiver(inbox, archive, written).apply_on_success(
        local_job(again, inbox), "ok", sha(CONTENT), None
    )

    folder = archive / "scans"
    assert moved == {
        "source": (folder / "report.1.pdf").as_uri(),
        "json": str(folder / "report.1.pdf.json"),
        "md": str(folder / "report.1.pdf.md"),
    }
    assert (folder / "report.pdf.md").read_text().endswith(f"![](report.pdf.assets/{FIGURE})\n")
    assert (folder / "report.1.pdf").read_bytes() == CONTENT
    assert f"![](report.1.pdf.assets/{FIGURE})" in (folder / "report.1.pdf.md").read_text()
    assert (folder / "report.1.pdf.assets" / FIGURE).is_file()
    body = json.loads((folder / "report.1.pdf.json").read_text())
    assert (
        body["searchable_pdf"]["path"] == "report.1.pdf.ocr.pdf"
        and (folder / "report.1.pdf.ocr.pdf").is_file()
    )
    assert body["figures"][0]["path"] == f"report.1.pdf.assets/{FIGURE}"
    assert body["pages"][0]["markdown"] == f"![](report.1.pdf.assets/{FIGURE})"
    # written anew with the source's access
    for rewritten in (
        "report.1.pdf.md",
        "report.1.pdf.json",
    ):
        info = (folder / rewritten).stat()
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (OTHER_UID, 0o640), rewritten
    row = [
        r
        for r in written.of_job(local_job(again, inbox).key)
        if r.name == "scans/report.1.pdf.json"
    ]
    assert row and row[0].sha256 == sha((folder / "report.1.pdf.json").read_bytes())
    assert not any(inbox.iterdir())


def test_move_takes_only_what_the_record_holds_as_the_documents(
    tmp_path: Path, written: Written
) -> None:
    """Bob's own ``report.png.ocr.pdf`` and ``report.png.assets/chapter1.txt`` beside Alice's
    ``report.png``, and a file carrying ocrwatch's mark but not the daemon's user's, stay where they
    are, with their owners."""
    inbox, archive = tmp_path / "inbox", tmp_path / "archive"
    inbox.mkdir()
    source = inbox / "report.png"
    source.write_bytes(CONTENT)
    job = local_job(source, inbox)
    (inbox / "report.png.ocr.pdf").write_bytes(b"%PDF Bob's own")
    (inbox / "report.png.assets").mkdir()
    (inbox / "report.png.assets" / "chapter1.txt").write_text("Bob's chapter")
    (inbox / "report.png.assets" / FIGURE).write_bytes(b"\x89PNG not ocrwatch's")
    for bobs in (inbox / "report.png.ocr.pdf", inbox / "report.png.assets" / "chapter1.txt"):
        os.chown(bobs, OTHER_UID, OTHER_UID)
    LocalSink(written=written).write(
        job,
        "<!-- page 1 -->\n\ntext\n",
        {"schema": "ocrwatch/1", "status": "ok", "source": RECORDED},
    )
    # the owner's own change stays ocrwatch's file: the record says whose
    (inbox / "report.png.md").chmod(0o600)

    archiver(inbox, archive, written).apply_on_success(job, "ok", sha(CONTENT), None)
    assert sorted(p.name for p in (archive / "inbox").iterdir()) == [
        "report.png",
        "report.png.json",
        "report.png.md",
    ]
    assert (inbox / "report.png.ocr.pdf").read_bytes() == b"%PDF Bob's own"
    assert (inbox / "report.png.ocr.pdf").stat().st_uid == OTHER_UID
    assert sorted(p.name for p in (inbox / "report.png.assets").iterdir()) == [
        "chapter1.txt",
        FIGURE,
    ]


def test_an_output_written_before_the_record_goes_along_only_by_its_mark_and_the_daemons_owner(
    tmp_path: Path, written: Written
) -> None:
    inbox, archive = tmp_path / "scans", tmp_path / "archive"
    source = document_files(inbox, inbox, None)  # an older ocrwatch: no record
    # marked, but not the daemon's user's: a user's file
    os.chown(inbox / "report.pdf.md", OTHER_UID, OTHER_UID)
    job = local_job(source, inbox)
    archiver(inbox, archive, written).apply_on_success(job, "ok", sha(CONTENT), None)
    assert (inbox / "report.pdf.md").exists() and not (archive / "scans" / "report.pdf.md").exists()
    assert (archive / "scans" / "report.pdf.json").exists() and (
        archive / "scans" / "report.pdf.ocr.pdf"
    ).exists()
    assert {row.name for row in written.of_job(job.key)} == {
        "scans/report.pdf.json",
        "scans/report.pdf.ocr.pdf",
    }


def test_move_across_filesystems_keeps_owner_mode_and_times_and_folders_no_more_readable(
    tmp_path: Path, written: Written
) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another filesystem than the temporary folder")
    archive = Path(tempfile.mkdtemp(dir=shm))
    try:
        inbox = tmp_path / "scans"
        private = inbox / "alice"
        private.mkdir(parents=True)
        os.chown(private, OTHER_UID, OTHER_UID)
        private.chmod(0o700)
        source = private / "report.pdf"
        source.write_bytes(CONTENT)
        os.chown(source, OTHER_UID, OTHER_UID)
        source.chmod(0o600)
        os.utime(source, ns=(1_000_000_000, 1_000_000_000))
        job = local_job(source, inbox)
        LocalSink(written=written).write(
            job, "<!-- page 1 -->\n", {"schema": "ocrwatch/1", "status": "ok", "source": RECORDED}
        )
        archiver(inbox, archive, written).apply_on_success(job, "ok", sha(CONTENT), None)

        moved = archive / "scans" / "alice" / "report.pdf"
        assert moved.read_bytes() == CONTENT and moved.stat().st_mtime_ns == 1_000_000_000
        for path, mode in (
            (moved, 0o600),
            (moved.with_name("report.pdf.md"), 0o600),
            (moved.parent, 0o700),
        ):
            info = path.stat()
            assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (
                OTHER_UID,
                OTHER_UID,
                mode,
            ), path
        assert not any(private.iterdir())
    finally:
        shutil.rmtree(archive)


def test_delete_removes_only_the_source(tmp_path: Path, written: Written) -> None:
    inbox = tmp_path / "scans"
    source = document_files(inbox, inbox, written)
    metrics = Metrics()
    deleter = archiver(inbox, tmp_path / "archive", written, "delete", metrics)
    # The source is no more; the sidecars stay where the hooks are told they are.
    assert deleter.apply_on_success(local_job(source, inbox), "ok", sha(CONTENT), None) == {
        "source": ""
    }
    assert (
        metrics.registry.get_sample_value("ocrwatch_sources_archived_total", {"action": "delete"})
        == 1
    )
    assert sorted(p.name for p in inbox.iterdir()) == [
        "report.pdf.assets",
        "report.pdf.json",
        "report.pdf.md",
        "report.pdf.ocr.pdf",
    ]
    assert list((tmp_path / "archive").iterdir()) == []


@pytest.mark.parametrize("action", ["move", "delete"])
def test_a_source_with_another_name_is_kept(tmp_path: Path, written: Written, action: str) -> None:
    inbox = tmp_path / "scans"
    source = document_files(inbox, inbox, written)
    os.link(source, tmp_path / "elsewhere.pdf")
    with structlog.testing.capture_logs() as logs:
        archiver(inbox, tmp_path / "archive", written, action).apply_on_success(
            local_job(source, inbox), "ok", sha(CONTENT), None
        )
    assert source.read_bytes() == CONTENT and (inbox / "report.pdf.json").exists()
    assert [e["reason"] for e in logs if e["event"] == "source_kept"] == ["hard_linked"]


@pytest.mark.parametrize("action", ["move", "delete"])
def test_a_source_held_open_for_writing_is_kept_until_it_is_closed(
    tmp_path: Path, written: Written, action: str
) -> None:
    inbox = tmp_path / "scans"
    source = document_files(inbox, inbox, written)
    job = local_job(source, inbox)
    metrics = Metrics()
    writer = open(source, "ab")  # noqa: SIM115 - held open across the first settle
    with structlog.testing.capture_logs() as logs:
        archiver(inbox, tmp_path / "archive", written, action, metrics).apply_on_success(
            job, "ok", sha(CONTENT), None
        )
    assert source.read_bytes() == CONTENT
    assert [e["reason"] for e in logs if e["event"] == "source_kept"] == ["open_for_writing"]
    assert (
        metrics.registry.get_sample_value(
            "ocrwatch_source_archive_failures_total", {"action": action, "reason": "in_use"}
        )
        == 1
    )
    writer.close()
    archiver(inbox, tmp_path / "archive", written, action).apply_on_success(
        job, "ok", sha(CONTENT), None
    )
    assert not source.exists()


def test_a_writer_opening_the_source_during_the_delete_keeps_it(
    tmp_path: Path, written: Written
) -> None:
    """The lease is taken before the final check: a writer opening the file meanwhile waits, and is
    seen."""
    inbox = tmp_path / "scans"
    source = document_files(inbox, inbox, written)
    with (
        pytest.raises(SourceInUse) as kept,
        sourcefile.folders_of(source, inbox) as folders,
        sourcefile.held(folders[-1], source, READ) as held,
    ):
        pid = os.fork()
        if pid == 0:  # the writer: its open waits for the lease to go
            with open(source, "ab") as late:
                late.write(b"later bytes")
            os._exit(0)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(SourceInUse):
                held.check()
                time.sleep(0.02)
                continue
            break
        folders[-1].remove_if(source.name, held.info, held.check)
    assert kept.value.reason == "open_for_writing"
    assert os.waitpid(pid, 0)[1] == 0
    assert source.read_bytes() == CONTENT + b"later bytes", "nothing was lost"


def test_without_a_lease_a_delete_waits_for_quiet_and_is_tried_again(
    tmp_path: Path, written: Written, monkeypatch: pytest.MonkeyPatch
) -> None:
    @contextlib.contextmanager
    def no_lease(fd: int) -> Iterator[None]:
        yield None  # as on NFS or SMB

    monkeypatch.setattr(sourcefile, "read_lease", no_lease)
    monkeypatch.setattr(sourcefile, "QUIET_WITHOUT_LEASE", 1.5)
    inbox = tmp_path / "scans"
    source = document_files(inbox, inbox, written)
    with structlog.testing.capture_logs() as logs:
        archiver(inbox, tmp_path / "archive", written, "delete").apply_on_success(
            local_job(source, inbox), "ok", sha(CONTENT)
        )
        assert source.exists()
        deadline = time.monotonic() + 10
        # The timer's thread logs the deletion just after it unlinks the file.
        while not any(e["event"] == "source_deleted" for e in logs) and time.monotonic() < deadline:
            time.sleep(0.1)
    assert not source.exists()
    assert [e["event"] for e in logs if e["event"].startswith("source_")] == [
        "source_kept",
        "source_deleted",
    ]
    assert logs[0]["reason"] == "not_quiet"


@pytest.mark.parametrize("action", ["move", "delete"])
def test_a_partial_document_stays(tmp_path: Path, written: Written, action: str) -> None:
    inbox = tmp_path / "scans"
    source = document_files(inbox, inbox, written, status="partial")
    job = local_job(source, inbox)
    archiver(inbox, tmp_path / "archive", written, action).apply_on_success(
        job, "partial", sha(CONTENT), None
    )
    # from the JSON
    archiver(inbox, tmp_path / "archive", written, action).apply_on_success(
        job, None, sha(CONTENT), None
    )
    assert source.read_bytes() == CONTENT and list((tmp_path / "archive").iterdir()) == []


@pytest.mark.parametrize("action", ["move", "delete"])
def test_a_file_changed_since_it_was_read_stays(
    tmp_path: Path, written: Written, action: str
) -> None:
    inbox = tmp_path / "scans"
    source = document_files(inbox, inbox, written)
    source.write_bytes(CONTENT + b"appended later")
    metrics = Metrics()
    refused = archiver(inbox, tmp_path / "archive", written, action, metrics)
    assert refused.apply_on_success(local_job(source, inbox), "ok", sha(CONTENT), None) is None
    failures = {"action": action, "reason": "changed"}
    assert (
        metrics.registry.get_sample_value("ocrwatch_source_archive_failures_total", failures) == 1
    )
    assert (
        metrics.registry.get_sample_value("ocrwatch_sources_archived_total", {"action": action})
        == 0
    )
    assert source.read_bytes() == CONTENT + b"appended later"
    assert (inbox / "report.pdf.json").is_file() and not (
        tmp_path / "archive" / "scans" / "report.pdf"
    ).exists()

    # the very bytes again, but the fetch's own check says it was replaced
    source.write_bytes(CONTENT)
    again = archiver(inbox, tmp_path / "archive", written, action)
    again.apply_on_success(local_job(source, inbox), "ok", sha(CONTENT), lambda: True)
    assert source.exists()


@pytest.mark.parametrize("action", ["move", "delete"])
def test_a_source_extended_since_it_was_read_is_kept_without_a_byte_read(
    tmp_path: Path, written: Written, action: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A done document's file extended since to a sparse 2 TiB: its size (by ``fstat``) differs
    from the one its sidecar records, so it is kept as changed before a byte of it is read."""
    inbox = tmp_path / "scans"
    source = document_files(inbox, inbox, written)
    os.truncate(source, 2 * TIB)
    reads = Reads(monkeypatch, cap=0)
    reads.watch(source)
    with structlog.testing.capture_logs() as logs:
        mover = archiver(inbox, tmp_path / "archive", written, action)
        assert mover.apply_on_success(local_job(source, inbox), "ok", sha(CONTENT), None) is None
    assert reads.bytes == 0
    kept = [e for e in logs if e["event"] == "source_kept"]
    assert [e["reason"] for e in kept] == ["changed"] and f"{2 * TIB} bytes now" in kept[0][
        "detail"
    ]
    assert source.stat().st_size == 2 * TIB and list((tmp_path / "archive").iterdir()) == []


def test_a_link_put_in_the_source_place_is_never_followed(tmp_path: Path, written: Written) -> None:
    inbox, outside = tmp_path / "scans", tmp_path / "outside.pdf"
    source = document_files(inbox, inbox, written)
    outside.write_bytes(CONTENT)
    source.unlink()
    source.symlink_to(outside)
    with pytest.raises(SourceChanged):
        delete_local(source, inbox, READ)
    mover = archiver(inbox, tmp_path / "archive", written)
    assert mover.apply_on_success(local_job(source, inbox), "ok", sha(CONTENT), None) is None
    assert outside.read_bytes() == CONTENT and source.is_symlink()
    assert not (tmp_path / "archive" / "scans" / "report.pdf").exists()
    source.unlink()
    with pytest.raises(SourceGone):
        delete_local(source, inbox, READ)


def test_an_archive_gone_since_the_start_is_neither_made_nor_followed_and_the_source_stays(
    tmp_path: Path, written: Written
) -> None:
    """``archive_dir`` is made and checked at start (``roots.prepare``), never by a move: one
    removed since, or made a link meanwhile, is neither made again nor followed. The source stays,
    the log names the folder, and the next start (which makes it) moves the document."""
    inbox, archive, elsewhere = tmp_path / "scans", tmp_path / "archive", tmp_path / "elsewhere"
    source = document_files(inbox, inbox, written)
    mover = archiver(inbox, archive, written)
    archive.rmdir()
    elsewhere.mkdir()
    for gone in (None, elsewhere):
        if gone is not None:
            archive.symlink_to(gone)
        with structlog.testing.capture_logs() as logs:
            assert (
                mover.apply_on_success(local_job(source, inbox), "ok", sha(CONTENT), None) is None
            )
        (failed,) = [e for e in logs if e["event"] == "source_not_archived"]
        assert (
            failed["kind"] == "output_not_writable" and f"the archive {archive}" in failed["error"]
        )
    assert source.read_bytes() == CONTENT and (inbox / "report.pdf.json").exists()
    assert archive.is_symlink() and list(elsewhere.iterdir()) == []


def test_a_folder_of_the_archive_made_a_link_is_never_followed(
    tmp_path: Path, written: Written
) -> None:
    inbox, archive, trap = tmp_path / "scans", tmp_path / "archive", tmp_path / "trap"
    source = document_files(inbox / "sub", inbox, written)
    (archive / "scans").mkdir(parents=True)
    trap.mkdir()
    (archive / "scans" / "sub").symlink_to(trap)
    assert (
        archiver(inbox, archive, written).apply_on_success(
            local_job(source, inbox), "ok", sha(CONTENT), None
        )
        is None
    )
    assert list(trap.iterdir()) == [] and source.read_bytes() == CONTENT


def test_sidecars_under_an_output_dir_stay_there(tmp_path: Path, written: Written) -> None:
    inbox, archive, out = tmp_path / "scans", tmp_path / "archive", tmp_path / "out"
    archive.mkdir()
    out.mkdir()
    source = document_files(inbox, inbox, written, out=out)
    source_cfg = LocalSource(
        [InboxConfig(path=inbox)], reconcile_seconds=60, name_template="{name}"
    )
    mover = Archiver(
        OutputConfig(archive_dir=archive, on_success="move"),
        {"local": source_cfg},
        {"local": LocalSink("{name}", out, written=written)},
        Metrics(),
        written,
    )
    moved = mover.apply_on_success(local_job(source, inbox), "ok", sha(CONTENT), None)
    # the sidecars' paths stand
    assert moved == {"source": (archive / "scans" / "report.pdf").as_uri()}
    assert sorted(p.name for p in (archive / "scans").iterdir()) == ["report.pdf"]


def test_keep_and_jobs_of_no_inbox_are_left_alone(tmp_path: Path, written: Written) -> None:
    inbox = tmp_path / "scans"
    source = document_files(inbox, inbox, written)
    archiver(inbox, tmp_path / "archive", written, "keep").apply_on_success(
        local_job(source, inbox), "ok", sha(CONTENT), None
    )
    cli = Archiver(OutputConfig(on_success="delete"), {}, {}, Metrics())
    cli.apply_on_success(Job(LocalFile(source, inbox), "ocr-1"), "ok", sha(CONTENT), None)
    assert source.read_bytes() == CONTENT


# --- the quarantine -------------------------------------------------------------------------------


def failed_document(inbox: Path, written: Written, owner: int = 0) -> tuple[Path, Job]:
    (inbox / "sub").mkdir(parents=True)
    source = inbox / "sub" / "bad.pdf"
    source.write_bytes(CONTENT)
    os.chown(source, owner, owner)
    job = local_job(source, inbox)
    LocalSink(written=written).write_error(job, {"schema": "ocrwatch/1", "status": "failed"})
    return source, job


def quarantine(
    source: Path, inbox: Path, place: Path, written: Written
) -> tuple[Path, Path | None]:
    """The quarantine a local source asks for (``Quarantine``), carried out as the jobs layer does
    it, over the record of outputs ``written``."""
    return move(Quarantine(source.resolve(), inbox.resolve(), place, "{name}"), written)


def test_quarantine_takes_the_recorded_error_sidecar_and_mirrors_the_inbox_folders(
    tmp_path: Path, written: Written
) -> None:
    inbox, place = tmp_path / "in", tmp_path / "failed"
    place.mkdir()  # as the daemon's start makes it (roots.prepare)
    source, _ = failed_document(inbox, written, OTHER_UID)
    (inbox / "sub").chmod(0o750)
    moved, error = quarantine(source, inbox, place, written)
    assert moved == place / "sub" / "bad.pdf" and moved.read_bytes() == CONTENT
    assert error == place / "sub" / "bad.pdf.error.json" and error.exists()
    assert not any((inbox / "sub").iterdir())
    assert stat.S_IMODE((place / "sub").stat().st_mode) == 0o750


def test_quarantine_leaves_a_users_file_at_the_error_sidecars_name(
    tmp_path: Path, written: Written
) -> None:
    inbox, place = tmp_path / "in", tmp_path / "failed"
    place.mkdir()  # as the daemon's start makes it (roots.prepare)
    source, _ = failed_document(inbox, written)
    error = inbox / "sub" / "bad.pdf.error.json"
    error.unlink()
    # no record holds it
    error.write_bytes(dump_json({"schema": "ocrwatch/1", "status": "failed", "by": "bob"}))
    os.chown(error, OTHER_UID, OTHER_UID)
    _, carried = quarantine(source, inbox, place, written)
    assert (
        (place / "sub" / "bad.pdf").exists() and error.exists() and error.stat().st_uid == OTHER_UID
    )
    assert carried is None


def test_a_quarantine_gone_since_the_start_is_not_made_on_the_way(
    tmp_path: Path, written: Written
) -> None:
    """A ``quarantine_dir`` outside the inbox is made and checked at start (``roots.prepare``): one
    removed since is not made again by the move; the document stays where it failed."""
    inbox, place = tmp_path / "in", tmp_path / "failed"
    source, _ = failed_document(inbox, written)
    with pytest.raises(FolderGone, match=str(place)):
        quarantine(source, inbox, place, written)
    assert source.read_bytes() == CONTENT and not place.exists()


def test_quarantine_keeps_a_source_with_another_name_or_a_writer(
    tmp_path: Path, written: Written
) -> None:
    inbox, place = tmp_path / "in", tmp_path / "failed"
    source, _ = failed_document(inbox, written)
    os.link(source, tmp_path / "elsewhere.pdf")
    with pytest.raises(SourceInUse, match="hard links"):
        quarantine(source, inbox, place, written)
    (tmp_path / "elsewhere.pdf").unlink()
    with open(source, "ab"), pytest.raises(SourceInUse, match="open for writing"):
        quarantine(source, inbox, place, written)
    assert source.read_bytes() == CONTENT and not (place / "sub" / "bad.pdf").exists()


# --- S3 -------------------------------------------------------------------------------------------


class _S3Source:
    """What the archiver asks of an S3 source: its configuration and its client."""

    def __init__(self, server: MotoServer | RgwServer, **cfg: Any) -> None:
        self.cfg = S3Config(**server.s3_config(queue_url="http://unused", **cfg))
        self.client = server.client("s3")


def s3_archiver(server: MotoServer | RgwServer, **cfg: Any) -> Archiver:
    return Archiver(OutputConfig(), {"s3:0": _S3Source(server, **cfg)}, {}, Metrics())  # type: ignore[dict-item]


def put(server: MotoServer | RgwServer, bucket: str, key: str, body: bytes = CONTENT) -> S3Object:
    response = server.client("s3").put_object(Bucket=bucket, Key=key, Body=body)
    return S3Object(
        bucket, key, etag=response["ETag"].strip('"'), version_id=response.get("VersionId")
    )


def keys(server: MotoServer | RgwServer, bucket: str) -> list[str]:
    return sorted(
        item["Key"]
        for item in server.client("s3").list_objects_v2(Bucket=bucket).get("Contents", [])
    )


def test_s3_delete_and_move(moto: MotoServer) -> None:
    s3 = moto.client("s3")
    s3.create_bucket(Bucket="docs")
    gone = put(moto, "docs", "in/a.pdf")
    s3_archiver(moto, on_success="delete").apply_on_success(Job(gone, "s3:0"), "ok", None, None)
    moved = put(moto, "docs", "in/b.pdf")
    mover = s3_archiver(moto, on_success="move", archive_prefix="done/")
    # Its sidecars stay at their keys.
    assert mover.apply_on_success(Job(moved, "s3:0"), "ok", None, None) == {
        "source": "s3://docs/done/in/b.pdf"
    }
    assert keys(moto, "docs") == ["done/in/b.pdf"]
    assert s3.get_object(Bucket="docs", Key="done/in/b.pdf")["Body"].read() == CONTENT

    replaced = put(moto, "docs", "in/c.pdf")
    put(moto, "docs", "in/c.pdf", b"a new version")
    s3_archiver(moto, on_success="delete").apply_on_success(Job(replaced, "s3:0"), "ok", None, None)
    s3_archiver(moto, on_success="move", archive_prefix="done/").apply_on_success(
        Job(replaced, "s3:0"), "ok", None, None
    )
    partial = put(moto, "docs", "in/d.pdf")
    s3_archiver(moto, on_success="delete").apply_on_success(
        Job(partial, "s3:0"), "partial", None, None
    )
    assert keys(moto, "docs") == ["done/in/b.pdf", "in/c.pdf", "in/d.pdf"]


def test_s3_versioned_bucket_acts_on_the_version_read(moto: MotoServer) -> None:
    s3 = moto.client("s3")
    s3.create_bucket(Bucket="versioned")
    s3.put_bucket_versioning(Bucket="versioned", VersioningConfiguration={"Status": "Enabled"})
    read = put(moto, "versioned", "scan.pdf")
    assert read.version_id
    newer = put(moto, "versioned", "scan.pdf", b"written after the read")
    s3_archiver(moto, on_success="move", archive_prefix="archive/").apply_on_success(
        Job(read, "s3:0"), "ok", None, None
    )

    assert s3.get_object(Bucket="versioned", Key="archive/scan.pdf")["Body"].read() == CONTENT
    versions = s3.list_object_versions(Bucket="versioned", Prefix="scan.pdf")["Versions"]
    # the version read is gone, the newer stays
    assert [v["VersionId"] for v in versions] == [newer.version_id]
    assert (
        s3.get_object(Bucket="versioned", Key="scan.pdf")["Body"].read()
        == b"written after the read"
    )
