"""What users do with a result, through ``ocrwatch run`` as a real process: the searchable PDF (real
Tesseract, checked with pdftotext and qpdf) and the ALTO and hOCR files (the ALTO schema, lxml), the
source moved to the archive or deleted on success
(and kept when it must be), on local inboxes and on S3 (moto), and figures cut out of real rendered
pages (recorded DeepSeek output)."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageChops
from rapidfuzz import fuzz

from ocrwatch.config import LimitsConfig, RenderConfig
from ocrwatch.engines.tesseract import TesseractEngine
from ocrwatch.engines.tesseract_options import TesseractConfig
from ocrwatch.pages import render
from ocrwatch.pages.render import Geometry
from ocrwatch.results import alto
from tests.conftest import corpus_path
from tests.integration.conftest import DaemonProcess, wait_until
from tests.integration.test_s3_daemon import queue_empty, sidecar, sqs_daemon, started
from tests.support import docs
from tests.support.layout_pages import alto_schema
from tests.support.s3servers import MotoServer
from tests.test_textlayer import page_pdf

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not all(shutil.which(tool) for tool in ("tesseract", "pdftoppm", "pdftotext", "qpdf")),
        reason="needs tesseract, poppler-utils and qpdf",
    ),
]

LETTER = [
    ["Invoice 4711 was paid", "on the twelfth of March.", "Total amount 17.50 EUR"],
    ["Second page of the letter", "with two lines of text"],
]
FORMATS = ["md", "json", "alto", "hocr"]
BORN_DIGITAL = [("google-doc-document.pdf", 0), ("small-table.pdf", 0), ("tracemonkey.pdf", 0)]


def json_of(path: Path) -> dict[str, Any] | None:
    sidecar_path = path.with_name(path.name + ".json")
    return json.loads(sidecar_path.read_text()) if sidecar_path.exists() else None


def similarity(got: str, want: str) -> float:
    return fuzz.ratio(" ".join(got.split()), " ".join(want.split())) / 100


def pdftotext(path: Path) -> str:
    return subprocess.run(
        ["pdftotext", str(path), "-"], capture_output=True, text=True, check=True
    ).stdout


def qpdf_check(path: Path) -> None:
    done = subprocess.run(["qpdf", "--check", str(path)], capture_output=True, text=True)
    assert done.returncode == 0 and "No syntax or stream encoding errors" in done.stdout, (
        done.stdout + done.stderr
    )


def events(daemon: DaemonProcess, name: str) -> list[dict[str, Any]]:
    return [event for event in daemon.events() if event.get("event") == name]


def recorded(document: dict[str, Any], kind: str, path: Path) -> bool:
    """Whether the JSON records the file at ``path`` as its ``kind`` output, bit for bit."""
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    return document[kind] == {"path": path.name, "bytes": len(data), "sha256": digest}


def check_layouts(name: str, document: dict[str, Any], folder: Path) -> None:
    """NAME.alto.xml valid against ALTO 4.4 and NAME.hocr parsed, both recorded by the JSON, each
    page's words those of its Markdown."""
    from lxml import etree

    alto_path, hocr_path = folder / f"{name}.alto.xml", folder / f"{name}.hocr"
    assert recorded(document, "alto", alto_path) and recorded(document, "hocr", hocr_path)
    tree = etree.parse(str(alto_path))
    alto_schema().assertValid(tree)
    hocr_tree = etree.parse(str(hocr_path))
    ns = {"a": alto.NAMESPACE, "h": "http://www.w3.org/1999/xhtml"}
    alto_pages = tree.findall("a:Layout/a:Page", ns)
    hocr_pages = hocr_tree.findall(".//h:div[@class='ocr_page']", ns)
    assert len(alto_pages) == len(hocr_pages) == len(document["pages"])
    for page, in_alto, in_hocr in zip(document["pages"], alto_pages, hocr_pages, strict=True):
        said = " ".join(s.get("CONTENT") for s in in_alto.iterfind(".//a:String", ns))
        assert similarity(said, page["markdown"].replace("\\", "")) >= 0.9, (name, said)
        words = [w.text for w in in_hocr.iterfind(".//h:span[@class='ocrx_word']", ns)]
        assert " ".join(words) == said
        assert all("bbox" in w.get("title") for w in in_hocr.iterfind(".//h:span", ns))
        assert int(in_alto.get("WIDTH")) == page["width"] and in_hocr.get("title").startswith(
            f"bbox 0 0 {page['width']} {page['height']}"
        )


def test_searchable_pdf_through_the_daemon(make_daemon: Any, tmp_path: Path) -> None:
    """Born-digital pages rendered as images (a scan, no text of its own) and a PNG: NAME.ocr.pdf
    beside the sidecars holds the text Tesseract read, where pdftotext finds it, in a file qpdf
    finds sound; NAME.alto.xml and NAME.hocr hold the same words with their boxes."""
    scans = tmp_path / "scans"
    scans.mkdir()
    sources = [
        docs.write_pdf(scans / "letter.pdf", LETTER),
        docs.write_png(scans / "note.png", LETTER[0]),
    ]
    corpus = corpus_path()
    if corpus is not None:
        spec = render.render_spec(RenderConfig(), TesseractEngine(TesseractConfig()).geometry)
        for name, index in BORN_DIGITAL:
            original = corpus / name
            info = render.probe(original, render.Limits.from_config(LimitsConfig()))
            image = render.render_page(original, info, index, spec).image
            sources.append(page_pdf(scans / f"scan-{name}", image, dpi=spec.dpi))
    # at its default 300 dpi, as users run it
    tesseract = {"kind": "tesseract", "tesseract": {"workers": 2}}
    output = {"searchable_pdf": True, "formats": FORMATS}
    daemon = make_daemon(output=output, engine=tesseract).start()
    try:
        for path in sources:
            shutil.copy(path, daemon.inbox / path.name)
        done = {
            path.name: wait_until(
                lambda p=path: json_of(daemon.inbox / p.name), 300, f"{path.name} done"
            )
            for path in sources
        }
    finally:
        daemon.stop()

    figures = {}
    for name, document in done.items():
        layer = daemon.inbox / f"{name}.ocr.pdf"
        assert document["status"] == "ok" and document["searchable_pdf"] == {
            "path": f"{name}.ocr.pdf",
            "bytes": layer.stat().st_size,
            "sha256": hashlib.sha256(layer.read_bytes()).hexdigest(),
            "text_layer": ["ocr"] * len(document["pages"]),
        }
        qpdf_check(layer)
        check_layouts(name, document, daemon.inbox)
        # Tesseract reads no prompt and samples nothing: the sidecar says neither
        assert "prompt" not in document["engine"]
        assert not [t for p in document["pages"] for t in p["tries"] if "sampling" in t]
        extracted = pdftotext(layer).split("\f")[:-1]
        assert len(extracted) == len(document["pages"])
        for page, text in zip(document["pages"], extracted, strict=True):
            assert similarity(text, page["markdown"]) >= 0.9, (name, text, page["markdown"])
        stages = document["timing"]["stages"]
        figures[name] = {
            "pages": len(document["pages"]),
            "searchable_pdf_s": stages["searchable_pdf"],
            "per_page_s": round(stages["searchable_pdf"] / len(document["pages"]), 4),
            "pages_s": stages["pages"],
            "similarity": [
                round(similarity(t, p["markdown"]), 3)
                for p, t in zip(
                    document["pages"],
                    pdftotext(daemon.inbox / f"{name}.ocr.pdf").split("\f")[:-1],
                    strict=True,
                )
            ],
        }
    print("searchable PDF through the daemon:", json.dumps(figures))
    # never taken as documents
    for suffix in (".ocr.pdf", ".alto.xml", ".hocr"):
        assert not any((daemon.inbox / f"{name}{suffix}.json").exists() for name in done)


def test_move_on_success_archives_the_group_and_a_restart_leaves_it(
    make_daemon: Any, tmp_path: Path
) -> None:
    archive = tmp_path / "archive"
    inbox = tmp_path / "inbox"
    daemon = make_daemon(
        # the inbox's formats stand for [output]'s
        inboxes=[
            {"path": str(inbox), "settle_seconds": 0.3, "on_success": "move", "formats": FORMATS}
        ],
        output={"archive_dir": str(archive), "searchable_pdf": True},
    ).start()
    moved = archive / "inbox" / "2024" / "letter.pdf"
    try:
        (inbox / "2024").mkdir(parents=True)
        docs.write_pdf(inbox / "2024" / "letter.pdf", LETTER[:1])
        wait_until(lambda: json_of(moved), 120, "the JSON sidecar in the archive")
        # logged after it ends
        wait_until(lambda: events(daemon, "source_archived"), 30, "the move logged")
        assert sorted(p.name for p in moved.parent.iterdir()) == [
            "letter.pdf",
            "letter.pdf.alto.xml",
            "letter.pdf.hocr",
            "letter.pdf.json",
            "letter.pdf.md",
            "letter.pdf.ocr.pdf",
        ]
        assert list((inbox / "2024").iterdir()) == []
        assert [e["to"] for e in events(daemon, "source_archived")] == [str(moved)]
        daemon.stop()
        daemon.start()
        wait_until(lambda: events(daemon, "daemon_ready"), 60, "the restarted daemon")
        # a scan has run once this one is archived
        docs.write_png(inbox / "later.png", ["A later document"])
        wait_until(
            lambda: json_of(archive / "inbox" / "later.png"), 120, "the later document archived"
        )
    finally:
        daemon.stop()
    every = [
        json.loads(line)
        for log in sorted(tmp_path.glob("daemon-*.log"))
        for line in log.read_text().splitlines()
        if line.startswith("{")
    ]
    runs = [e["uri"] for e in every if e.get("event") == "job_started"]
    assert runs.count((inbox / "2024" / "letter.pdf").as_uri()) == 1 and len(runs) == 2
    assert not [e for e in every if e.get("level") in ("warning", "error")]


def test_delete_on_success_removes_the_source_and_keeps_the_sidecars(
    make_daemon: Any, tmp_path: Path
) -> None:
    daemon = make_daemon(
        inboxes=[{"path": str(tmp_path / "inbox"), "settle_seconds": 0.3, "on_success": "delete"}]
    )
    daemon.start()
    try:
        source = docs.write_png(daemon.inbox / "note.png", LETTER[0])
        wait_until(lambda: not source.exists(), 120, "the source deleted")
    finally:
        daemon.stop()
    assert json_of(source)["status"] == "ok"  # type: ignore[index]
    assert sorted(p.name for p in daemon.inbox.iterdir()) == ["note.png.json", "note.png.md"]


def test_a_partial_document_is_kept(plugin_daemon: Any, tmp_path: Path) -> None:
    daemon = plugin_daemon(
        "tests.support.fault_engines:LoopingEngine",
        {"mode": "always", "match": "/p1/"},
        inboxes=[{"path": str(tmp_path / "inbox"), "settle_seconds": 0.3, "on_success": "delete"}],
    ).start()
    try:
        source = docs.write_pdf(daemon.inbox / "two.pdf", LETTER)
        document = wait_until(lambda: json_of(source), 120, "the JSON sidecar")
        wait_until(lambda: events(daemon, "source_kept"), 30, "the source kept")
    finally:
        daemon.stop()
    assert document["status"] == "partial" and source.exists()


@pytest.mark.s3
@pytest.mark.parametrize("action", ["delete", "move"])
def test_s3_on_success(moto: MotoServer, tmp_path: Path, action: str) -> None:
    queue = moto.bucket_with_queue("docs", "events")
    keys = {"on_success": action, "archive_prefix": "archive/"}
    daemon = sqs_daemon(tmp_path, moto, queue, keys, output={"searchable_pdf": True}).start()
    s3, key = moto.client("s3"), "scans/page.png"
    try:
        body = docs.write_png(tmp_path / "page.png", LETTER[0]).read_bytes()
        s3.put_object(Bucket="docs", Key=key, Body=body)
        wait_until(lambda: sidecar(s3, "docs", f"{key}.json"), 120, "the JSON sidecar")
        wait_until(
            lambda: events(daemon, "source_archived" if action == "move" else "source_deleted"),
            30,
            action,
        )
        wait_until(lambda: queue_empty(moto, queue), 30, "every message deleted")
        listed = sorted(item["Key"] for item in s3.list_objects_v2(Bucket="docs")["Contents"])
        wanted = ["scans/page.png.json", "scans/page.png.md", "scans/page.png.ocr.pdf"]
        assert listed == sorted(wanted + (["archive/scans/page.png"] if action == "move" else []))
        if action == "move":
            assert s3.get_object(Bucket="docs", Key="archive/scans/page.png")["Body"].read() == body
            wait_until(
                lambda: any(e.get("reason") == "archive_prefix" for e in daemon.events()),
                30,
                "copy refused",
            )
    finally:
        daemon.stop()
    assert started(daemon, f"s3://docs/{key}") == 1
    assert not any(
        e.get("uri", "").startswith("s3://docs/archive/") for e in events(daemon, "job_started")
    )


def test_figures_are_extracted_linked_and_moved_along(plugin_daemon: Any, tmp_path: Path) -> None:
    """Recorded DeepSeek-OCR output for a paper page, on a real rendered page: its figure as a PNG
    of that page's pixels, linked from the Markdown, listed in the JSON; a move takes the assets
    along."""
    keep, move, archive = tmp_path / "keep", tmp_path / "move", tmp_path / "archive"
    daemon = plugin_daemon(
        "tests.support.figure_engines:RecordedEngine",
        {"fixture": "PAPER", "dpi": 100},
        inboxes=[
            {"path": str(keep), "settle_seconds": 0.3},
            {"path": str(move), "settle_seconds": 0.3, "on_success": "move"},
        ],
        output={"images": "extract", "archive_dir": str(archive)},
    ).start()
    paper = docs.write_pdf(
        tmp_path / "paper.pdf", [["Watching Folders for Documents", "A Field Report"]]
    )
    try:
        shutil.copy(paper, keep / "paper.pdf")
        shutil.copy(paper, move / "paper.pdf")
        document = wait_until(lambda: json_of(keep / "paper.pdf"), 120, "the JSON sidecar")
        moved = wait_until(
            lambda: json_of(archive / "move" / "paper.pdf"), 120, "the archived JSON"
        )
    finally:
        daemon.stop()

    (figure,) = document["figures"]
    assert figure["path"] == "paper.pdf.assets/page-1-figure-1.png" and figure["page"] == 1
    png = (keep / figure["path"]).read_bytes()
    assert hashlib.sha256(png).hexdigest() == figure["sha256"] and len(png) == figure["bytes"]
    info = render.probe(paper, render.Limits.from_config(LimitsConfig()))
    page = render.render_page(
        paper, info, 0, render.render_spec(RenderConfig(), Geometry(dpi=100))
    ).image
    with Image.open(io.BytesIO(png)) as image:
        assert (
            ImageChops.difference(
                image.convert(page.mode), page.crop(tuple(figure["bbox"]))
            ).getbbox()
            is None
        )
    markdown = (keep / "paper.pdf.md").read_text()
    assert (
        "![](paper.pdf.assets/page-1-figure-1.png)" in markdown
        and "![](page-1-figure-1)" not in markdown
    )

    assert moved["figures"] == document["figures"]
    assert (archive / "move" / "paper.pdf.assets" / "page-1-figure-1.png").read_bytes() == png
    assert sorted(p.name for p in move.iterdir()) == []
