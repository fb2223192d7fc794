"""Sidecars beside the source: names, atomicity, stale sidecars, and what else may lie at their
names."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ocrwatch import safefs
from ocrwatch.naming import sidecar_names
from ocrwatch.results.assemble import SCHEMA_ID
from ocrwatch.sinks import local as local_sink
from ocrwatch.sinks.local import LocalSink
from ocrwatch.sources.base import Job, LocalFile


def job_for(path: Path) -> Job:
    return Job(origin=LocalFile(path, path.parent), source="local")


def test_names_keep_report_pdf_and_report_png_apart() -> None:
    assert sidecar_names("report.pdf", "{name}") == {
        "md": "report.pdf.md",
        "json": "report.pdf.json",
        "error": "report.pdf.error.json",
    }
    assert sidecar_names("report.png", "{name}")["md"] == "report.png.md"
    assert sidecar_names("report.pdf", "{stem}")["json"] == "report.json"


def test_write_then_error_then_success_removes_error(tmp_path: Path) -> None:
    source = tmp_path / "a b é.pdf"
    source.write_bytes(b"%PDF-1.4")
    sink = LocalSink()
    job = job_for(source)
    sink.write_error(job, {"schema": SCHEMA_ID, "status": "failed"})
    assert (tmp_path / "a b é.pdf.error.json").exists()
    sink.write(
        job, "<!-- page 1 -->\n\nhello\n", {"schema": SCHEMA_ID, "source": {"sha256": "0" * 64}}
    )
    assert (tmp_path / "a b é.pdf.md").read_text() == "<!-- page 1 -->\n\nhello\n"
    assert sink.recorded(job) == {"sha256": "0" * 64}
    assert not (tmp_path / "a b é.pdf.error.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "a b é.pdf",
        "a b é.pdf.json",
        "a b é.pdf.md",
    ]


def test_out_dir_mirrors_inbox_layout(tmp_path: Path) -> None:
    inbox, out = tmp_path / "inbox", tmp_path / "out"
    (inbox / "sub").mkdir(parents=True)
    out.mkdir()  # made at start (roots.prepare)
    source = inbox / "sub" / "x.png"
    source.write_bytes(b"x")
    LocalSink(out_dir=out).write(
        Job(origin=LocalFile(source, inbox), source="local"), "m", {"source": {}}
    )
    assert (out / "sub" / "x.png.json").exists()
    assert not (inbox / "sub" / "x.png.json").exists()


def test_an_output_dir_gone_since_the_start_is_a_fault_of_the_place_and_never_made_on_the_way(
    tmp_path: Path,
) -> None:
    """``[output] dir`` is made and checked at start (``roots.prepare``), never by a write: one
    removed since, or made a link meanwhile, is not made (nor followed) on the way to a sidecar. The
    document waits for it (``OutputNotWritable``, a place fault), naming the folder; it does not
    fail, and a look for its sidecars finds none."""
    from ocrwatch.errors import OutputNotWritable, PlaceFault

    inbox, out, elsewhere = tmp_path / "inbox", tmp_path / "out", tmp_path / "elsewhere"
    inbox.mkdir()
    elsewhere.mkdir()
    source = inbox / "x.png"
    source.write_bytes(b"x")
    sink = LocalSink(out_dir=out)
    job = Job(origin=LocalFile(source, inbox), source="local")
    for gone in (None, elsewhere):
        if gone is not None:
            out.symlink_to(gone)
        with pytest.raises(OutputNotWritable, match=f"the output folder {out} is gone") as waits:
            sink.write(job, PAGES, OURS)
        assert isinstance(waits.value, PlaceFault) and waits.value.retryable
        assert "restart ocrwatch" in waits.value.hint
        with pytest.raises(OutputNotWritable):
            sink.write_error(job, {"schema": SCHEMA_ID, "status": "failed"})
        assert sink.recorded(job) is None and sink.status(job) is None
    assert out.is_symlink() and list(elsewhere.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "inbox", "out"]
    assert list(inbox.iterdir()) == [source]


def test_mirror_folders_are_their_inbox_folders_and_one_that_is_not_is_never_written_through(
    tmp_path: Path,
) -> None:
    """Under ``[output] dir`` each folder gets the owner, group and mode of the inbox folder it
    stands for, the figures' folder its source's; once that inbox folder is another user's, the
    mirror made for it is refused (``untrusted_folder``, for a result and an error sidecar alike)
    and nothing is written there. Beside the source nothing is made, so nothing changes."""
    from ocrwatch.config import InboxConfig
    from ocrwatch.errors import UntrustedFolder

    if os.geteuid() != 0:
        pytest.skip("needs root to give folders to other users")
    inbox, out, other = tmp_path / "inbox", tmp_path / "out", 54321
    (inbox / "alice").mkdir(parents=True)
    out.mkdir()  # made at start (roots.prepare)
    os.chown(inbox / "alice", other, other)
    (inbox / "alice").chmod(0o710)
    source = inbox / "alice" / "x.png"
    source.write_bytes(b"x")
    os.chown(source, other, other)
    source.chmod(0o640)
    sink = LocalSink(out_dir=out, inboxes=(InboxConfig(path=inbox),))
    job = Job(origin=LocalFile(source, inbox), source="local")
    sink.write(job, PAGES, OURS, {"x.png.assets/page-1-figure-1.png": b"figure"})
    for path, expected in (
        (out / "inbox", (0, 0, 0o755)),
        (out / "inbox" / "alice", (other, other, 0o710)),
        (out / "inbox" / "alice" / "x.png.assets", (other, other, 0o750)),
        (out / "inbox" / "alice" / "x.png.md", (other, other, 0o640)),
    ):
        info = path.stat()
        assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == expected, path
    before = sorted(p.name for p in (out / "inbox" / "alice").iterdir())
    os.chown(inbox / "alice", other + 1, other + 1)  # her folder removed, another's made
    with pytest.raises(UntrustedFolder, match=str(out / "inbox" / "alice")):
        sink.write(job, PAGES, OURS)
    with pytest.raises(UntrustedFolder):
        sink.write_error(job, {"schema": SCHEMA_ID, "status": "failed"})
    assert sorted(p.name for p in (out / "inbox" / "alice").iterdir()) == before
    # beside the source: the inbox's own folder, whoever's it is
    LocalSink().write(job, PAGES, OURS)
    assert (inbox / "alice" / "x.png.md").exists()


def test_a_write_failing_midway_leaves_old_content_and_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "doc.pdf.json"
    target.write_text("old")

    def broken_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    with safefs.folder(tmp_path) as here:
        monkeypatch.setattr(os, "fsync", broken_fsync)
        with pytest.raises(OSError):
            here.write(target.name, b"new content that never lands", safefs.PUBLIC)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["doc.pdf.json"]


def test_a_write_killed_midway_never_shows_a_torn_file(tmp_path: Path) -> None:
    """A writer process killed with SIGKILL at random moments: the final name holds old or new,
    whole."""
    import signal
    import subprocess
    import sys
    import time

    target = tmp_path / "big.json"
    old = json.dumps({"v": "old", "pad": "x" * 2_000_000})
    target.write_text(old)
    script = (
        "import json,sys; from pathlib import Path; from ocrwatch import safefs\n"
        "p=Path(sys.argv[1])\n"
        "with safefs.folder(p.parent) as f:\n"
        "    for i in range(1000):\n"
        "        f.write(p.name, json.dumps({'v': i, 'pad': 'y'*2_000_000}).encode(), "
        "safefs.PUBLIC)\n"
    )
    for delay in (0.05, 0.1, 0.17, 0.23, 0.3):
        proc = subprocess.Popen([sys.executable, "-c", script, str(target)])
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        data = json.loads(target.read_text())
        assert set(data) == {"v", "pad"} and len(data["pad"]) == 2_000_000
    leftovers = [p for p in tmp_path.iterdir() if p.name != "big.json"]
    for leftover in leftovers:
        assert safefs.TMP_MARKER in leftover.name and leftover.name.startswith(".")


def test_unwritable_folder_is_a_clear_error(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root can write into read-only folders; covered by the read-only mount test")
    source = tmp_path / "ro" / "x.pdf"
    source.parent.mkdir()
    source.write_bytes(b"%PDF")
    source.parent.chmod(0o555)
    try:
        from ocrwatch.errors import OutputNotWritable

        with pytest.raises(OutputNotWritable):
            LocalSink().write(job_for(source), "m", {})
    finally:
        source.parent.chmod(0o755)


# --- what else may lie at a sidecar's name --------------------------------------------------------

OURS = {"schema": SCHEMA_ID, "status": "ok", "source": {"sha256": "1" * 64, "bytes": 3}}
PAGES = "<!-- page 1 -->\n\nnew text\n"


def _source(tmp_path: Path, name: str = "x.pdf") -> tuple[Path, Job]:
    source = tmp_path / name
    source.write_bytes(b"%PDF-1.4")
    return source, job_for(source)


def _plant(path: Path, what: str) -> None:
    if what == "fifo":
        os.mkfifo(path)
    elif what == "dev-zero-link":
        path.symlink_to("/dev/zero")
    elif what == "folder":
        path.mkdir()
    elif what == "user-file":
        path.write_text('{"mine": "a user\'s notes"}')


def _recorded_in_thread(sink: LocalSink, job: Job) -> object:
    """``recorded`` in a daemon thread, so a blocking read (a FIFO) fails the test instead of
    hanging it."""
    import threading

    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(sink.recorded(job)), daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "recorded() blocked"
    return result[0]


@pytest.mark.parametrize("what", ["fifo", "dev-zero-link", "folder", "user-file"])
@pytest.mark.parametrize("kind", ["json", "md"])
def test_a_foreign_occupant_is_refused_before_anything_is_written(
    tmp_path: Path, what: str, kind: str
) -> None:
    """A FIFO, a link to /dev/zero, a folder or a user's file at NAME.json or NAME.md: ``recorded``
    neither blocks nor reads it, ``write`` refuses with ``output_conflict`` naming it, and nothing
    is written."""
    from ocrwatch.errors import OutputConflict

    _, job = _source(tmp_path)
    sink = LocalSink()
    planted = tmp_path / f"x.pdf.{kind}"
    _plant(planted, what)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert _recorded_in_thread(sink, job) is None
    with pytest.raises(OutputConflict) as refused:
        sink.write(job, PAGES, OURS)
    assert str(planted) in refused.value.message and str(planted) in refused.value.hint
    assert "ocrwatch retry" in refused.value.hint and not refused.value.retryable
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    if what == "user-file":
        assert planted.read_text() == '{"mine": "a user\'s notes"}'


def test_a_user_file_at_the_error_name_is_neither_overwritten_nor_removed(tmp_path: Path) -> None:
    from ocrwatch.errors import OutputConflict

    _, job = _source(tmp_path)
    theirs = tmp_path / "x.pdf.error.json"
    theirs.write_text("{}")
    sink = LocalSink()
    with pytest.raises(OutputConflict):
        sink.write_error(job, {"schema": SCHEMA_ID, "status": "failed"})
    # a result may be written; only ocrwatch's own error sidecar is removed
    sink.write(job, PAGES, OURS)
    assert theirs.read_text() == "{}" and sink.recorded(job) == OURS["source"]


def test_own_sidecars_are_replaced_and_a_leftover_markdown_too(tmp_path: Path) -> None:
    """ocrwatch's own JSON (schema first) and Markdown (page marker first) are replaced, also a
    Markdown left alone by a write killed before its JSON."""
    _, job = _source(tmp_path)
    sink = LocalSink()
    (tmp_path / "x.pdf.md").write_text("<!-- page 1 -->\n\nkilled before the JSON\n")
    sink.write(job, PAGES, OURS)
    sink.write(job, PAGES.replace("new", "newer"), OURS | {"status": "partial"})
    assert "newer" in (tmp_path / "x.pdf.md").read_text()
    assert json.loads((tmp_path / "x.pdf.json").read_text())["status"] == "partial"


def test_recorded_reads_a_bounded_head_of_a_large_sidecar(tmp_path: Path) -> None:
    """The source section comes first; a 40 MB JSON sidecar (a long document) is recognised from its
    head."""
    _, job = _source(tmp_path)
    big = OURS | {"pages": [{"markdown": "y" * 1000}] * 40_000}
    (tmp_path / "x.pdf.md").write_text("<!-- page 1 -->\n")
    (tmp_path / "x.pdf.json").write_bytes(local_sink.dump_json(big))
    assert (tmp_path / "x.pdf.json").stat().st_size > 40_000_000
    assert LocalSink().recorded(job) == OURS["source"]
    (tmp_path / "x.pdf.json").write_text(json.dumps({"status": "ok", "source": OURS["source"]}))
    assert LocalSink().recorded(job) is None  # not ocrwatch's: no schema first


def test_a_result_without_its_markdown_is_not_recorded_and_an_edited_one_is(tmp_path: Path) -> None:
    """The Markdown sidecar deleted, or something else than a file at its name: nothing records the
    document, so it is done again. Edited by a user: it still counts, and no scan overwrites the
    edits."""
    source = tmp_path / "x.pdf"
    source.write_bytes(b"%PDF-1.4")
    sink, job = LocalSink(), job_for(source)
    sink.write(job, "<!-- page 1 -->\n\nhello\n", OURS)
    assert sink.recorded(job) == OURS["source"]
    (tmp_path / "x.pdf.md").write_text("hello, corrected by hand\n")
    assert sink.recorded(job) == OURS["source"]
    (tmp_path / "x.pdf.md").unlink()
    assert sink.recorded(job) is None
    (tmp_path / "x.pdf.md").mkdir()
    assert sink.recorded(job) is None


def test_a_failure_removes_the_previous_versions_result_but_not_a_users_file(
    tmp_path: Path,
) -> None:
    _, job = _source(tmp_path)
    sink = LocalSink()
    sink.write(job, PAGES, OURS)
    sink.write_error(job, {"schema": SCHEMA_ID, "status": "failed"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.pdf", "x.pdf.error.json"]
    (tmp_path / "x.pdf.md").write_text("my own notes about x.pdf\n")
    sink.write_error(job, {"schema": SCHEMA_ID, "status": "failed"})
    assert (tmp_path / "x.pdf.md").read_text() == "my own notes about x.pdf\n"


def test_a_name_whose_error_sidecar_cannot_exist_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    """250 bytes: NAME.md and NAME.json would fit in 255, NAME.error.json would not."""
    from ocrwatch.errors import NameTooLong

    _, job = _source(tmp_path, "n" * 246 + ".pdf")
    with pytest.raises(NameTooLong) as refused:
        LocalSink().write(job, PAGES, OURS)
    assert "255" in refused.value.message and "shorter" in refused.value.hint
    assert [p.name for p in tmp_path.iterdir()] == ["n" * 246 + ".pdf"]


def test_each_inbox_is_mirrored_in_a_folder_of_its_own(tmp_path: Path) -> None:
    """Two inboxes holding the same relative name never share a sidecar under ``[output] dir``; the
    folder is the inbox's name, with a suffix from its path only where two inboxes share a name,
    whatever their order."""
    from ocrwatch.config import InboxConfig

    a, b, scans = tmp_path / "a", tmp_path / "b", tmp_path / "site" / "a"
    configs = (InboxConfig(path=a), InboxConfig(path=b))
    out = tmp_path / "out"
    out.mkdir()  # made at start (roots.prepare)
    sink = LocalSink(out_dir=out, inboxes=configs)
    jobs = {}
    for inbox in (a, b):
        (inbox / "sub").mkdir(parents=True)
        (inbox / "sub" / "report.pdf").write_bytes(b"%PDF-1.4")
        jobs[inbox] = Job(origin=LocalFile(inbox / "sub" / "report.pdf", inbox), source="local")
        sink.write(jobs[inbox], PAGES, OURS | {"source": {"sha256": inbox.name * 64, "bytes": 8}})
    assert (
        sink.recorded(jobs[a])["sha256"] == "a" * 64
        and sink.recorded(jobs[b])["sha256"] == "b" * 64
    )
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.json")) == [
        "a/sub/report.pdf.json",
        "b/sub/report.pdf.json",
    ]
    assert local_sink.inbox_folder(a, {a, b}) == "a"
    named = local_sink.inbox_folder(a, {b, scans, a})
    assert (
        named.startswith("a-")
        and len(named) == 10
        and named == local_sink.inbox_folder(a, {scans, a})
    )
    assert local_sink.inbox_folder(scans, {a, scans}) not in (named, "a")


def test_a_reload_that_adds_an_inbox_of_the_same_name_moves_later_sidecars_apart(
    tmp_path: Path,
) -> None:
    """After ``update_inboxes`` the mirror folders are the new configuration's: an inbox that now
    shares its name with another gets its suffixed folder for the documents that follow."""
    from ocrwatch.config import InboxConfig

    a, scans = tmp_path / "a", tmp_path / "site" / "a"
    sink = LocalSink(out_dir=tmp_path / "out", inboxes=(InboxConfig(path=a),))
    job = Job(origin=LocalFile(a / "report.pdf", a), source="local")
    assert sink.paths(job)["json"] == tmp_path / "out" / "a" / "report.pdf.json"
    sink.update_inboxes((InboxConfig(path=a), InboxConfig(path=scans)))
    folder = local_sink.inbox_folder(a, {a, scans})
    assert (
        folder != "a" and sink.paths(job)["json"] == tmp_path / "out" / folder / "report.pdf.json"
    )


def test_a_sidecar_name_two_documents_share_is_a_conflict_not_an_overwrite(tmp_path: Path) -> None:
    """``{stem}`` gives report.pdf and report.png one ``report.json``: the second is refused, naming
    the first, whose sidecars its error sidecar leaves alone; once report.pdf is gone, its stale
    sidecar is replaced."""
    from ocrwatch.errors import OutputConflict

    sink = LocalSink("{stem}")
    pdf, first = _source(tmp_path, "report.pdf")
    _, second = _source(tmp_path, "report.png")
    sink.write(
        first, PAGES, OURS | {"source": {"name": "report.pdf", "sha256": "1" * 64, "bytes": 8}}
    )
    with pytest.raises(OutputConflict, match="the sidecar of report.pdf"):
        sink.write(second, PAGES.replace("new", "other"), OURS | {"source": {"name": "report.png"}})
    assert (
        sink.recorded(second)
        == sink.recorded(first)
        == {"name": "report.pdf", "sha256": "1" * 64, "bytes": 8}
    )
    sink.write_error(
        second, {"schema": SCHEMA_ID, "status": "failed", "source": {"name": "report.png"}}
    )
    assert (tmp_path / "report.json").exists() and "new text" in (
        tmp_path / "report.md"
    ).read_text()
    pdf.unlink()
    sink.write(second, PAGES.replace("new", "other"), OURS | {"source": {"name": "report.png"}})
    assert "other text" in (tmp_path / "report.md").read_text()
    assert (
        sink.recorded(second) == {"name": "report.png"}
        and not (tmp_path / "report.error.json").exists()
    )
