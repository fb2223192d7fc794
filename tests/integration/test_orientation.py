"""Turned pages through ``ocrwatch run`` as a real process, with ``rotate_pages`` on, its default:
each is read upright, its JSON records the rotation, its Markdown reads as the page does, and its
searchable PDF carries the words."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ocrwatch.pages import orientation
from tests.conftest import corpus_path
from tests.integration.conftest import sidecars_done, wait_until
from tests.support import docs, rotated

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not all(shutil.which(tool) for tool in ("tesseract", "pdftoppm", "pdftotext")),
        reason="needs tesseract and poppler-utils",
    ),
]

LINES = list(rotated.PANGRAMS[:6])


def test_turned_pages_are_read_upright_through_the_daemon(make_daemon: Any, tmp_path: Path) -> None:
    """An upside-down PNG, a PDF page scanned on its side and, where the corpus is, its page turned
    by /Rotate and shown on its side: every rotation is recorded, the Markdown reads as the text."""
    scans = tmp_path / "scans"
    scans.mkdir()
    upright, text = docs.text_image(LINES), " ".join(LINES)
    wanted = {
        docs.write_png(scans / "upside down.png", orientation.turn(upright, 180)): (180, text),
        docs.write_pdf(scans / "sideways.pdf", [orientation.turn(upright, 90)]): (270, text),
    }
    corpus = corpus_path()
    if corpus is not None:
        wanted[corpus / "ocr_test_rotated_90.pdf"] = (90, rotated.OCR_TEST_ROTATED_90)
    daemon = make_daemon(output={"searchable_pdf": True}, render={"rotate_pages": True}).start()
    try:
        for path in wanted:
            shutil.copy(path, daemon.inbox / path.name)
        done = {
            path.name: wait_until(
                lambda p=path: sidecars_done(daemon.inbox / p.name), 300, f"{path.name} done"
            )
            for path in wanted
        }
    finally:
        daemon.stop()

    for path, (rotation, text) in wanted.items():
        document = done[path.name]
        page = document["pages"][0]
        assert document["status"] == "ok", path.name
        assert page["rotation"] == rotation, (path.name, page["orientation"])
        assert page["orientation"]["detected"] == rotation
        assert page["seconds"]["orient"] > 0
        markdown = (daemon.inbox / f"{path.name}.md").read_text()
        assert rotated.word_similarity(markdown, text) >= 0.9, (path.name, markdown)
        layer = subprocess.run(
            ["pdftotext", str(daemon.inbox / f"{path.name}.ocr.pdf"), "-"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert sorted(rotated.words(layer)) == sorted(rotated.words(page["markdown"])), path.name
    turned = [event for event in daemon.events() if event.get("event") == "page_turned"]
    assert len(turned) == len(wanted)
    # as the document's other lines: its job_id and uri, the page numbered as the sidecars do
    uris = sorted((daemon.inbox / path.name).as_uri() for path in wanted)
    assert sorted(event["uri"] for event in turned) == uris, turned
    assert all(event["page"] == 1 and event["job_id"] for event in turned), turned
