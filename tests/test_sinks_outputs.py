"""The further outputs through the real sinks (local folders, moto): the searchable PDF and the
figures are written before the JSON, a previous version's are removed, and a user's file at their
names is never replaced."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import pikepdf
import pytest
from PIL import Image

from ocrwatch import safefs
from ocrwatch.config import S3Config
from ocrwatch.errors import OutputConflict
from ocrwatch.recognize.figures import crop
from ocrwatch.results import textlayer
from ocrwatch.results.assemble import SCHEMA_ID
from ocrwatch.sinks.local import LocalSink
from ocrwatch.sinks.s3 import S3Sink
from ocrwatch.sources.base import Job, LocalFile, S3Object
from tests.support.s3servers import MotoServer

MD = "<!-- page 1 -->\n\n![](report.pdf.assets/page-1-figure-1.png)\n"
ERROR = {"schema": SCHEMA_ID, "status": "failed", "source": {}, "error": {"kind": "corrupt_pdf"}}


def figure_png(number: int = 1) -> bytes:
    image = Image.new("RGB", (300, 200), (number * 40, 90, 200))
    return crop(
        image, [{"type": "image", "bbox": [10, 10, 110, 60], "name": f"page-1-figure-{number}"}], 1
    )[0].png


def document(pdf: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {"schema": SCHEMA_ID, "status": "ok", "source": {"name": "report.pdf"}}
    if pdf:
        body["searchable_pdf"] = {"path": "report.pdf.ocr.pdf", "bytes": 8, "sha256": "0" * 64}
    return body


def extras(tmp_path: Path, *figures: int, pdf: bool = True) -> dict[str, bytes | Path]:
    out: dict[str, bytes | Path] = {
        f"report.pdf.assets/page-1-figure-{n}.png": figure_png(n) for n in figures
    }
    if pdf:
        built = tmp_path / "spool-searchable.pdf"
        built.write_bytes(b"%PDF-1.7 searchable")
        out["report.pdf.ocr.pdf"] = built
    return out


@pytest.fixture
def source(tmp_path: Path) -> Path:
    (tmp_path / "inbox").mkdir()
    path = tmp_path / "inbox" / "report.pdf"
    path.write_bytes(b"%PDF-1.4")
    return path


def job_for(path: Path) -> Job:
    return Job(LocalFile(path, path.parent), "local")


def test_outputs_are_written_before_the_json(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    order: list[str] = []
    real = safefs.Folder.commit

    def commit(self: safefs.Folder, staged: safefs.Staged) -> None:
        order.append(staged.name)
        real(self, staged)

    monkeypatch.setattr(safefs.Folder, "commit", commit)
    LocalSink().write(job_for(source), MD, document(), extras(tmp_path, 1, 2))

    folder = source.parent
    assert order[-1] == "report.pdf.json" and set(order[:-1]) == {
        "report.pdf.md",
        "page-1-figure-1.png",
        "page-1-figure-2.png",
        "report.pdf.ocr.pdf",
    }
    assert (folder / "report.pdf.ocr.pdf").read_bytes() == b"%PDF-1.7 searchable"
    assert (folder / "report.pdf.assets" / "page-1-figure-2.png").read_bytes() == figure_png(2)
    assert LocalSink().status(job_for(source)) == "ok"


def test_a_new_version_removes_what_the_old_one_had_and_keeps_a_users_file(
    source: Path, tmp_path: Path
) -> None:
    sink, folder = LocalSink(), source.parent
    sink.write(job_for(source), MD, document(), extras(tmp_path, 1, 2))
    (folder / "report.pdf.assets" / "notes.txt").write_text("mine")
    sink.write(job_for(source), MD, document(pdf=False), extras(tmp_path, 1, pdf=False))
    assert sorted(p.name for p in (folder / "report.pdf.assets").iterdir()) == [
        "notes.txt",
        "page-1-figure-1.png",
    ]
    assert not (folder / "report.pdf.ocr.pdf").exists()

    (folder / "report.pdf.assets" / "notes.txt").unlink()
    sink.write_error(job_for(source), ERROR)  # a failed version keeps no output of an earlier one
    assert sorted(p.name for p in folder.iterdir()) == ["report.pdf", "report.pdf.error.json"]


def test_a_users_files_at_the_output_names_are_refused_or_left(
    source: Path, tmp_path: Path
) -> None:
    sink, folder = LocalSink(), source.parent
    (folder / "report.pdf.ocr.pdf").write_bytes(b"%PDF made by someone else")
    with pytest.raises(OutputConflict, match="report.pdf.ocr.pdf"):
        sink.write(job_for(source), MD, document(), extras(tmp_path))
    # nothing written
    assert sorted(p.name for p in folder.iterdir()) == ["report.pdf", "report.pdf.ocr.pdf"]

    # not writing one: the user's file is left alone
    sink.write(job_for(source), MD, document(pdf=False), {})
    sink.write(job_for(source), MD, document(pdf=False), {})
    assert (folder / "report.pdf.ocr.pdf").read_bytes() == b"%PDF made by someone else"

    (folder / "report.pdf.assets").mkdir()
    (folder / "report.pdf.assets" / "page-1-figure-1.png").write_bytes(plain_png())
    with pytest.raises(OutputConflict, match="page-1-figure-1.png"):
        sink.write(job_for(source), MD, document(pdf=False), extras(tmp_path, 1, pdf=False))


def test_figures_left_by_a_write_that_never_reached_its_json_are_replaced(
    source: Path, tmp_path: Path
) -> None:
    assets = source.parent / "report.pdf.assets"
    assets.mkdir()
    (assets / "page-1-figure-1.png").write_bytes(figure_png(3))  # ocrwatch's mark, no JSON yet
    LocalSink().write(job_for(source), MD, document(pdf=False), extras(tmp_path, 1, pdf=False))
    assert (assets / "page-1-figure-1.png").read_bytes() == figure_png(1)


def marked_pdf(path: Path, sha256: str = "ab" * 32) -> Path:
    """A searchable PDF as ocrwatch writes it (through ``textlayer``), of a one-page PDF with no
    text."""
    blank = path.with_name("blank.pdf")
    with pikepdf.new() as pdf:
        pdf.add_blank_page()
        pdf.save(blank)
    textlayer.searchable_pdf(blank, "pdf", [None], path, sha256)
    return path


def test_a_searchable_pdf_left_by_a_write_that_never_reached_its_json_is_replaced(
    source: Path, tmp_path: Path
) -> None:
    # the PDF renamed in place, killed before the JSON
    left = marked_pdf(source.parent / "report.pdf.ocr.pdf")
    LocalSink().write(job_for(source), MD, document(), extras(tmp_path))
    assert left.read_bytes() == b"%PDF-1.7 searchable"

    marked_pdf(left)  # and removed, like a marked figure, once a version without one is written
    LocalSink().write(job_for(source), MD, document(pdf=False), {})
    assert not left.exists()

    with pikepdf.new() as pdf:  # a user's real PDF, not marked: refused as before
        pdf.add_blank_page()
        pdf.docinfo["/Producer"] = "ocrwatch/1 but not by ocrwatch"
        pdf.save(left)
    with pytest.raises(OutputConflict, match="report.pdf.ocr.pdf"):
        LocalSink().write(job_for(source), MD, document(), extras(tmp_path))


def test_a_name_that_is_not_an_output_is_refused(source: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        LocalSink().write(job_for(source), MD, document(), {"../elsewhere.pdf": b"x"})
    with pytest.raises(ValueError):
        LocalSink().write(job_for(source), MD, document(), {"report.pdf.assets/../../x.png": b"x"})


def plain_png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (4, 4)).save(out, "PNG")
    return out.getvalue()


@pytest.mark.s3
def test_s3_outputs_beside_the_key(moto: MotoServer, tmp_path: Path) -> None:
    s3 = moto.client("s3")
    s3.create_bucket(Bucket="docs")
    sink = S3Sink(S3Config(queue_url="q", **moto.s3_config()), s3)
    job = Job(S3Object("docs", "in/report.pdf", etag="abc", version_id=None, size=8), "s3")
    sink.write(job, MD, document(), extras(tmp_path, 1, 2))

    listed = sorted(item["Key"] for item in s3.list_objects_v2(Bucket="docs")["Contents"])
    assert listed == [
        "in/report.pdf.assets/page-1-figure-1.png",
        "in/report.pdf.assets/page-1-figure-2.png",
        "in/report.pdf.json",
        "in/report.pdf.md",
        "in/report.pdf.ocr.pdf",
    ]
    pdf = s3.get_object(Bucket="docs", Key="in/report.pdf.ocr.pdf")
    assert pdf["ContentType"] == "application/pdf" and pdf["Body"].read() == b"%PDF-1.7 searchable"
    assert (
        s3.head_object(Bucket="docs", Key="in/report.pdf.assets/page-1-figure-1.png")["ContentType"]
        == "image/png"
    )
    assert sink.status(job) == "ok"

    s3.put_object(Bucket="docs", Key="in/report.pdf.assets/readme.txt", Body=b"mine")
    sink.write(job, MD, document(pdf=False), extras(tmp_path, 2, pdf=False))
    listed = sorted(item["Key"] for item in s3.list_objects_v2(Bucket="docs")["Contents"])
    assert listed == [
        "in/report.pdf.assets/page-1-figure-2.png",
        "in/report.pdf.assets/readme.txt",
        "in/report.pdf.json",
        "in/report.pdf.md",
    ]

    sink.write_error(job, ERROR)
    listed = sorted(item["Key"] for item in s3.list_objects_v2(Bucket="docs")["Contents"])
    assert listed == ["in/report.pdf.assets/readme.txt", "in/report.pdf.error.json"]

    s3.put_object(Bucket="docs", Key="in/report.pdf.ocr.pdf", Body=b"someone else's")
    with pytest.raises(OutputConflict):
        sink.write(job, MD, document(), extras(tmp_path))

    s3.put_object(
        Bucket="docs",
        Key="in/report.pdf.ocr.pdf",
        Body=marked_pdf(tmp_path / "left.pdf").read_bytes(),
        Metadata={"ocrwatch-source-etag": "abc"},
    )
    # left by an older ocrwatch's write that never reached its JSON: ocrwatch's by its mark
    sink.write(job, MD, document(), extras(tmp_path))
    assert (
        s3.get_object(Bucket="docs", Key="in/report.pdf.ocr.pdf")["Body"].read()
        == b"%PDF-1.7 searchable"
    )


def test_outputs_and_archived_copies_are_never_taken_for_documents(tmp_path: Path) -> None:
    from ocrwatch.config import InboxConfig
    from ocrwatch.naming import is_output
    from ocrwatch.sources.local import LocalSource
    from ocrwatch.sources.s3events import refusal

    assert is_output("in/report.pdf.ocr.pdf") and is_output("report.OCR.PDF")
    assert is_output("in/report.pdf.assets/page-12-figure-3.png")
    assert is_output("in/report.pdf.alto.xml") and is_output("report.pdf.hocr")
    assert not is_output("in/report.pdf.assets/cover.png") and not is_output(
        "in/page-1-figure-1.png"
    )
    inbox = tmp_path / "inbox"
    source = LocalSource([InboxConfig(path=inbox)], reconcile_seconds=60, name_template="{stem}")
    (watched,) = source._inboxes.values()
    assert watched.accepts(inbox / "scan.pdf") and watched.accepts(
        inbox / "report.pdf.assets" / "cover.png"
    )
    assert not watched.accepts(inbox / "scan.ocr.pdf")
    assert not watched.accepts(inbox / "sub" / "scan.assets" / "page-1-figure-1.png")

    cfg = S3Config(queue_url="q", archive_prefix="done/")
    assert refusal(cfg, S3Object("docs", "in/scan.pdf")) is None
    assert refusal(cfg, S3Object("docs", "done/in/scan.pdf")) == "archive_prefix"
    assert refusal(cfg, S3Object("docs", "in/scan.pdf.ocr.pdf")) == "own_sidecar"
    assert refusal(cfg, S3Object("docs", "in/scan.pdf.assets/page-1-figure-1.png")) == "own_sidecar"


LAYOUTS = {"report.pdf.alto.xml": b'<?xml version="1.0"?><alto/>', "report.pdf.hocr": b"<html/>"}


def with_layouts(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` recording the ALTO and hOCR files, as ``results.further`` does."""
    for kind, name in (("alto", "report.pdf.alto.xml"), ("hocr", "report.pdf.hocr")):
        body[kind] = {"path": name, "bytes": len(LAYOUTS[name]), "sha256": "0" * 64}
    return body


def test_alto_and_hocr_come_and_go_with_their_json_and_a_users_file_stays(
    source: Path, tmp_path: Path
) -> None:
    """Without a record of outputs (``ocrwatch ocr``), the JSON that records them marks them."""
    sink, folder = LocalSink(), source.parent
    sink.write(job_for(source), MD, with_layouts(document(pdf=False)), dict(LAYOUTS))
    assert {name: (folder / name).read_bytes() for name in LAYOUTS} == LAYOUTS
    sink.write(job_for(source), MD, with_layouts(document(pdf=False)), dict(LAYOUTS))  # replaced
    sink.write(job_for(source), MD, document(pdf=False), {})
    assert not any((folder / name).exists() for name in LAYOUTS)

    (folder / "report.pdf.hocr").write_bytes(b"<html>a user's</html>")
    with pytest.raises(OutputConflict, match="report.pdf.hocr"):
        sink.write(job_for(source), MD, with_layouts(document(pdf=False)), dict(LAYOUTS))
    sink.write_error(job_for(source), ERROR)
    assert (folder / "report.pdf.hocr").read_bytes() == b"<html>a user's</html>"
    (folder / "report.pdf.hocr").unlink()
    sink.write(job_for(source), MD, with_layouts(document(pdf=False)), dict(LAYOUTS))
    sink.write_error(job_for(source), ERROR)
    assert sorted(p.name for p in folder.iterdir()) == ["report.pdf", "report.pdf.error.json"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_a_json_of_another_user_vouches_for_no_output_of_the_daemons_user(
    source: Path, tmp_path: Path
) -> None:
    """Without a record of outputs, the JSON's say marks the ALTO, hOCR and PDF files only where it
    is the daemon's user's, as they are: one given to a user, who may write it at will, would let
    them claim any file of the daemon's user at those names."""
    sink, folder = LocalSink(), source.parent
    sink.write(job_for(source), MD, with_layouts(document()), {**LAYOUTS, **extras(tmp_path)})
    os.chown(folder / "report.pdf.json", 65534, 65534)
    sink.write_error(job_for(source), ERROR)
    kept = {"report.pdf", "report.pdf.error.json", "report.pdf.json", "report.pdf.ocr.pdf"}
    assert {p.name for p in folder.iterdir()} == kept | set(LAYOUTS)  # the Markdown marks itself


def test_s3_alto_and_hocr_beside_the_key(moto: MotoServer) -> None:
    s3 = moto.client("s3")
    s3.create_bucket(Bucket="layouts")
    sink = S3Sink(S3Config(queue_url="q", **moto.s3_config()), s3)
    job = Job(S3Object("layouts", "in/report.pdf", etag="abc", version_id=None, size=8), "s3")
    sink.write(job, MD, with_layouts(document(pdf=False)), dict(LAYOUTS))
    for name, kind in (("alto.xml", "application/xml"), ("hocr", "application/xhtml+xml")):
        made = s3.get_object(Bucket="layouts", Key=f"in/report.pdf.{name}")
        assert made["ContentType"] == kind and made["Body"].read() == LAYOUTS[f"report.pdf.{name}"]
    sink.write(job, MD, document(pdf=False), {})
    listed = sorted(item["Key"] for item in s3.list_objects_v2(Bucket="layouts")["Contents"])
    assert listed == ["in/report.pdf.json", "in/report.pdf.md"]

    s3.put_object(Bucket="layouts", Key="in/report.pdf.alto.xml", Body=b"someone else's")
    with pytest.raises(OutputConflict, match="alto.xml"):
        sink.write(job, MD, with_layouts(document(pdf=False)), dict(LAYOUTS))
    sink.write_error(job, ERROR)
    listed = sorted(item["Key"] for item in s3.list_objects_v2(Bucket="layouts")["Contents"])
    assert listed == ["in/report.pdf.alto.xml", "in/report.pdf.error.json"]
