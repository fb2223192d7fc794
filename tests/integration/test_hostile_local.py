"""A shared inbox used by a hostile or careless user, through the real daemon process (issue 18,
defects 1, 2, 9 and 11): a file swapped for a symlink while it is read, folder links that loop, a
folder swapped for a link while its document waits, a PDF written in pieces, and a replacement that
keeps size and mtime."""

from __future__ import annotations

import ctypes
import hashlib
import os
import signal
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import DaemonProcess, error_sidecar, sidecars_done, wait_until
from tests.support import docs

pytestmark = pytest.mark.integration

ECHO = "tests.support.fault_engines:EchoEngine"
SECRET_WORD = "KUMQUAT"
RACE_SECONDS = (
    20.0  # several times what a path check followed by a separate read needs to lose the race
)
RENAME_EXCHANGE = 2
AT_FDCWD = -100


def line_pdf(path: Path, text: str) -> Path:
    return docs.write_pdf(path, [docs.text_image([text], size=(700, 160), font_px=40)])


def events_about(daemon: DaemonProcess, path: Path, event: str) -> list[dict[str, Any]]:
    uri = path.absolute().as_uri()
    return [e for e in daemon.events() if e.get("event") == event and e.get("uri") == uri]


def sidecar_files(root: Path) -> list[Path]:
    """Every sidecar under ``root``, links not followed."""
    found = []
    for folder, _, names in os.walk(root):
        found += [
            Path(folder) / n
            for n in names
            if n.endswith((".md", ".json")) and "ocrwatch-tmp" not in n
        ]
    return [p for p in found if not p.is_relative_to(root / "state")]


# --- defect 1: a file swapped for a symlink while it is read --------------------------------------


def _exchange(a: Path, b: Path, stop: threading.Event, flips: list[int]) -> None:
    """renameat2(RENAME_EXCHANGE) in a loop, as ``shared/redteam/swap_race.py`` does; ends with
    ``a`` regular."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    renameat2 = libc.renameat2
    pa, pb = os.fsencode(a), os.fsencode(b)
    count = 0
    while not stop.is_set():
        if renameat2(AT_FDCWD, pa, AT_FDCWD, pb, RENAME_EXCHANGE) != 0:
            raise OSError(ctypes.get_errno(), "renameat2")
        count += 1
        time.sleep(0.0005)
    if a.is_symlink():
        renameat2(AT_FDCWD, pa, AT_FDCWD, pb, RENAME_EXCHANGE)
    flips.append(count)


def test_a_file_swapped_for_a_symlink_never_brings_outside_bytes_into_a_sidecar(
    make_daemon, tmp_path: Path
) -> None:
    daemon = make_daemon(
        inboxes=[{"path": str(tmp_path / "inbox"), "settle_seconds": 0.05, "polling": False}]
    )
    inbox = daemon.inbox
    outside = tmp_path / "private"
    outside.mkdir()
    secret = line_pdf(outside / "secret.pdf", f"{SECRET_WORD} LEDGER 4417")
    secret.chmod(0o600)
    secret_sha = hashlib.sha256(secret.read_bytes()).hexdigest()
    public = line_pdf(inbox / "swap.pdf", "PUBLIC NOTICE")
    public_sha = hashlib.sha256(public.read_bytes()).hexdigest()
    (inbox / ".h").mkdir()
    (inbox / ".h" / "swap.pdf").symlink_to(secret)
    daemon.start()

    stop, flips = threading.Event(), []
    racer = threading.Thread(
        target=_exchange, args=(public, inbox / ".h" / "swap.pdf", stop, flips)
    )
    leaked: list[str] = []

    def leak() -> bool:
        for sidecar in sidecar_files(tmp_path):
            text = sidecar.read_text(errors="replace")
            if SECRET_WORD.lower() in text.lower() or secret_sha in text:
                leaked.append(f"{sidecar}:\n{text[:2000]}")
        return bool(leaked)

    racer.start()
    try:
        deadline = time.monotonic() + RACE_SECONDS
        while time.monotonic() < deadline and not leak():
            time.sleep(0.2)
    finally:
        stop.set()
        racer.join()
    assert not leaked, leaked[0]
    assert not public.is_symlink() and flips and flips[0] > 1000, flips
    started = len(events_about(daemon, public, "job_started"))
    print(f"{flips[0]} exchanges in {RACE_SECONDS:g}s, {started} jobs started")

    # Once the race ends the document is read as what it is: the public file.
    def public_done() -> bool:
        data = sidecars_done(public)
        return data is not None and data["source"]["sha256"] == public_sha

    wait_until(public_done, 60, f"the public file's sidecars:\n{daemon.log_text()[-4000:]}")
    assert "public" in public.with_name("swap.pdf.md").read_text().lower()
    assert not leak(), leaked[0]
    assert daemon.proc is not None and daemon.proc.poll() is None
    refusals = [e for e in daemon.events() if e.get("event") == "local_refused"]
    assert 0 < len(refusals) <= 3, (
        f"{len(refusals)} refusals logged: a name swapped back and forth is logged once"
    )
    assert daemon.stop(timeout=30) == 0
    assert "Traceback" not in daemon.log_text()


# --- defect 2: links to folders under a polling watcher -------------------------------------------


def test_polling_watcher_does_not_follow_folder_links(make_daemon, tmp_path: Path) -> None:
    """``ln -s . a; ln -s .. b`` in a polled inbox: not followed, each refused with a log line; the
    daemon is ready, takes a normal file and stops on SIGTERM. A document beyond ``b`` is never
    read."""
    shutdown_timeout = 20.0
    daemon = make_daemon(
        inboxes=[{"path": str(tmp_path / "inbox"), "settle_seconds": 0.3, "polling": True}]
    )
    inbox = daemon.inbox
    (inbox / "a").symlink_to(".")
    (inbox / "b").symlink_to("..")
    beyond = line_pdf(tmp_path / "beyond.pdf", "BEYOND THE INBOX")
    daemon.start(wait_ready=False)
    wait_until(daemon.ready, 30, f"daemon ready:\n{daemon.log_text()[-3000:]}")

    started = time.monotonic()
    normal = line_pdf(inbox / "normal.pdf", "NORMAL LETTER")
    wait_until(lambda: sidecars_done(normal), 30, "the normal file's sidecars")
    print(f"normal file done {time.monotonic() - started:.1f}s after it was dropped")

    refused = [e for e in daemon.events() if e.get("event") == "local_refused"]
    reasons = {Path(e["path"]).name: e["reason"] for e in refused}
    assert "symlink" in reasons.get("a", "") and "symlink" in reasons.get("b", ""), refused
    assert sorted(Path(e["path"]).name for e in refused) == ["a", "b"], "one line per link"
    assert sidecars_done(beyond) is None and error_sidecar(beyond) is None
    assert sorted(p.relative_to(tmp_path) for p in sidecar_files(tmp_path)) == [
        Path("inbox/normal.pdf.json"),
        Path("inbox/normal.pdf.md"),
    ]
    assert daemon.proc is not None
    daemon.signal(signal.SIGTERM)
    stopping = time.monotonic()
    assert daemon.stop(timeout=shutdown_timeout + 5) == 0
    print(f"SIGTERM to exit: {time.monotonic() - stopping:.1f}s")


# --- defect 9: a folder swapped for a symlink while its document waits ----------------------------


def test_folder_swapped_for_a_symlink_while_its_document_waits(
    plugin_daemon, tmp_path: Path
) -> None:
    daemon = plugin_daemon(ECHO, {"delay": 3.0}, scheduler={"max_active_documents": 1})
    inbox = daemon.inbox
    outside = tmp_path / "outside"
    outside.mkdir()
    daemon.start()
    first = docs.write_png(
        inbox / "first.png", docs.text_image(["first"], size=(600, 200), font_px=30)
    )
    wait_until(lambda: events_about(daemon, first, "job_started"), 30, "the first job to start")
    (inbox / "sub").mkdir()
    waiting = docs.write_png(
        inbox / "sub" / "doc.png", docs.text_image(["waiting"], size=(600, 200), font_px=30)
    )
    wait_until(
        lambda: [
            e
            for e in daemon.events()
            if e.get("event") == "local_submitted" and e["path"] == str(waiting)
        ],
        30,
        "the waiting document to be submitted",
    )
    assert not events_about(daemon, waiting, "job_started"), "it should wait behind first.png"
    os.rename(inbox / "sub", outside / "sub")
    (inbox / "sub").symlink_to(outside / "sub")

    wait_until(
        lambda: events_about(daemon, waiting, "job_failed"),
        30,
        f"the job's end:\n{daemon.log_text()[-3000:]}",
    )
    failed = events_about(daemon, waiting, "job_failed")[0]
    assert failed["kind"] in ("source_gone", "not_a_regular_file"), failed
    wait_until(lambda: sidecars_done(first), 30, "first.png's sidecars")
    assert daemon.stop(timeout=30) == 0
    first_log = daemon.log_text()

    daemon.start()
    wait_until(
        lambda: [e for e in daemon.events() if e.get("event") == "local_refused"],
        30,
        "the link refused",
    )
    assert daemon.stop(timeout=30) == 0
    for text in (first_log, daemon.log_text()):
        assert "Task exception was never retrieved" not in text
        assert "Traceback" not in text and "KeyError" not in text
    with sqlite3.connect(daemon.state / "ledger.sqlite3") as db:
        states = dict(db.execute("select key, state from jobs").fetchall())
    assert states == {first.absolute().as_uri(): "done", waiting.absolute().as_uri(): "failed"}, (
        states
    )
    assert sorted(p.name for p in (outside / "sub").iterdir()) == ["doc.png"], (
        "written beyond the link"
    )
    assert not [e for e in daemon.events() if e.get("event") == "job_started"], (
        "a job resumed after restart"
    )


# --- defect 11: a PDF written in pieces; a replacement with the same size and mtime ---------------


def _incremental_pdf(pages: int) -> list[bytes]:
    """A one-page PDF, then one incremental update per further page (new page, new page tree, new
    xref)."""

    def obj(number: int, body: bytes) -> bytes:
        return b"%d 0 obj\n" % number + body + b"\nendobj\n"

    def content(page: int) -> bytes:
        text = b"BT /F1 36 Tf 72 700 Td (INCREMENTAL PAGE %d) Tj ET" % page
        return b"<< /Length %d >>\nstream\n" % len(text) + text + b"\nendstream"

    def page(contents: int) -> bytes:
        return (
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R"
            b" /Resources << /Font << /F1 4 0 R >> >> >>" % contents
        )

    def tree(kids: list[int]) -> bytes:
        return b"<< /Type /Pages /Kids [%s] /Count %d >>" % (
            b" ".join(b"%d 0 R" % k for k in kids),
            len(kids),
        )

    body = {
        1: b"<< /Type /Catalog /Pages 2 0 R >>",
        2: tree([5]),
        3: content(1),
        4: b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        5: page(3),
    }
    out, offsets = bytearray(b"%PDF-1.7\n"), {}
    for number in sorted(body):
        offsets[number] = len(out)
        out += obj(number, body[number])
    xref = len(out)
    out += b"xref\n0 6\n0000000000 65535 f \n" + b"".join(
        b"%010d 00000 n \n" % offsets[n] for n in range(1, 6)
    )
    out += b"trailer\n<< /Size 6 /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % xref
    chunks, previous, kids, size = [bytes(out)], xref, [5], 6
    for number in range(2, pages + 1):
        base, update = sum(map(len, chunks)), bytearray()
        contents, new_page = size, size + 1
        size += 2
        kids.append(new_page)
        at = {}
        for n, data in ((contents, content(number)), (new_page, page(contents)), (2, tree(kids))):
            at[n] = base + len(update)
            update += obj(n, data)
        xref = base + len(update)
        update += (
            b"xref\n0 1\n0000000000 65535 f \n2 1\n%010d 00000 n \n%d 2\n%010d 00000 n \n%010d "
            b"00000 n \n" % (at[2], contents, at[contents], at[new_page])
        )
        update += b"trailer\n<< /Size %d /Root 1 0 R /Prev %d >>\nstartxref\n%d\n%%%%EOF\n" % (
            size,
            previous,
            xref,
        )
        previous = xref
        chunks.append(bytes(update))
    return chunks


def test_a_pdf_written_in_pieces_is_published_once_for_its_final_content(
    plugin_daemon, tmp_path: Path
) -> None:
    """Each incremental update is appended in three pieces, each by its own open-append-close, 0.4 s
    apart: every update ends in a valid PDF, and every piece ends in a close."""
    daemon = plugin_daemon(ECHO, inboxes=[{"path": str(tmp_path / "inbox"), "settle_seconds": 1.5}])
    target = daemon.inbox / "growing.pdf"
    daemon.start()
    chunks = _incremental_pdf(5)
    for chunk in chunks:
        step = -(-len(chunk) // 3)
        for start in range(0, len(chunk), step):
            with open(target, "ab") as handle:
                handle.write(chunk[start : start + step])
            time.sleep(0.4)
    final_sha = hashlib.sha256(b"".join(chunks)).hexdigest()

    def final_done() -> bool:
        data = sidecars_done(target)
        return data is not None and data["source"]["sha256"] == final_sha

    wait_until(final_done, 60, f"the final version's sidecars:\n{daemon.log_text()[-3000:]}")
    assert len(sidecars_done(target)["pages"]) == 5
    sentinel = docs.write_png(
        daemon.inbox / "sentinel.png", docs.text_image(["after"], size=(600, 200), font_px=30)
    )
    wait_until(lambda: sidecars_done(sentinel), 30, "the sentinel")
    done = events_about(daemon, target, "job_done")
    submitted = [
        e
        for e in daemon.events()
        if e.get("event") == "local_submitted" and e["path"] == str(target)
    ]
    print(f"{len(submitted)} submissions, {len(done)} JSON sidecars written")
    assert len(done) == 1, f"{len(done)} JSON sidecars were written for intermediate versions"
    assert daemon.stop(timeout=30) == 0


def test_a_replacement_with_the_same_size_and_mtime_is_processed_again(
    plugin_daemon, tmp_path: Path
) -> None:
    daemon = plugin_daemon(ECHO)
    inbox = daemon.inbox
    daemon.start()
    scan = docs.write_tiff(
        inbox / "scan.tif",
        [docs.text_image(["FIRST"], size=(600, 200), font_px=30)],
        compression="raw",
    )
    wait_until(lambda: sidecars_done(scan), 30, "the first version's sidecars")
    before = scan.stat()
    first_sha = sidecars_done(scan)["source"]["sha256"]
    hidden = docs.write_tiff(
        inbox / ".replacement.tif",
        [docs.text_image(["SECOND"], size=(600, 200), font_px=30)],
        compression="raw",
    )
    assert hidden.stat().st_size == before.st_size, "the two versions must be the same size"
    os.utime(hidden, ns=(before.st_atime_ns, before.st_mtime_ns))
    second_sha = hashlib.sha256(hidden.read_bytes()).hexdigest()
    assert second_sha != first_sha
    os.rename(hidden, scan)
    assert (scan.stat().st_size, scan.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)

    def second_done() -> bool:
        data = sidecars_done(scan)
        return data is not None and data["source"]["sha256"] == second_sha

    wait_until(second_done, 30, f"the replacement's sidecars:\n{daemon.log_text()[-3000:]}")

    # Every step reads the job's private copy; an error about it still names the document in the
    # inbox.
    notes = inbox / "notes.pdf"
    notes.write_bytes(b"plain text that merely ends in .pdf\n" * 10)
    wait_until(lambda: error_sidecar(notes), 30, "the error sidecar of notes.pdf")
    error = error_sidecar(notes)["error"]
    assert error["kind"] == "not_a_document" and error["message"].startswith(f"{notes}:"), error
    assert str(daemon.state) not in error["message"]
    assert daemon.stop(timeout=30) == 0
