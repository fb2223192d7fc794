"""Hardening: hostile inputs and injected faults, against ``ocrwatch run`` as a real process.

What every test here proves, besides its own point: the daemon stays alive, every document ends
either with sidecars or with its specific error kind (none is lost), the sources stay
byte-identical, and nothing is written outside the configured folders. The engine is a tiny test
engine (``tests.support.fault_engines``, ``tests.support.hardening_engines``) loaded as a plugin,
so the faults are
exact and the runs fast; rendering, probing, the ledger, the scheduler and the sinks are the real
ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
import zlib
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from ocrwatch.results.assemble import ERROR_SCHEMA, JSON_SCHEMA
from tests.integration.conftest import children_named, error_sidecar, sidecars_done, wait_until
from tests.support import docs
from tests.support.hardening_engines import job_id_of

pytestmark = pytest.mark.integration

ECHO = "tests.support.fault_engines:EchoEngine"
SIDECAR_SUFFIXES = (".error.json", ".json", ".md")


# --- hostile documents, made here -----------------------------------------------------------------


def raw_pdf(objects: list[bytes], root: int = 1) -> bytes:
    """A PDF with exactly these objects (numbered from 1) and a correct cross-reference table."""
    out = bytearray(b"%PDF-1.7\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root %d 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        root,
        xref,
    )
    return bytes(out)


CATALOG = b"<< /Type /Catalog /Pages 2 0 R >>"
ONE_KID = b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>"


def blank_pages_pdf(count: int) -> bytes:
    """``count`` blank Letter pages sharing one empty content stream (5,000 pages in 0.6 MB)."""
    kids = b" ".join(b"%d 0 R" % (number + 4) for number in range(count))
    page = b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 3 0 R >>"
    return raw_pdf(
        [
            CATALOG,
            b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, count),
            b"<< /Length 0 >>\nstream\n\nendstream",
            *[page] * count,
        ]
    )


def pages_tree_loop_pdf() -> bytes:
    """The page tree lists itself as its only kid."""
    return raw_pdf([CATALOG, b"<< /Type /Pages /Kids [2 0 R] /Count 1 >>"])


def deeply_nested_pdf(depth: int = 100_000) -> bytes:
    """A page carrying an array nested ``depth`` deep and a dictionary nested ``depth`` deep."""
    arrays = b"[" * depth + b"]" * depth
    dicts = b"<< /A " * depth + b"1" + b" >>" * depth
    page = (
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Junk "
        + arrays
        + b" /Info "
        + dicts
        + b" >>"
    )
    return raw_pdf([CATALOG, ONE_KID, page])


def reference_cycle_pdf() -> bytes:
    """A content stream whose /Length is a reference to a reference to itself, and a form that draws
    itself."""
    page = (
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /XObject << /X 7 0 R "
        b">> >>"
        b" /Contents 4 0 R >>"
    )
    return raw_pdf(
        [
            CATALOG,
            ONE_KID,
            page,
            b"<< /Length 5 0 R >>\nstream\n/X Do 0 0 m 10 10 l S\nendstream",
            b"6 0 R",
            b"5 0 R",
            (
                b"<< /Type /XObject /Subtype /Form /BBox [0 0 612 792] /Resources << /XObject << "
                b"/X 7 0 R >> >>"
                b" /Length 6 >>\nstream\n/X Do\n\nendstream"
            ),
        ]
    )


def deep_page_tree_pdf(depth: int = 5_000) -> bytes:
    """One page under ``depth`` levels of /Pages nodes."""
    objects = [CATALOG]
    for level in range(depth):
        number = level + 2
        parent = b"/Parent %d 0 R " % (number - 1) if level else b""
        objects.append(b"<< /Type /Pages %s/Kids [%d 0 R] /Count 1 >>" % (parent, number + 1))
    objects.append(b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 612 792] >>" % (depth + 1))
    return raw_pdf(objects)


def flate_image_pdf(side: int) -> bytes:
    """One Letter page showing a ``side`` x ``side`` grey image whose Flate stream is ~1/1000 of its
    pixels: a decompression bomb for the renderer (12,000 px: 144 MB of pixels in 140 kB, about a
    second of pdftoppm)."""
    compressor = zlib.compressobj(9)
    row = b"\x80" * side
    data = b"".join(compressor.compress(row) for _ in range(side)) + compressor.flush()
    image = (
        b"<< /Type /XObject /Subtype /Image /Width %d /Height %d /ColorSpace /DeviceGray "
        b"/BitsPerComponent 8"
        b" /Filter /FlateDecode /Length %d >>\nstream\n"
        % (side, side, len(data))
        + data
        + b"\nendstream"
    )
    content = b"q 612 0 0 792 0 0 cm /Im0 Do Q\n"
    page = (
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /XObject << /Im0 4 0 "
        b"R >> >>"
        b" /Contents 5 0 R >>"
    )
    return raw_pdf(
        [
            CATALOG,
            ONE_KID,
            page,
            image,
            b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream",
        ]
    )


def small_pdf(path: Path, tag: str, pages: int = 1) -> Path:
    return docs.write_pdf(
        path,
        [
            docs.text_image([f"{tag} page {n + 1}"], size=(420, 160), font_px=30)
            for n in range(pages)
        ],
    )


def small_png(path: Path, tag: str) -> Path:
    return docs.write_png(path, docs.text_image([tag], size=(420, 160), font_px=30))


# --- checks shared by the tests -------------------------------------------------------------------


def tree(root: Path) -> set[Path]:
    """Every path under ``root`` (symlinks not followed)."""
    found = set()
    for folder, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            found.add(Path(folder) / name)
    return found


def hashes(paths: list[Path]) -> dict[Path, str]:
    return {
        p: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in paths
        if p.is_file() and not p.is_symlink()
    }


def assert_only_sidecars_were_added(
    before: set[Path], after: set[Path], allowed_roots: list[Path]
) -> None:
    """New paths are sidecars of inputs that existed before, or lie under ``allowed_roots`` (state,
    logs...)."""
    stray = []
    for path in sorted(after - before):
        if any(path.is_relative_to(root) for root in allowed_roots) or path.name.startswith(
            "daemon-"
        ):
            continue
        name = os.fsencode(path.name)
        source = next(
            (name[: -len(s)] for s in (x.encode() for x in SIDECAR_SUFFIXES) if name.endswith(s)),
            None,
        )
        if source is None or path.with_name(os.fsdecode(source)) not in before:
            stray.append(path)
    assert not stray, f"written outside the configured folders or not a sidecar: {stray}"


def failures(daemon: Any) -> dict[str, dict[str, Any]]:
    """The last ``job_failed`` event per source URI."""
    return {e["uri"]: e for e in daemon.events() if e.get("event") == "job_failed"}


def outcome(daemon: Any, path: Path) -> str | None:
    """ "ok"/"partial" from the JSON sidecar, else the error kind from the error sidecar or the
    log."""
    # ENAMETOOLONG: no sidecar name can exist for a 255-byte source name
    with contextlib.suppress(OSError):
        data = sidecars_done(path)
        if data is not None:
            return str(data["status"])
        error = error_sidecar(path)
        if error is not None:
            return str(error["error"]["kind"])
    failed = failures(daemon).get(path.resolve().as_uri())
    return None if failed is None else str(failed["kind"])


def events_for(daemon: Any, path: Path, event: str) -> list[dict[str, Any]]:
    uri = path.resolve().as_uri()
    jid = job_id_of(path)
    return [
        e
        for e in daemon.events()
        if e.get("event") == event and (e.get("uri") == uri or e.get("job_id") == jid)
    ]


# --- adversarial inputs ---------------------------------------------------------------------------


def test_adversarial_inputs_each_get_their_kind_and_nothing_else_changes(
    plugin_daemon, tmp_path: Path
) -> None:
    """Bombs, hostile PDFs, broken and hostile files, FIFOs, symlinks and hostile names, all in one
    inbox."""
    daemon = plugin_daemon(
        inboxes=[
            {"path": str(tmp_path / "inbox"), "settle_seconds": 0.3},
            {"path": str(tmp_path / "other"), "settle_seconds": 0.3},
        ],
    )
    inbox, other = tmp_path / "inbox", tmp_path / "other"
    inbox.mkdir(exist_ok=True)
    other.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()

    expected: dict[Path, str] = {}

    def put(name: str | bytes, data: bytes, kind: str) -> Path:
        path = inbox / os.fsdecode(name)
        path.write_bytes(data)
        expected[path] = kind
        return path

    # Decompression bombs: refused before decoding / rendered small within the caps.
    put("bomb.png", docs.write_png_bomb(outside / "bomb.png").read_bytes(), "too_many_pixels")
    put("poster.pdf", docs.write_huge_page_pdf(outside / "poster.pdf", 200).read_bytes(), "ok")
    # Hostile PDF structures.
    put("5000 blank pages.pdf", blank_pages_pdf(5000), "too_many_pages")
    put("pages tree loop.pdf", pages_tree_loop_pdf(), "corrupt_pdf")
    # poppler gives up on the junk, renders a blank page
    put("deeply nested.pdf", deeply_nested_pdf(), "ok")
    put("reference cycle.pdf", reference_cycle_pdf(), "ok")
    put("deep page tree.pdf", deep_page_tree_pdf(), "ok")
    # Broken, locked, or no document at all.
    put("truncated.pdf", docs.write_truncated_pdf(outside / "t.pdf").read_bytes(), "corrupt_pdf")
    put("truncated.png", docs.write_truncated_png(outside / "t.png").read_bytes(), "corrupt_image")
    put("locked.pdf", docs.write_encrypted_pdf(outside / "l.pdf").read_bytes(), "encrypted_pdf")
    put(
        "open encrypted.pdf",
        docs.write_encrypted_pdf(outside / "o.pdf", user_password="").read_bytes(),
        "ok",
    )
    put("program.pdf", docs.write_executable(outside / "p").read_bytes(), "not_a_document")
    put("zero bytes.pdf", b"", "empty_file")
    # Hostile names: each is processed as what it is, sidecars beside it, no shell ever sees it.
    png = small_png(outside / "n.png", "hostile name").read_bytes()
    put("new\nline.png", png, "ok")
    put("a..b..png", png, "ok")
    put("x\\..\\..\\escape.png", png, "ok")
    put("$(touch pwned).png", png, "ok")
    put("`touch pwned2`;.png", png, "ok")
    put("-rf --help.png", png, "ok")
    put("é" * 120 + ".png", png, "ok")  # 244 bytes: the sidecars still fit in 255
    put(b"latin-1 caf\xe9.png", png, "ok")  # not UTF-8: the JSON must still be valid UTF-8
    put("n" * 251 + ".png", png, "name_too_long")  # 255 bytes: no sidecar name can fit
    # Not regular files, and links.
    (inbox / "folder.pdf").mkdir()
    put("folder.pdf/inside.png", png, "ok")
    os.mkfifo(inbox / "pipe.pdf")
    # A private file outside every inbox (/etc/passwd itself changes under the suite's useradd)
    secret = outside / "passwd"
    secret.write_bytes(Path("/etc/passwd").read_bytes())
    secret.chmod(0o600)
    (inbox / "passwd.pdf").symlink_to(secret)
    theirs = small_png(other / "theirs.png", "the other inbox")
    expected[theirs] = "ok"
    (inbox / "into other inbox.png").symlink_to(theirs)
    real = put("real.png", png, "ok")
    (inbox / "alias.png").symlink_to(real.name)

    growing = inbox / "growing.pdf"
    growing_bytes = small_pdf(outside / "g.pdf", "grown", pages=3).read_bytes()
    expected[growing] = "ok"
    secret_before = hashes([secret])
    before = tree(tmp_path)
    inputs = [p for p in expected if p != growing]
    source_hashes = hashes(inputs)

    daemon.start()

    def grow() -> None:
        """30 s of appends, one chunk a second through one open handle; whole only at the end."""
        with open(growing, "wb") as handle:
            chunks = 30
            step = -(-len(growing_bytes) // chunks)
            for start in range(0, len(growing_bytes), step):
                handle.write(growing_bytes[start : start + step])
                handle.flush()
                time.sleep(30 / chunks)

    writer = threading.Thread(target=grow)
    writer.start()
    try:
        wait_until(
            lambda: all(outcome(daemon, p) for p in expected if p != growing),
            75,
            "an outcome for every hostile input",
        )
        writer.join()
        wait_until(lambda: outcome(daemon, growing), 30, "the grown file")
        assert daemon.proc.poll() is None, "the daemon died"
        got = {p.name: outcome(daemon, p) for p in expected}
        assert got == {p.name: kind for p, kind in expected.items()}
        for path, kind in expected.items():
            if kind == "name_too_long":
                continue
            data = sidecars_done(path)
            if data is not None:
                jsonschema.validate(data, JSON_SCHEMA)
                path.with_name(path.name + ".json").read_bytes().decode("utf-8")  # strict UTF-8
                assert data["source"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
            elif (error := error_sidecar(path)) is not None:
                jsonschema.validate(error, ERROR_SCHEMA)
                assert error["error"]["hint"]

        # The 200-inch page was rendered at a lower DPI, within the caps.
        poster = sidecars_done(inbox / "poster.pdf")
        assert max(poster["pages"][0]["width"], poster["pages"][0]["height"]) <= 4096
        assert poster["pages"][0]["dpi"] < 100
        # The 5,000-page PDF was refused by the probe: nothing rendered, and quickly.
        blank = inbox / "5000 blank pages.pdf"
        started, failed = (
            events_for(daemon, blank, "job_started"),
            events_for(daemon, blank, "job_failed"),
        )
        assert "5000 pages" in failed[0]["error"]
        with sqlite3.connect(daemon.state / "ledger.sqlite3") as db:
            row = db.execute(
                "select pages_total, pages_done from jobs where key = ?",
                (blank.resolve().as_uri(),),
            ).fetchone()
        assert row == (None, 0), "pages of the 5,000-page PDF were rendered"
        assert _seconds(failed[0]) - _seconds(started[0]) < 5
        # The growing file was taken once, when complete.
        assert len(events_for(daemon, growing, "job_started")) == 1
        assert sidecars_done(growing)["source"]["bytes"] == len(growing_bytes)
        assert len(sidecars_done(growing)["pages"]) == 3
        # Refused without a job: the FIFO, the link out of the inbox, the directory, the link into
        # another inbox.
        refused = {
            Path(e["path"]).name: e["reason"]
            for e in daemon.events()
            if e.get("event") == "local_refused"
        }
        assert "not a regular file" in refused["pipe.pdf"]
        assert "outside the inbox" in refused["passwd.pdf"]
        assert "outside the inbox" in refused["into other inbox.png"]
        started_uris = {e["uri"] for e in daemon.events() if e.get("event") == "job_started"}
        for name in ("pipe.pdf", "passwd.pdf", "folder.pdf", "into other inbox.png", "alias.png"):
            assert (inbox / name).absolute().as_uri() not in started_uris, name
        assert len(events_for(daemon, theirs, "job_started")) == 1
        assert len(events_for(daemon, real, "job_started")) == 1
        # No shell ever ran a file name.
        assert not [p for p in tree(tmp_path) if p.name.startswith("pwned")]
        assert not list(Path.cwd().glob("pwned*"))
        assert daemon.proc.poll() is None
    finally:
        writer.join()
    assert daemon.stop(timeout=30) == 0, "the daemon did not stop cleanly (a FIFO may block it)"
    assert hashes(inputs) == source_hashes, "a source was modified"
    assert hashes([secret]) == secret_before
    for suffix in SIDECAR_SUFFIXES:
        assert not secret.with_name(secret.name + suffix).exists()
    assert_only_sidecars_were_added(before | {growing}, tree(tmp_path), [daemon.state])


def _seconds(event: dict[str, Any]) -> float:
    from datetime import datetime

    # 3.10 reads no Z
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


def test_a_file_deleted_before_processing_and_one_replaced_during_it(
    plugin_daemon, tmp_path: Path
) -> None:
    """One document at a time, each page 1 s: B waits behind A and is deleted while it waits; C is
    replaced (renamed over) while its pages are being recognised."""
    log = tmp_path / "recognitions.log"
    daemon = plugin_daemon(
        "tests.support.hardening_engines:CountingEngine",
        {"log": str(log), "delay": 1.0},
        scheduler={"max_active_documents": 1, "render_ahead": 1},
    )
    daemon.start()
    inbox = daemon.inbox
    a = small_pdf(inbox / "a.pdf", "blocker", pages=2)
    wait_until(lambda: events_for(daemon, a, "job_started"), 20, "A started")
    b = small_png(inbox / "b.png", "deleted")
    b_bytes = b.read_bytes()
    wait_until(
        lambda: [
            e
            for e in daemon.events()
            if e.get("event") == "local_submitted" and e["path"] == str(b)
        ],
        20,
        "B submitted",
    )
    b.unlink()
    wait_until(lambda: events_for(daemon, b, "job_failed"), 30, "B failed")
    assert events_for(daemon, b, "job_failed")[-1]["kind"] == "source_gone"
    assert not any(inbox.glob("b.png*")), "a sidecar was written for a file that is gone"
    # The same file put back is a new chance, not a remembered failure.
    b.write_bytes(b_bytes)
    wait_until(lambda: sidecars_done(b), 30, "B processed once it is back")

    c = small_pdf(inbox / "c.pdf", "before the replacement", pages=3)
    jid = job_id_of(c)
    wait_until(
        lambda: log.exists() and f" {jid}/p0/" in log.read_text(),
        30,
        "C's first page in the engine",
    )
    replacement = small_pdf(tmp_path / "c-new.pdf", "after the replacement", pages=1)
    os.replace(replacement, c)
    new_hash = hashlib.sha256(c.read_bytes()).hexdigest()
    data = wait_until(
        lambda: (d := sidecars_done(c)) and d["source"]["sha256"] == new_hash and d,
        40,
        "C's new sidecars",
    )
    assert data["status"] == "ok" and len(data["pages"]) == 1
    assert c.with_name("c.pdf.md").read_text().count("<!-- page ") == 1
    assert any(e.get("kind") == "source_changed" for e in events_for(daemon, c, "job_retry")), (
        "no source_changed retry"
    )
    assert not error_sidecar(c)
    assert sidecars_done(a)["status"] == "ok"
    assert daemon.proc.poll() is None
    assert daemon.stop() == 0


def test_full_disk_leaves_no_torn_sidecar_and_the_job_is_retried(
    plugin_daemon, tmpfs, tmp_path: Path
) -> None:
    """The inbox's filesystem is full: ``disk_full`` is retried with backoff, no partial or
    temporary file is left, and once space is freed the sidecars appear whole."""
    small = tmpfs(tmp_path / "small-inbox", "512k")
    doc = small_pdf(small / "doc.pdf", "full disk", pages=2)
    source_hash = hashes([doc])
    filler = small / ".filler"
    with contextlib.suppress(OSError), open(filler, "wb") as handle:
        while True:
            handle.write(b"\0" * 4096)
            handle.flush()
    daemon = plugin_daemon(
        inboxes=[{"path": str(small), "settle_seconds": 0.3}],
        retry={"attempts": 8, "backoff_initial_seconds": 0.5, "backoff_max_seconds": 1.0},
    )
    daemon.start()
    wait_until(
        lambda: any(e.get("kind") == "disk_full" for e in events_for(daemon, doc, "job_retry")),
        30,
        "a disk_full retry",
    )
    names = sorted(p.name for p in small.iterdir())
    assert names in (
        sorted([".filler", "doc.pdf"]),
        sorted([".filler", "doc.pdf", "doc.pdf.md"]),
    ), names
    # the Markdown fitted; it is whole, and the JSON (the marker) is not there
    if (small / "doc.pdf.md").exists():
        assert (small / "doc.pdf.md").read_text().count("<!-- page ") == 2
    filler.unlink()
    data = wait_until(lambda: sidecars_done(doc), 30, "sidecars once space is free")
    assert data["status"] == "ok" and len(data["pages"]) == 2
    assert sorted(p.name for p in small.iterdir()) == ["doc.pdf", "doc.pdf.json", "doc.pdf.md"]
    assert hashes([doc]) == source_hash
    assert not events_for(daemon, doc, "job_failed")
    assert daemon.stop() == 0


# --- injected faults ------------------------------------------------------------------------------


def _pages_ok(path: Path, pages: int) -> bool:
    data = sidecars_done(path)
    return data is not None and data["status"] == "ok" and len(data["pages"]) == pages


def test_engine_crashing_on_every_7th_page_loses_nothing(plugin_daemon) -> None:
    """``EngineDead`` on every 7th page: the engine is rebuilt, the pages in flight are requeued,
    every document ends ok."""
    daemon = plugin_daemon(
        "tests.support.fault_engines:CrashingEngine", {"every": 7, "delay": 0.05}
    )
    daemon.start()
    paths = [small_pdf(daemon.inbox / f"crash {n}.pdf", f"crash {n}", pages=3) for n in range(8)]
    wait_until(
        lambda: all(sidecars_done(p) for p in paths), 90, "every document despite the crashes"
    )
    assert all(_pages_ok(p, 3) for p in paths)
    metrics = daemon.metrics()
    restarts = float(
        next(
            line.split()[-1]
            for line in metrics.splitlines()
            if line.startswith("ocrwatch_engine_restarts_total")
        )
    )
    assert restarts >= 3, metrics
    assert len([e for e in daemon.events() if e.get("event") == "page_requeued"]) >= 3
    assert not failures(daemon)
    assert daemon.stop() == 0


def test_hanging_engine_is_cut_off_by_the_page_timeout(plugin_daemon, tmp_path: Path) -> None:
    """A page whose first attempt never answers is aborted after ``page_timeout_seconds`` and
    succeeds on the next rung; a page that never answers at all is marked failed and its document is
    partial, not lost."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    recovers, never = inbox / "recovers.pdf", inbox / "never.png"
    match = f"^{job_id_of(recovers)}/p1/a0$|^{job_id_of(never)}/p0/"
    daemon = plugin_daemon(
        "tests.support.fault_engines:HangingEngine",
        {"match": match},
        engine={"page_timeout_seconds": 1.0},
    )
    daemon.start()
    small_pdf(recovers, "recovers", pages=2)
    small_png(never, "never answered")
    wait_until(lambda: sidecars_done(recovers) and sidecars_done(never), 30, "both documents")
    data = sidecars_done(recovers)
    assert data["status"] == "ok"
    assert [t["outcome"] for t in data["pages"][1]["tries"]] == ["page_timeout", "ok"]
    data = sidecars_done(never)
    assert data["status"] == "partial" and data["pages"][0]["status"] == "failed"
    assert {t["outcome"] for t in data["pages"][0]["tries"]} == {"page_timeout"}
    assert data["pages"][0]["error"]["kind"] == "page_failed"
    assert daemon.stop() == 0


def test_looping_and_garbage_output_still_make_valid_sidecars(
    plugin_daemon, tmp_path: Path
) -> None:
    """Output that loops on every rung fails its page (document partial); output that is garbage
    (surrogates, NULs, bidi overrides, fake page markers, broken layout tags, 1 MB, nothing) is
    written as valid UTF-8."""
    inbox = tmp_path / "loops" / "inbox"
    inbox.mkdir(parents=True)
    loops, fine = inbox / "loops.png", inbox / "fine.png"
    daemon = plugin_daemon(
        "tests.support.fault_engines:LoopingEngine",
        {"mode": "always", "match": f"^{job_id_of(loops)}/"},
        root=tmp_path / "loops",
    )
    daemon.start()
    small_png(loops, "loops")
    small_png(fine, "fine")
    wait_until(
        lambda: sidecars_done(loops) and sidecars_done(fine), 30, "looping and fine documents"
    )
    data = sidecars_done(loops)
    assert data["status"] == "partial" and data["pages"][0]["status"] == "failed"
    assert {t["outcome"] for t in data["pages"][0]["tries"]} == {"loop"} and len(
        data["pages"][0]["tries"]
    ) >= 2
    assert sidecars_done(fine)["status"] == "ok"
    assert daemon.stop() == 0

    from tests.support.hardening_engines import GARBAGE

    daemon = plugin_daemon(
        "tests.support.hardening_engines:GarbageEngine", root=tmp_path / "garbage"
    )
    daemon.start()
    doc = small_pdf(daemon.inbox / "garbage.pdf", "garbage", pages=len(GARBAGE))
    data = wait_until(lambda: sidecars_done(doc), 60, "the garbage document")
    jsonschema.validate(data, JSON_SCHEMA)
    # strict UTF-8, strict JSON
    json.loads(doc.with_name("garbage.pdf.json").read_bytes().decode("utf-8"))
    markdown = doc.with_name("garbage.pdf.md").read_bytes().decode("utf-8")
    assert markdown.startswith("<!-- page 1 -->") and len(data["pages"]) == len(GARBAGE)
    assert daemon.proc.poll() is None
    assert daemon.stop() == 0


def test_pdftoppm_killed_mid_page_is_retried_not_called_corrupt(plugin_daemon) -> None:
    """SIGKILL to ``pdftoppm`` (as the OOM killer would) while it renders: ``render_failed``,
    retried, then ok."""
    daemon = plugin_daemon(
        retry={"attempts": 5, "backoff_initial_seconds": 0.2, "backoff_max_seconds": 0.5}
    )
    daemon.start()
    killed: list[int] = []
    stop = threading.Event()

    def killer() -> None:
        while not stop.is_set() and len(killed) < 2:
            for child in children_named(daemon.proc.pid, "pdftoppm"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
                    killed.append(child)
            time.sleep(0.005)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    doc = daemon.inbox / "slow page.pdf"
    doc.write_bytes(flate_image_pdf(12_000))
    try:
        wait_until(lambda: outcome(daemon, doc), 60, "the slow page")
    finally:
        stop.set()
        thread.join()
    assert killed, "pdftoppm was never seen running"
    assert outcome(daemon, doc) == "ok", failures(daemon)
    kinds = [e.get("kind") for e in events_for(daemon, doc, "job_retry")]
    assert kinds.count("render_failed") >= 1 and set(kinds) <= {"render_failed"}, kinds
    assert daemon.stop() == 0


def test_ledger_locked_by_another_process_delays_but_loses_nothing(
    plugin_daemon, tmp_path: Path
) -> None:
    """Another process holds the ledger's write lock for 5 s: the daemon keeps answering /healthz
    (the event loop never blocks on the lock), waits, and then processes everything that arrived
    meanwhile."""
    daemon = plugin_daemon()
    daemon.start()
    warm = small_png(daemon.inbox / "before.png", "before the lock")
    wait_until(lambda: sidecars_done(warm), 20, "a document before the lock")
    script = (
        "import sqlite3, sys, time\n"
        "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "db.execute('BEGIN EXCLUSIVE'); print('locked', flush=True)\n"
        "time.sleep(5); db.execute('COMMIT')\n"
    )
    locker = subprocess.Popen(
        [sys.executable, "-c", script, str(daemon.state / "ledger.sqlite3")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert locker.stdout.readline().strip() == "locked"
        paths = [small_png(daemon.inbox / f"during {n}.png", f"during {n}") for n in range(3)]
        health_latencies = []
        while locker.poll() is None:
            t0 = time.monotonic()
            with urllib.request.urlopen(
                f"http://127.0.0.1:{daemon.port}/healthz", timeout=4
            ) as response:
                assert response.status == 200
            health_latencies.append(time.monotonic() - t0)
            time.sleep(0.25)
        # a loop blocked on the lock would answer only once it ends, seconds later
        assert max(health_latencies) < 2.5, health_latencies
    finally:
        locker.wait(10)
    wait_until(
        lambda: all(sidecars_done(p) for p in paths), 40, "documents that arrived during the lock"
    )
    assert any(e.get("event") == "ledger_locked" for e in daemon.events())
    assert not failures(daemon)
    assert daemon.stop() == 0


def test_s3_errors_and_slowness_are_retried_not_failed() -> None:
    """S3 answering 500/503/SlowDown or timing out: each call is retried with backoff, and what
    survives the retries is ``storage_unavailable`` (transient: the document is retried, never
    failed for it). The source's outage handling end to end is
    ``tests/test_sources_s3.py::test_polling_survives_an_outage...``."""
    botocore = pytest.importorskip("botocore.exceptions")
    from ocrwatch.infra import s3client as s3

    def client_error(status: int, code: str) -> Exception:
        return botocore.ClientError(
            {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject"
        )

    for exc in (
        client_error(500, "InternalError"),
        client_error(503, "ServiceUnavailable"),
        client_error(503, "SlowDown"),
        botocore.ReadTimeoutError(endpoint_url="http://s3"),
        botocore.EndpointConnectionError(endpoint_url="http://s3"),
    ):
        assert s3.is_transient(exc), exc
        assert s3.storage_error(exc, "downloading").retryable
    assert not s3.is_transient(client_error(404, "NoSuchKey"))
    answers = [client_error(503, "SlowDown"), client_error(500, "InternalError"), "body"]

    def flaky() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert s3.call(flaky, attempts=3) == "body" and not answers


def test_a_page_cancelled_before_its_task_ran_gives_its_engine_slot_back() -> None:
    """The exact interleaving behind the stall the crashing-engine test found (and that a document
    failing on one page while another was just dispatched can still hit): dispatch, then cancel in
    the same step."""
    from PIL import Image

    from ocrwatch.pages.render import RenderedPage
    from ocrwatch.pages.scheduler import PageScheduler
    from tests.support.pages import added, answered

    async def scenario() -> tuple[int, int]:
        async def recognize(doc: Any, request: Any) -> str:
            await asyncio.sleep(10)
            return "never"

        sized = PageScheduler(max_inflight=2, render_ahead=2, render_workers=1, ageing_seconds=30)
        scheduler = answered(sized, recognize)
        scheduler.pause_engine()
        page = RenderedPage(
            index=0, image=Image.new("L", (8, 8)), dpi=72.0, width=8, height=8, seconds=0.0
        )
        doc = added(
            scheduler,
            "d",
            priority=50,
            detected_at=time.time(),
            pages=1,
            prompt="p",
            render=lambda i: page,
        )
        while scheduler.budget.ready < 1:
            await asyncio.sleep(0.01)
        scheduler.resume_engine()  # dispatches: the page's task is created, not yet run
        await scheduler.cancel(doc)  # ...and cancelled in the same step
        await asyncio.sleep(0.05)
        inflight = scheduler.budget.inflight
        await scheduler.close()
        return inflight, len(doc.inflight)

    assert asyncio.run(scenario()) == (0, 0)


def test_a_flate_bomb_page_is_cut_off_by_the_render_deadline(tmp_path: Path) -> None:
    """A 140 kB PDF whose page holds 144 MB of pixels: pdftoppm stays small in memory (poppler
    streams the image) but takes its time; past ``[render] timeout_seconds`` it is killed and the
    page is ``render_timeout`` (transient: retried, then the document fails with that kind). No
    pdftoppm outlives it."""
    from ocrwatch.config import RenderConfig
    from ocrwatch.errors import RenderTimeout
    from ocrwatch.pages.render import Limits, probe, render_page, render_spec

    bomb = tmp_path / "bomb.pdf"
    bomb.write_bytes(flate_image_pdf(12_000))
    info = probe(bomb, Limits(max_bytes=10**9, max_pages=10))
    t0 = time.monotonic()
    with pytest.raises(RenderTimeout):
        render_page(bomb, info, 0, render_spec(RenderConfig(dpi=100, timeout_seconds=0.1)))
    assert time.monotonic() - t0 < 2
    assert not children_named(os.getpid(), "pdftoppm")
