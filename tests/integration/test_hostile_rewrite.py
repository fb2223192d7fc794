"""A source truncated while its document is read, through the real daemon process (issue 34,
item 6): its sidecars are of the new bytes, never of the old, and the new bytes are read at once.

The PDF is written as an incremental writer writes it (each revision appended, each ending in a
trailer), so truncating it to its first revision leaves a valid one-page PDF. The truncation lands
after the run's pages were read and checked, before its outputs are published: the test holds the
ledger's write lock while the last pages are recognised, so the run waits at its next ledger write
(the one after that check), which the daemon logs as ``ledger_locked``; the file is truncated then.
"""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import DaemonProcess, sidecars_done, wait_until
from tests.support.hardening_engines import job_id_of

pytestmark = pytest.mark.integration

COUNTING = "tests.support.hardening_engines:CountingEngine"


def _object(number: int, body: bytes) -> bytes:
    return b"%d 0 obj\n%s\nendobj\n" % (number, body)


def _text_page(content: int) -> bytes:
    return (
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R"
        b" /Resources << /Font << /F1 4 0 R >> >> >>" % content
    )


def _content(page: int) -> bytes:
    text = b"BT /F1 36 Tf 72 700 Td (REVISION %d) Tj ET" % page
    return b"<< /Length %d >>\nstream\n%s\nendstream" % (len(text), text)


def _kids(pages: list[int]) -> bytes:
    refs = b" ".join(b"%d 0 R" % page for page in pages)
    return b"<< /Type /Pages /Kids [%s] /Count %d >>" % (refs, len(pages))


def incremental_pdf(pages: int) -> list[bytes]:
    """A PDF of ``pages`` pages as its revisions: a one-page PDF, then one appended update a page
    (new objects, a cross-reference section and a trailer pointing back at the previous one)."""
    out = bytearray(b"%PDF-1.7\n")
    objects = {
        1: b"<< /Type /Catalog /Pages 2 0 R >>",
        2: _kids([5]),
        3: _content(1),
        4: b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        5: _text_page(3),
    }
    offsets = {}
    for number, body in objects.items():
        offsets[number] = len(out)
        out += _object(number, body)
    xref = len(out)
    out += b"xref\n0 6\n0000000000 65535 f \n"
    out += b"".join(b"%010d 00000 n \n" % offsets[n] for n in range(1, 6))
    out += b"trailer\n<< /Size 6 /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % xref
    revisions, kids, size, previous = [bytes(out)], [5], 6, xref
    for page in range(2, pages + 1):
        base = sum(map(len, revisions))
        update = bytearray()
        content, leaf = size, size + 1
        size += 2
        kids.append(leaf)
        at = {}
        for number, body in (
            (content, _content(page)),
            (leaf, _text_page(content)),
            (2, _kids(kids)),
        ):
            at[number] = base + len(update)
            update += _object(number, body)
        xref = base + len(update)
        update += b"xref\n0 1\n0000000000 65535 f \n2 1\n%010d 00000 n \n" % at[2]
        update += b"%d 2\n%010d 00000 n \n%010d 00000 n \n" % (content, at[content], at[leaf])
        update += b"trailer\n<< /Size %d /Root 1 0 R /Prev %d >>\n" % (size, previous)
        update += b"startxref\n%d\n%%%%EOF\n" % xref
        revisions.append(bytes(update))
        previous = xref
    return revisions


@contextlib.contextmanager
def ledger_write_lock(daemon: DaemonProcess) -> Iterator[None]:
    """The ledger's write lock, as another process (``ocrwatch retry``) holds it: the daemon's
    writes wait, its reads go on (WAL)."""
    db = sqlite3.connect(daemon.state / "ledger.sqlite3", isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        yield
        db.execute("ROLLBACK")
    finally:
        db.close()


def locked_waits(daemon: DaemonProcess) -> int:
    return sum(1 for event in daemon.events() if event.get("event") == "ledger_locked")


def test_a_source_truncated_while_its_outputs_are_made_gets_sidecars_of_its_new_bytes(
    plugin_daemon, tmp_path: Path
) -> None:
    """Before: the three-page version's sidecars were published; the truncated file waited for its
    writer's next event and the settle rules. Now the content is checked again right before the
    outputs are published: the run fails ``source_changed``, the next attempt reads the one-page
    revision, and only its sidecars are ever published."""
    log = tmp_path / "recognitions.log"
    daemon = plugin_daemon(COUNTING, {"log": str(log), "delay": 0.5})
    daemon.start()
    revisions = incremental_pdf(3)
    doc = daemon.inbox / "revised.pdf"
    doc.write_bytes(b"".join(revisions))
    last_page = f" {job_id_of(doc)}/p2/"
    wait_until(lambda: log.exists() and last_page in log.read_text(), 30, "its last page read")
    waits = locked_waits(daemon)
    with ledger_write_lock(daemon):
        wait_until(lambda: locked_waits(daemon) > waits, 30, "the run waiting for the ledger")
        with open(doc, "r+b") as handle:
            handle.truncate(len(revisions[0]))
    truncated = hashlib.sha256(doc.read_bytes()).hexdigest()
    data = wait_until(
        lambda: (found := sidecars_done(doc)) and found["source"]["sha256"] == truncated and found,
        30,
        lambda: f"sidecars of the truncated file:\n{daemon.log_text()[-3000:]}",
    )
    assert data["status"] == "ok" and len(data["pages"]) == 1
    uri = doc.resolve().as_uri()

    def published() -> list[dict]:
        return [e for e in daemon.events() if e.get("event") == "job_done" and e["uri"] == uri]

    # The sidecars are written before the run's job_done line.
    wait_until(published, 30, "the job_done line of the truncated file")
    assert [e["pages"] for e in published()] == [1], "the old version's sidecars were published"
    retries = [e.get("kind") for e in daemon.events() if e.get("event") == "job_retry"]
    assert retries == ["source_changed"]
    assert daemon.stop() == 0
