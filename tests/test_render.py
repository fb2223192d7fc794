"""render.py against real files: the corpus where present, and documents made by
tests/support/docs.py
everywhere."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import random
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from PIL import Image, ImageChops, ImageDraw, features
from pypdf import PdfReader, PdfWriter
from pypdf.generic import RectangleObject
from structlog.testing import capture_logs

from ocrwatch import errors
from ocrwatch.config import LimitsConfig, RenderConfig
from ocrwatch.infra import memory
from ocrwatch.infra.memory import DecodeBudget, image_bytes
from ocrwatch.pages import imagepages, orientation, poppler
from ocrwatch.pages import render as render_module
from ocrwatch.pages.render import (
    DEFAULT_DPI,
    DocumentInfo,
    Geometry,
    Limits,
    RenderedPage,
    RenderSpec,
    page_dpi,
    probe,
    render_page,
    render_spec,
)
from ocrwatch.sources.base import Job, LocalFile
from ocrwatch.sources.sniff import sniff
from tests.conftest import REPO, corpus_path
from tests.support import docs, hostile_pdfs

LIMITS = Limits.from_config(LimitsConfig())
SPEC = render_spec(RenderConfig())


def render_first(
    path: Path, spec=SPEC, limits: Limits = LIMITS
) -> tuple[DocumentInfo, RenderedPage]:
    """As the pipeline does it: probed, a PDF's images measured, its first page rendered."""
    info = probe(path, limits)
    if info.kind == "pdf":
        render_module.check_images(path, info, spec)
    return info, render_page(path, info, 0, spec)


def within(page: RenderedPage, max_side: int, max_pixels: int) -> bool:
    return max(page.image.size) <= max_side and page.width * page.height <= max_pixels


# --- the corpus -----------------------------------------------------------------------------------

# The manifest's "expected" is prose; its tags say which kind of failure each bad file is.
ERROR_KIND_BY_TAG = {
    "zero_byte": "empty_file",
    "encrypted": "encrypted_pdf",
    "not_pdf": "not_a_document",
    # poppler finds no page at all; see poppler.pdf_error for why not corrupt_pdf
    "zero_pages": "no_pages",
    "truncated": "corrupt_pdf",
    "corrupt": "corrupt_pdf",
}


def expected_error(entry: dict[str, Any]) -> str:
    return next(ERROR_KIND_BY_TAG[tag] for tag in ERROR_KIND_BY_TAG if tag in entry["tags"])


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "entry" in metafunc.fixturenames:
        root = corpus_path()
        entries = json.loads((root / "manifest.json").read_text()) if root else []
        metafunc.parametrize("entry", entries, ids=[entry["file"] for entry in entries])


def test_corpus_entry_gets_its_expected_outcome(corpus_dir: Path, entry: dict[str, Any]) -> None:
    path = corpus_dir / entry["file"]
    if entry["expected"] == "ok":
        info, page = render_first(path)
        assert (info.kind, info.pages) == (entry["kind"], entry["pages"])
        assert page.image.mode in ("L", "RGB") and within(page, SPEC.max_side, SPEC.max_pixels)
    else:
        with pytest.raises(errors.PermanentError) as caught:
            render_first(path)
        assert caught.value.kind == expected_error(entry)


def test_corpus_bad_files_map_to_the_kinds_the_issue_names(manifest: list[dict[str, Any]]) -> None:
    kinds = {
        entry["file"]: expected_error(entry) for entry in manifest if entry["expected"] != "ok"
    }
    assert kinds == {
        "invalid.pdf": "corrupt_pdf",
        "tagged_odt_named.pdf": "not_a_document",
        "libreoffice-writer-password.pdf": "encrypted_pdf",
        "issue15590_zero_pages.pdf": "no_pages",
        "empty.pdf": "empty_file",
        "multi_page_truncated.pdf": "corrupt_pdf",
    }


# --- PDFs -----------------------------------------------------------------------------------------


def _pages(path: Path, info: DocumentInfo, spec: RenderSpec) -> Iterator[RenderedPage]:
    """Every page in order, each rendered only when asked for, as the pipeline asks for them."""
    return (render_page(path, info, index, spec) for index in range(info.pages))


def test_pdf_pages_render_lazily_in_order(tmp_path: Path) -> None:
    pdf = docs.write_pdf(tmp_path / "three.pdf", [["one"], ["two"], ["three"]])
    info = probe(pdf, LIMITS)
    assert (info.kind, info.mime, info.pages, info.size_bytes) == (
        "pdf",
        "application/pdf",
        3,
        pdf.stat().st_size,
    )
    pages = _pages(pdf, info, SPEC)
    first = next(pages)
    assert (first.index, first.dpi, first.image.mode) == (0, 200.0, "RGB")
    assert first.image.size == (first.width, first.height) == (1654, 2339)  # A4 at 200 dpi
    assert [page.index for page in pages] == [1, 2]


@pytest.mark.skipif(shutil.which("tesseract") is None, reason="tesseract is not installed")
def test_rendered_text_is_readable_by_tesseract(tmp_path: Path) -> None:
    pdf = docs.write_pdf(tmp_path / "invoice.pdf", [["Invoice 4711", "Total 17.50 EUR"]])
    _, page = render_first(pdf)
    page.image.save(tmp_path / "page.png")
    text = subprocess.run(
        ["tesseract", str(tmp_path / "page.png"), "-"], capture_output=True, check=True
    ).stdout
    assert "Invoice 4711" in text.decode() and "17.50 EUR" in text.decode()


def test_text_layer_pdf_has_extractable_text(tmp_path: Path) -> None:
    pdf = docs.write_pdf(
        tmp_path / "layer.pdf", [["Hello layer", "(second) line"]], text_layer=True
    )
    text = subprocess.run(
        ["pdftotext", str(pdf), "-"], capture_output=True, check=True
    ).stdout.decode()
    assert "Hello layer" in text and "(second) line" in text
    assert render_first(pdf)[1].width == 1654


def test_each_page_uses_its_own_size_and_rotation(tmp_path: Path) -> None:
    pdf = docs.write_sized_pdf(
        tmp_path / "mixed.pdf", [(612, 792), (300, 200), (300, 200)], rotate=[0, 90, 180]
    )
    info = probe(pdf, LIMITS)
    assert info.page_sizes == ((612, 792), (200, 300), (300, 200))
    spec = render_spec(RenderConfig(dpi=72))
    assert [page.image.size for page in _pages(pdf, info, spec)] == [
        (612, 792),
        (200, 300),
        (300, 200),
    ]


def test_the_crop_box_is_what_is_rendered(tmp_path: Path) -> None:
    writer = PdfWriter(
        clone_from=PdfReader(docs.write_sized_pdf(tmp_path / "full.pdf", [(612, 792)]))
    )
    writer.pages[0].cropbox = RectangleObject([100, 100, 400.5, 500])
    writer.write(tmp_path / "cropped.pdf")
    info, page = render_first(tmp_path / "cropped.pdf", render_spec(RenderConfig(dpi=144)))
    assert info.page_sizes == ((300.5, 400),)
    assert page.image.size == (601, 800)


@pytest.mark.parametrize(
    ("size_pt", "max_side", "max_pixels"),
    [
        ((595.2, 841.92), 1000, 40_000_000),
        ((612, 792), 4096, 1_000_003),
        ((2160, 1190.7), 2999, 3_000_000),
    ],
)
def test_lowered_dpi_fills_the_caps_without_exceeding_them(
    tmp_path: Path, size_pt: tuple[float, float], max_side: int, max_pixels: int
) -> None:
    pdf = docs.write_sized_pdf(tmp_path / "page.pdf", [size_pt])
    spec = render_spec(RenderConfig(dpi=600, max_side=max_side, max_pixels=max_pixels))
    _, page = render_first(pdf, spec)
    assert within(page, max_side, max_pixels) and page.dpi < 600
    assert max(page.image.size) > 0.99 * max_side or page.width * page.height > 0.99 * max_pixels


def test_a_200_inch_page_is_rendered_at_a_lower_dpi_within_the_caps(tmp_path: Path) -> None:
    pdf = docs.write_huge_page_pdf(tmp_path / "poster.pdf", inches=200)
    spec = render_spec(RenderConfig())
    _, page = render_first(pdf, spec)
    assert within(page, spec.max_side, spec.max_pixels)
    assert page.image.size == (4096, 4096) and page.dpi == pytest.approx(20.48)


def test_a_page_the_caps_cannot_hold_at_min_dpi_is_refused(tmp_path: Path) -> None:
    pdf = docs.write_huge_page_pdf(tmp_path / "poster.pdf", inches=200)
    with pytest.raises(errors.TooManyPixels, match="below min_dpi=36"):
        # 200 in x 36 dpi = 7200 px > max_side 4096
        render_first(pdf, render_spec(RenderConfig(min_dpi=36)))


def test_the_engine_geometry_sets_dpi_and_tightens_caps_without_refusing(tmp_path: Path) -> None:
    spec = render_spec(
        RenderConfig(min_dpi=20), Geometry(dpi=300, max_side=1024, max_pixels=1_000_000)
    )
    assert (spec.dpi, spec.max_side, spec.max_pixels, spec.limit_side) == (
        300.0,
        1024,
        1_000_000,
        4096,
    )
    _, a4 = render_first(docs.write_pdf(tmp_path / "a4.pdf", [["A4"]]), spec)
    assert within(a4, 1024, 1_000_000) and a4.dpi < 300
    _, poster = render_first(docs.write_huge_page_pdf(tmp_path / "poster.pdf"), spec)
    # below min_dpi: the engine wants it this small
    assert poster.image.size == (1000, 1000) and poster.dpi < 20
    assert (
        render_spec(RenderConfig(max_side=2000), Geometry(dpi=100, max_side=9000)).max_side == 2000
    )


def test_render_dpi_unset_is_the_engine_dpi_or_the_default() -> None:
    assert RenderConfig().dpi == "auto"
    assert render_spec(RenderConfig(), Geometry(dpi=144)).dpi == 144.0
    assert render_spec(RenderConfig()).dpi == float(DEFAULT_DPI) == 200.0


def test_render_dpi_set_applies_over_the_engine_dpi(tmp_path: Path) -> None:
    spec = render_spec(RenderConfig(dpi=100), Geometry(dpi=144))
    assert spec.dpi == 100.0
    _, letter = render_first(docs.write_sized_pdf(tmp_path / "letter.pdf", [(612, 792)]), spec)
    assert letter.image.size == (850, 1100) and letter.dpi == 100.0  # ceil(points * 100 / 72)
    assert render_spec(RenderConfig(dpi=300)).dpi == 300.0


def test_render_dpi_set_is_still_bounded_by_the_engine_geometry(tmp_path: Path) -> None:
    spec = render_spec(RenderConfig(dpi=300), Geometry(dpi=144, max_side=1000, max_pixels=600_000))
    assert (spec.dpi, spec.max_side, spec.max_pixels) == (300.0, 1000, 600_000)
    _, letter = render_first(docs.write_sized_pdf(tmp_path / "letter.pdf", [(612, 792)]), spec)
    # the engine's bound wins over both DPIs
    assert within(letter, 1000, 600_000) and letter.dpi < 144
    unbounded = render_spec(RenderConfig(dpi=300), Geometry(dpi=144))
    assert (unbounded.max_side, unbounded.max_pixels) == (
        RenderConfig().max_side,
        RenderConfig().max_pixels,
    )


def test_page_dpi_keeps_the_wanted_dpi_when_the_page_fits() -> None:
    assert page_dpi(612, 792, SPEC) == 200.0
    assert page_dpi(2160, 2160, SPEC) == pytest.approx(136.53)


def test_pages_rendered_below_the_wanted_dpi_are_said_once_numbered_from_1(tmp_path: Path) -> None:
    """One line for the document, naming its pages as the sidecars do, and none while they
    render."""
    a4, poster = (595, 842), (2160, 2160)  # at 200 dpi a poster needs 6000 px, above max_side
    path = docs.write_sized_pdf(tmp_path / "mixed.pdf", [a4, poster, poster, a4, poster, a4])
    info = probe(path, LIMITS)
    with capture_logs() as logs:
        render_module.plan_pdf(info, SPEC, job_id="0123456789ab", uri=path.as_uri())
        pages = [render_page(path, info, index, SPEC) for index in range(info.pages)]
    lowered = [line for line in logs if line["event"] == "page_dpi_lowered"]
    assert lowered == [
        {
            "event": "page_dpi_lowered",
            "log_level": "info",
            "job_id": "0123456789ab",
            "uri": path.as_uri(),
            "pages": "2-3,5",
            "count": 3,
            "of": 6,
            "wanted": 200.0,
            "dpi_min": pytest.approx(136.53),
            "dpi_max": pytest.approx(136.53),
        }
    ]
    assert [page.dpi < SPEC.dpi for page in pages] == [False, True, True, False, True, False]
    with capture_logs() as logs:
        render_module.plan_pdf(
            probe(docs.write_sized_pdf(tmp_path / "a4.pdf", [a4]), LIMITS),
            SPEC,
            job_id="0123456789ab",
            uri="file:///a4.pdf",
        )
    assert logs == []


def test_a_turned_page_is_logged_numbered_from_1_as_the_sidecars_number_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pdf = docs.write_pdf(tmp_path / "two.pdf", [["one"], ["two"]], dpi=72)
    info = probe(pdf, LIMITS)
    turned = orientation.Orientation(rotation=90, detected=90, confidence=20.0, decided_by="osd")
    monkeypatch.setattr(orientation, "upright", lambda image, dpi, settings: (image, turned))
    with capture_logs() as logs:
        render_page(pdf, info, 1, SPEC)
    assert [line["page"] for line in logs if line["event"] == "page_turned"] == [2]


def test_a_pdf_without_pages_says_so_in_its_own_words_with_a_fix(tmp_path: Path) -> None:
    """Not poppler's "Wrong page range given" (a range no user gave), and a hint to act on."""
    empty = tmp_path / "empty.pdf"
    PdfWriter().write(empty)
    corpus = corpus_path()
    for given in [empty, *([corpus / "issue15590_zero_pages.pdf"] if corpus else [])]:
        with pytest.raises(errors.NoPages) as raised:
            probe(given, LIMITS)
        assert raised.value.message == f"{given}: {poppler.NO_PAGES}"
        assert "open it in a PDF viewer" in raised.value.hint


def test_empty_user_password_pdf_opens_and_renders(tmp_path: Path) -> None:
    info, page = render_first(docs.write_encrypted_pdf(tmp_path / "open.pdf", user_password=""))
    assert info.pages == 1 and page.width == 1654


def test_password_pdf_is_encrypted_pdf(tmp_path: Path) -> None:
    with pytest.raises(errors.EncryptedPdf):
        probe(docs.write_encrypted_pdf(tmp_path / "locked.pdf", user_password="secret"), LIMITS)


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (docs.write_zero_page_pdf, errors.NoPages),
        (docs.write_truncated_pdf, errors.CorruptPdf),
        (docs.write_corrupt_pdf, errors.CorruptPdf),
        (docs.write_executable, errors.NotADocument),
    ],
    ids=["zero-pages", "truncated", "corrupt", "executable"],
)
def test_bad_pdfs_raise_their_kind(
    tmp_path: Path, make, error: type[errors.PermanentError]
) -> None:
    path = tmp_path / "bad.pdf"
    make(path)
    with pytest.raises(error):
        probe(path, LIMITS)


def test_zero_byte_file_is_empty_file(tmp_path: Path) -> None:
    (tmp_path / "empty.pdf").write_bytes(b"")
    with pytest.raises(errors.EmptyFile):
        probe(tmp_path / "empty.pdf", LIMITS)


def test_type_is_decided_by_content_not_name(tmp_path: Path) -> None:
    info, page = render_first(
        docs.write_pdf(tmp_path / "actually-a-pdf.png", [["PDF in disguise"]])
    )
    assert (info.kind, page.dpi) == ("pdf", 200.0)
    info = probe(docs.write_png(tmp_path / "actually-a-png.pdf", ["PNG in disguise"]), LIMITS)
    assert (info.kind, info.mime) == ("image", "image/png")


def test_names_with_dashes_spaces_and_non_ascii_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("-f 1 --help.pdf", "-ünïcödé 文字 ünd spaces.pdf", "--.tiff"):
        path = Path(name)
        if name.endswith(".pdf"):
            docs.write_pdf(path, [["odd name"]])
        else:
            docs.write_tiff(path, [["odd name"]])
        info, page = render_first(path)
        assert info.pages == 1 and page.width > 0


def test_render_timeout_is_render_timeout(tmp_path: Path) -> None:
    pdf = docs.write_pdf(tmp_path / "slow.pdf", [["slow"]])
    info = probe(pdf, LIMITS)
    with pytest.raises(errors.RenderTimeout):
        render_page(pdf, info, 0, render_spec(RenderConfig(timeout_seconds=0.001)))
    with pytest.raises(errors.RenderTimeout):
        probe(pdf, LIMITS, timeout_seconds=0.0001)


@pytest.mark.parametrize("mode", ["RGB", "L", "I;16", "1"])
def test_ppm_image_reads_what_pillow_reads(mode: str) -> None:
    original = Image.linear_gradient("L").resize((301, 77)).convert("RGB" if mode == "RGB" else "L")
    if mode == "I;16":
        original = Image.frombytes(
            "I;16", original.size, bytes(b for v in original.tobytes() for b in (v, v))
        )
    elif mode == "1":
        original = original.convert("1")
    buffer = io.BytesIO()
    original.save(buffer, format="PPM")
    image = render_module.ppm_image(buffer.getvalue())
    reference = Image.open(io.BytesIO(buffer.getvalue()))
    assert (image.mode, image.size) == (reference.mode, reference.size)
    assert image.tobytes() == reference.tobytes()


def test_ppm_image_refuses_short_data() -> None:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), "red").save(buffer, format="PPM")
    with pytest.raises(OSError):
        render_module.ppm_image(buffer.getvalue()[:-100])


def test_pdf_pages_leave_no_files_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(render_module.tempfile, "tempdir", str(scratch))
    pdf = docs.write_pdf(tmp_path / "one.pdf", [["one"]])
    info = probe(pdf, LIMITS)
    assert render_page(pdf, info, 0, SPEC).image.size == (1654, 2339)
    pdf.write_bytes(pdf.read_bytes()[:400])
    with pytest.raises(errors.PermanentError):
        render_page(pdf, info, 0, SPEC)
    assert list(scratch.iterdir()) == []


def fake_pdftoppm(folder: Path, script: str) -> Path:
    """A pdftoppm that fails the way a full or unwritable temporary folder makes the real one
    fail."""
    folder.mkdir()
    tool = folder / "pdftoppm"
    tool.write_text("#!/bin/sh\n" + script)
    tool.chmod(0o755)
    return folder


SHORT_WRITE = 'for last; do :; done; printf "P6\\n100 100\\n255\\nabc" > "$last.ppm"\n'
NO_WRITE = 'for last; do :; done; echo "Could not write image to $last.ppm; exiting" >&2; exit 1\n'


@pytest.mark.parametrize(
    ("script", "free", "error"),
    [
        (SHORT_WRITE, 0, errors.DiskFull),
        (SHORT_WRITE, 10**12, errors.CorruptPdf),
        (NO_WRITE, 0, errors.DiskFull),
        (NO_WRITE, 10**12, errors.RenderFailed),
    ],
)
def test_a_temporary_folder_that_fails_the_page_is_retried_not_blamed_on_the_pdf(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    script: str,
    free: int,
    error: type[errors.OcrwatchError],
) -> None:
    pdf = docs.write_pdf(tmp_path / "one.pdf", [["one"]])
    info = probe(pdf, LIMITS)
    monkeypatch.setenv(
        "PATH", f"{fake_pdftoppm(tmp_path / 'bin', script)}{os.pathsep}{os.environ['PATH']}"
    )
    monkeypatch.setattr(
        render_module.shutil,
        "disk_usage",
        lambda folder: SimpleNamespace(total=free, used=0, free=free),
    )
    with pytest.raises(errors.OcrwatchError) as caught:
        render_page(pdf, info, 0, SPEC)
    assert type(caught.value) is error
    assert caught.value.retryable == (error is not errors.CorruptPdf)


def test_a_really_full_temporary_folder_is_disk_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(small)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        monkeypatch.setattr(render_module.tempfile, "tempdir", str(small))
        pdf = docs.write_pdf(tmp_path / "one.pdf", [["one"]])
        with pytest.raises(errors.DiskFull):
            render_page(pdf, probe(pdf, LIMITS), 0, SPEC)
        assert list(small.iterdir()) == []
    finally:
        subprocess.run(["umount", str(small)], check=True)


# --- limits ---------------------------------------------------------------------------------------


def test_max_pages_is_checked_before_rendering(tmp_path: Path) -> None:
    pdf = docs.write_pdf(tmp_path / "three.pdf", [["1"], ["2"], ["3"]])
    tif = docs.write_tiff(tmp_path / "three.tif", [["1"], ["2"], ["3"]])
    assert probe(pdf, Limits(max_bytes=10**9, max_pages=3)).pages == 3
    for path in (pdf, tif):
        with pytest.raises(errors.TooManyPages):
            probe(path, Limits(max_bytes=10**9, max_pages=2))


def test_max_bytes_is_checked_from_stat(tmp_path: Path) -> None:
    pdf = docs.write_pdf(tmp_path / "one.pdf", [["1"]])
    assert probe(pdf, Limits(max_bytes=pdf.stat().st_size, max_pages=1)).pages == 1
    with pytest.raises(errors.FileTooLarge):
        probe(pdf, Limits(max_bytes=pdf.stat().st_size - 1, max_pages=1))
    sparse = tmp_path / "sparse.pdf"
    with open(sparse, "wb") as handle:
        handle.truncate(2**31)
    with pytest.raises(errors.FileTooLarge):
        probe(sparse, LIMITS)


def test_the_global_limits_stand_where_nothing_overrides_them() -> None:
    assert Limits.from_config(LimitsConfig(max_bytes=10, max_pages=5)) == Limits(10, 5)


def test_limits_take_the_job_overrides(tmp_path: Path) -> None:
    config = LimitsConfig(max_bytes=10, max_pages=5)
    job = Job(origin=LocalFile(tmp_path / "a.pdf", tmp_path), source="local")
    assert Limits.for_job(config, job) == Limits(10, 5)
    job.max_pages = 2
    assert Limits.for_job(config, job) == Limits(10, 2)
    job.max_bytes = 7
    assert Limits.for_job(config, job) == Limits(7, 2)


def test_non_regular_and_missing_files(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.pdf")
    with pytest.raises(errors.NotARegularFile):
        probe(tmp_path / "fifo.pdf", LIMITS)
    with pytest.raises(errors.SourceGone):
        probe(tmp_path / "missing.pdf", LIMITS)


# --- images ---------------------------------------------------------------------------------------


def test_multi_frame_tiff_gives_every_frame(tmp_path: Path) -> None:
    frames = [
        docs.text_image(["first"], size=(600, 800)),
        docs.text_image(["second"], size=(800, 600)).convert("RGB"),
        docs.text_image(["third"], size=(500, 500)).convert("1"),
    ]
    tif = docs.write_tiff(tmp_path / "scan.tif", frames)
    info = probe(tif, LIMITS)
    assert (info.kind, info.mime, info.pages) == ("image", "image/tiff", 3)
    assert info.page_sizes == ((600, 800), (800, 600), (500, 500))
    pages = list(_pages(tif, info, SPEC))
    assert [(p.index, p.image.size, p.image.mode) for p in pages] == [
        (0, (600, 800), "L"),
        (1, (800, 600), "RGB"),
        (2, (500, 500), "L"),
    ]
    assert [p.dpi for p in pages] == [150.0, 150.0, 150.0]


def test_group4_tiff_renders_as_grey(tmp_path: Path) -> None:
    tif = docs.write_tiff(
        tmp_path / "g4.tif", [docs.text_image(["fax"]).convert("1")], compression="group4"
    )
    _, page = render_first(tif)
    assert page.image.mode == "L" and page.image.getextrema() == (0, 255)


def _marked(size: tuple[int, int]) -> Image.Image:
    """White, with a black square in the top-left corner, so orientation is visible."""
    image = Image.new("RGB", size, "white")
    image.paste((0, 0, 0), (0, 0, 100, 100))
    return image


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_exif_orientation_is_applied(tmp_path: Path, orientation: int) -> None:
    jpeg = docs.write_jpeg(tmp_path / "photo.jpg", _marked((600, 300)), orientation=orientation)
    info, page = render_first(jpeg)
    assert info.page_sizes[0] == ((600, 300) if orientation == 3 else (300, 600))  # as stored
    assert page.image.size == (600, 300)
    assert page.image.getpixel((50, 50))[0] < 40 and page.image.getpixel((550, 250))[0] > 215


def test_webp_renders(tmp_path: Path) -> None:
    info, page = render_first(docs.write_webp(tmp_path / "page.webp", _marked((640, 480))))
    assert (info.mime, page.image.mode, page.image.size) == ("image/webp", "RGB", (640, 480))
    assert page.image.getpixel((10, 10)) == (0, 0, 0)


def test_alpha_is_flattened_onto_white(tmp_path: Path) -> None:
    rgba = Image.new("RGBA", (300, 200), (0, 0, 0, 0))
    rgba.paste((200, 0, 0, 255), (0, 0, 100, 100))
    _, page = render_first(docs.write_png(tmp_path / "rgba.png", rgba))
    assert page.image.mode == "RGB"
    assert page.image.getpixel((250, 150)) == (255, 255, 255) and page.image.getpixel((50, 50)) == (
        200,
        0,
        0,
    )
    grey_alpha = Image.new("LA", (300, 200), (0, 0))
    _, page = render_first(docs.write_png(tmp_path / "la.png", grey_alpha))
    assert page.image.mode == "L" and page.image.getpixel((10, 10)) == 255


def test_palette_with_transparency_is_flattened(tmp_path: Path) -> None:
    palette = _marked((200, 200)).convert("P")
    palette.info["transparency"] = palette.getpixel((150, 150))
    _, page = render_first(docs.write_png(tmp_path / "p.png", palette))
    assert page.image.mode in ("RGB", "L") and page.image.getpixel((150, 150)) in (
        (255, 255, 255),
        255,
    )


def test_sixteen_bit_grey_is_scaled_not_clipped(tmp_path: Path) -> None:
    _, page = render_first(docs.write_png(tmp_path / "16.png", Image.new("I;16", (64, 64), 32896)))
    assert page.image.mode == "L" and page.image.getpixel((0, 0)) == 128


def test_cmyk_jpeg_becomes_rgb(tmp_path: Path) -> None:
    Image.new("CMYK", (120, 80), (0, 0, 0, 0)).save(tmp_path / "cmyk.jpg", format="JPEG")
    _, page = render_first(tmp_path / "cmyk.jpg")
    assert page.image.mode == "RGB"


def test_large_images_are_downscaled_to_the_caps(tmp_path: Path) -> None:
    png = docs.write_png(
        tmp_path / "wide.png", docs.text_image(["wide"], size=(5000, 1000)), dpi=300
    )
    _, page = render_first(png, render_spec(RenderConfig(max_side=2000)))
    assert page.image.size == (2000, 400) and page.dpi == pytest.approx(120)
    jpeg = docs.write_jpeg(tmp_path / "big.jpg", Image.new("RGB", (6000, 4000), "white"))
    _, page = render_first(jpeg, render_spec(RenderConfig(max_pixels=1_000_000)))
    assert page.width * page.height <= 1_000_000 and page.image.size[0] == pytest.approx(
        1224, abs=2
    )


# --- an image's resolution ---------------------------------------------------------------------


def test_an_image_without_a_resolution_is_an_a4_page_by_its_long_side(tmp_path: Path) -> None:
    """The issue's PNG (4000 x 2864 px, no pHYs) was taken as 96 dpi, a 41.7 x 29.8 inch page: now
    its long side is an A4 page's (11.69 in, 342 dpi), recorded as ``assumed``, told the engine."""
    png = docs.write_png(tmp_path / "scan.png", Image.new("L", (4000, 2864), 255), dpi=None)
    _, page = render_first(png)
    assert page.dpi == pytest.approx(4000 / (297 / 25.4), abs=0.01) and page.dpi_from == "assumed"
    assert page.image.info["dpi"] == (page.dpi, page.dpi)
    inches = (page.width / page.dpi, page.height / page.dpi)
    assert inches == pytest.approx((297 / 25.4, 2864 / 4000 * 297 / 25.4), abs=0.01)
    _, shrunk = render_first(png, render_spec(RenderConfig(max_side=2000)))  # by the stored size
    assert shrunk.width == 2000 and shrunk.dpi == pytest.approx(page.dpi / 2, abs=0.01)


def test_a_small_image_without_a_resolution_is_a_screens_picture(tmp_path: Path) -> None:
    png = docs.write_png(tmp_path / "shot.png", Image.new("RGB", (800, 600), "white"), dpi=None)
    _, page = render_first(png)
    assert (page.dpi, page.dpi_from) == (96.0, "assumed")


def test_render_image_dpi_applies_only_where_the_image_records_none(tmp_path: Path) -> None:
    spec = render_spec(RenderConfig(image_dpi=300))
    bare = docs.write_png(tmp_path / "bare.png", Image.new("L", (2480, 3508), 255), dpi=None)
    _, page = render_first(bare, spec)
    assert (page.dpi, page.dpi_from) == (300.0, "image_dpi")
    recorded = docs.write_png(tmp_path / "recorded.png", Image.new("L", (1240, 1754), 255), dpi=150)
    _, page = render_first(recorded, spec)
    assert page.dpi == pytest.approx(150, abs=0.02) and page.dpi_from == "image"  # dots per metre
    with pytest.raises(ValueError, match="image_dpi"):
        RenderConfig(image_dpi=10)


@pytest.mark.parametrize(
    "recorded, size, configured, expected",
    [
        ((200.0, 200.0), (1654, 2339), None, (200.0, 200.0, "image")),
        ((204.0, 98.0), (1728, 1078), None, (204.0, 98.0, "image")),  # a fax's
        ((199.9996, 200.0), (1654, 2339), None, (200.0, 200.0, "image")),  # dots per metre
        ((1, 1), (2550, 3300), None, (282.2, 282.2, "assumed")),  # a writer's placeholder
        ((0.0, 0.0), (2550, 3300), 300, (300.0, 300.0, "image_dpi")),
        (None, (500, 300), None, (96.0, 96.0, "assumed")),
        ("junk", (1169, 827), None, (100.0, 100.0, "assumed")),
    ],
)
def test_image_dpi_rule(
    recorded: object,
    size: tuple[int, int],
    configured: int | None,
    expected: tuple[float, float, str],
) -> None:
    (across, down), dpi_from = imagepages.image_dpi(recorded, size, configured)
    assert (round(across, 1), round(down, 1), dpi_from) == expected


def test_a_fax_is_read_with_square_pixels_at_its_true_size(tmp_path: Path) -> None:
    """A 204 x 98 dpi fax was read as 204 dpi both ways: its text squashed to half its height, its
    page 8.5 x 5.3 inches. Its lower resolution is scaled up: the page is Letter, a square drawn on
    it is square, and the sidecar keeps both resolutions."""
    image = Image.new("L", (1728, 1078), 255)
    ImageDraw.Draw(image).rectangle((400, 400, 603, 497), fill=0)  # one inch square
    fax = tmp_path / "fax.tif"
    image.convert("1").save(fax, format="TIFF", dpi=(204, 98), compression="group4")
    spec = render_spec(RenderConfig(rotate_pages=False))
    _, page = render_first(fax, spec)
    assert (page.width, page.height, page.dpi, page.dpi_from) == (1728, 2244, 204.0, "image")
    assert page.source_dpi == (204.0, 98.0) and page.image.info["dpi"] == (204.0, 204.0)
    ink = page.image.convert("L").point(lambda value: 255 if value < 128 else 0)
    left, top, right, bottom = ink.getbbox() or (0, 0, 0, 0)
    assert (right - left, bottom - top) == pytest.approx((204, 204), abs=3)
    _, small = render_first(fax, render_spec(RenderConfig(max_side=1122, rotate_pages=False)))
    assert (small.width, small.height, small.dpi) == (864, 1122, 102.0)
    png = docs.write_png(tmp_path / "square.png", image, dpi=200)
    assert render_first(png, spec)[1].source_dpi is None


def test_every_page_tells_the_engine_its_resolution(tmp_path: Path) -> None:
    """Tesseract is told each page's DPI: a PDF page's (lowered for a 200-inch poster, which
    Tesseract would read as 70: its least credible), an image's (scaled with the image)."""
    from ocrwatch.engines.tesseract import _encode

    pdf = docs.write_pdf(tmp_path / "a.pdf", [["Letter"]])
    _, letter = render_first(pdf, render_spec(RenderConfig(dpi=144)))
    _, poster = render_first(docs.write_huge_page_pdf(tmp_path / "poster.pdf"))
    png = docs.write_png(tmp_path / "wide.png", Image.new("L", (5000, 1000), 255), dpi=300)
    _, wide = render_first(png, render_spec(RenderConfig(max_side=2000)))
    assert [page.dpi_from for page in (letter, poster, wide)] == ["render", "render", "image"]
    told = [_encode(page.image, 300)[1] for page in (letter, poster, wide)]
    assert told == [144, 70, 120]


def test_text_poppler_could_not_draw_for_want_of_its_data_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without poppler-data, a font the PDF names without embedding it (Japanese, say) is drawn
    blank and the page's OCR reads nothing: the page is rendered, and the log says which collection
    lacked its data and names the package. Poppler's words are added to a real render's, as a
    machine without poppler-data prints them (this one has it; poppler takes no other folder)."""
    said = "Syntax Error: Missing language pack for 'Adobe-Japan1' mapping\n"
    assert poppler.missing_data(said) == "Adobe-Japan1" and poppler.missing_data("") is None
    real = render_module.children.run

    def complaining(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        done = real(argv, **kwargs)
        stderr = (done.stderr or b"") + said.encode()
        return subprocess.CompletedProcess(done.args, done.returncode, done.stdout, stderr)

    monkeypatch.setattr(render_module.children, "run", complaining)
    pdf = docs.write_pdf(tmp_path / "a.pdf", [["Letter"]])
    with capture_logs() as logs:
        _, page = render_first(pdf)
    assert page.image.size[0] > 0
    [warning] = [line for line in logs if line["event"] == "render_font_data_missing"]
    assert warning["collection"] == "Adobe-Japan1" and "install poppler-data" in warning["hint"]


def test_broken_image_data_is_corrupt_image(tmp_path: Path) -> None:
    png = docs.write_truncated_png(tmp_path / "cut.png")
    info = probe(png, LIMITS)  # the header is intact
    with pytest.raises(errors.CorruptImage):
        render_page(png, info, 0, SPEC)
    (tmp_path / "junk.jpg").write_bytes(b"\xff\xd8\xff\xe0" + b"\x13" * 200)
    with pytest.raises(errors.CorruptImage):
        render_first(tmp_path / "junk.jpg")


def test_page_index_out_of_range(tmp_path: Path) -> None:
    png = docs.write_png(tmp_path / "one.png", ["one"])
    with pytest.raises(IndexError):
        render_page(png, probe(png, LIMITS), 1, SPEC)


_BOMB_CHILD = """
import resource, sys, warnings
from pathlib import Path
from ocrwatch import errors
from ocrwatch.config import RenderConfig
from ocrwatch.pages.render import Limits, probe, render_page, render_spec
warnings.simplefilter("ignore")  # Pillow's DecompressionBombWarning
spec = render_spec(RenderConfig(max_pixels=10_000_000))
status = open("/proc/self/status").read().splitlines()
vm = next(int(line.split()[1]) for line in status if line.startswith("VmSize:")) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + 64 * 2**20, resource.RLIM_INFINITY))
for name in sys.argv[1:]:
    try:
        info = probe(Path(name), Limits(max_bytes=10**9, max_pages=10))
        render_page(Path(name), info, 0, spec)
        print("rendered")
    except errors.OcrwatchError as exc:
        print(exc.kind)
    except MemoryError:
        print("MemoryError")
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmSize from Linux /proc")
def test_huge_declared_dimensions_are_refused_without_allocating(tmp_path: Path) -> None:
    """A child with 64 MiB of address space to spare: decoding either image would need 144 MB or
    more.

    (Resident memory would prove nothing: Pillow's untouched pages never become resident.)
    """
    # Pillow's bomb error
    beyond_pillow = docs.write_png_bomb(tmp_path / "bomb.png", 100_000, 100_000)
    # 144 Mpx > 4 x max_pixels
    beyond_cap = docs.write_png_bomb(tmp_path / "big.png", 12_000, 12_000)
    child = subprocess.run(
        [sys.executable, "-c", _BOMB_CHILD, str(beyond_pillow), str(beyond_cap)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.split() == ["too_many_pixels", "too_many_pixels"]


def test_pdfium_renderer_gives_pdftoppm_geometry(tmp_path: Path) -> None:
    pytest.importorskip("pypdfium2")
    pdf = docs.write_sized_pdf(
        tmp_path / "sizes.pdf", [(612, 792), (384, 470.88), (841.92, 595.32)], rotate=[0, 0, 90]
    )
    info = render_module.probe(pdf, render_module.Limits(max_bytes=10**8, max_pages=10))
    pdfium = render_module.render_spec(RenderConfig(renderer="pdfium"), Geometry(dpi=300))
    pdftoppm = dataclasses.replace(pdfium, renderer="pdftoppm")
    for index in range(info.pages):
        a = render_module.render_page(pdf, info, index, pdftoppm)
        b = render_module.render_page(pdf, info, index, pdfium)
        assert abs(a.width - b.width) <= 1 and abs(a.height - b.height) <= 1, (
            index,
            a.image.size,
            b.image.size,
        )
        assert b.image.mode == "RGB" and b.dpi == a.dpi


def test_pdfium_renderer_missing_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(render_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(errors.ConfigError):
        render_module.check_renderer(RenderConfig(renderer="pdfium"))
    render_module.check_renderer(RenderConfig())


# --- memory: one decode budget, band-by-band shrinking --------------------------------------------


def _transparent_page(size: tuple[int, int]) -> Image.Image:
    """RGBA, transparent but for black text and a half-transparent red block: the flattening
    shows."""
    image = Image.new("RGBA", size, (0, 0, 0, 0))
    text = docs.text_image(["Memory of one image", "band by band"], size=size)
    image.paste((0, 0, 0, 255), mask=text.point(lambda value: 255 - value))
    image.paste((200, 0, 0, 128), (size[0] // 4, size[1] // 2, size[0] // 2, size[1] * 3 // 4))
    return image


@pytest.mark.parametrize("max_side", [700, 4096])
def test_a_large_image_is_flattened_and_downscaled_band_by_band(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, max_side: int
) -> None:
    """Bands of 256 KiB cut a 1600 x 1200 RGBA image into about thirty; the result is the
    whole-image flattening and Lanczos resize, within one level of rounding (exact where nothing is
    resized)."""
    monkeypatch.setattr(imagepages, "BAND_BYTES", 256 * 1024)
    rgba = _transparent_page((1600, 1200))
    _, page = render_first(
        docs.write_png(tmp_path / "rgba.png", rgba), render_spec(RenderConfig(max_side=max_side))
    )
    expected = imagepages._ocr_mode(rgba)
    if max_side < 1600:
        expected = expected.resize((700, 525), Image.Resampling.LANCZOS)
    assert (page.image.mode, page.image.size) == ("RGB", expected.size)
    worst = max(high for _, high in ImageChops.difference(page.image, expected).getextrema())
    assert worst <= (1 if max_side < 1600 else 0)


def test_one_budget_keeps_two_large_pages_from_decoding_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers start a large page each at the same moment; the budget has room for one. Its own
    counters show that they never held it together, that each was charged its decoded image and its
    result, and that the heap was trimmed after each."""
    trims: list[int] = []
    monkeypatch.setattr(memory, "trim_heap", lambda: trims.append(1))
    png = docs.write_png(tmp_path / "big.png", _transparent_page((3000, 3000)))
    info = probe(png, LIMITS)
    charge = image_bytes("RGBA", 3000, 3000) + image_bytes("RGB", 3000, 3000)  # 72 MB: a large page
    budget = DecodeBudget(charge * 3 // 2)
    start = threading.Barrier(2)

    def work(_: int) -> RenderedPage:
        start.wait(30)
        return render_page(png, info, 0, SPEC, budget=budget)

    with ThreadPoolExecutor(2) as pool:
        pages = list(pool.map(work, range(2)))
    assert [page.image.size for page in pages] == [(3000, 3000)] * 2
    assert (budget.granted, budget.peak_holders, budget.peak, budget.held) == (2, 1, charge, 0)
    assert len(trims) == 2


def test_pdf_pages_are_decoded_within_the_budget(tmp_path: Path) -> None:
    pdf = docs.write_pdf(tmp_path / "a.pdf", [["one"]])
    info = probe(pdf, LIMITS)
    budget = DecodeBudget(2**30)
    page = render_page(pdf, info, 0, SPEC, budget=budget)
    assert (
        budget.granted == 1
        and budget.peak == page.width * page.height * render_module.PDF_BYTES_PER_PIXEL
    )


# --- PDFs without their header --------------------------------------------------------------------


def _junk(size: int) -> bytes:
    junk = random.Random(18).randbytes(size)
    assert sniff(junk) is None
    return junk


def test_a_pdf_whose_header_is_buried_or_missing_is_read_as_poppler_reads_it(
    tmp_path: Path,
) -> None:
    """2 KiB of junk before ``%PDF-`` (beyond the sniffer's 1 KiB), or no header line at all:
    poppler rebuilds the cross-reference table and renders the page, so the file is a PDF, not
    ``not_a_document``."""
    pdf = docs.write_pdf(tmp_path / "a.pdf", [["Invoice 42"]]).read_bytes()
    buried, bare = tmp_path / "buried.pdf", tmp_path / "bare.pdf"
    buried.write_bytes(_junk(2048) + pdf)
    bare.write_bytes(pdf[pdf.index(b"\n") + 1 :])
    for path in (buried, bare):
        info, page = render_first(path)
        assert (info.kind, info.mime, info.pages) == ("pdf", "application/pdf", 1)
        assert page.image.size == (1654, 2339)  # an A4 page at the default 200 dpi


def test_content_that_poppler_cannot_read_is_still_not_a_document(tmp_path: Path) -> None:
    """Random bytes, and a text holding stray PDF keywords (poppler finds a trailer, a catalog, but
    no page)."""
    keywords = (
        b"1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj 2 0 obj << /Type /Pages /Kids "
        b"[] /Count 0 >> endobj"
    )
    for name, content in [
        ("random.pdf", _junk(50_000)),
        ("trailer.pdf", b"trailer\n<< /Root 1 0 R >>\n"),
        ("keywords.pdf", keywords + b" trailer << /Root 1 0 R >>"),
    ]:
        (tmp_path / name).write_bytes(content)
        with pytest.raises(errors.NotADocument):
            probe(tmp_path / name, LIMITS)


# --- what a PDF's images and its renderer may take ------------------------------------------------

needs_jpx = pytest.mark.skipif(
    not features.check("jpg_2000"), reason="Pillow built without OpenJPEG writes no JPEG 2000"
)

DECLARED = [
    {},
    {"dictionary": (16, 16)},  # only the codestream tells
    {"where": "inherited"},
    {"where": "form"},
    {"where": "annotation"},
    {"jpx": False},
]


@needs_jpx
@pytest.mark.parametrize(
    "variant", DECLARED, ids=["page", "codestream", "inherited", "form", "annotation", "flate"]
)
def test_an_image_of_a_few_bytes_declaring_gigapixels_is_refused_before_a_page_renders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variant: dict[str, Any]
) -> None:
    """Before: pdftoppm took 2.3 GB and 17 s for one page of a 928-byte PDF. Wherever the page
    lists the image, and whatever its dictionary says, it is measured without running anything."""
    pdf = hostile_pdfs.write_declared_image_pdf(tmp_path / "huge.pdf", 24_000, 24_000, **variant)
    assert pdf.stat().st_size < 2048
    info = probe(pdf, LIMITS)
    monkeypatch.setattr(render_module.children, "run", None)  # nothing may run a child now
    with pytest.raises(errors.TooManyPixels, match=r"page 1 holds a 24000 x 24000 image") as caught:
        render_module.check_images(pdf, info, SPEC)
    assert "max_pixels" in caught.value.hint


def test_a_pdf_image_is_held_to_the_bound_an_image_file_is(tmp_path: Path) -> None:
    """4 x max_pixels, as ``imagepages`` holds an image file: 512 x 512 passes 65,536, one row more
    is refused; the page itself stays within the caps either way."""
    spec = render_spec(RenderConfig(max_pixels=65_536))
    at = hostile_pdfs.write_declared_image_pdf(tmp_path / "at.pdf", 512, 512, jpx=False)
    render_module.check_images(at, probe(at, LIMITS), spec)
    over = hostile_pdfs.write_declared_image_pdf(tmp_path / "over.pdf", 512, 513, jpx=False)
    with pytest.raises(errors.TooManyPixels):
        render_module.check_images(over, probe(over, LIMITS), spec)


_LIMITED_CHILD = """
import resource, sys
from pathlib import Path
from ocrwatch import errors
from ocrwatch.config import LimitsConfig, RenderConfig
from ocrwatch.pages.render import Limits, check_images, probe, render_page, render_spec
spec = render_spec(RenderConfig(decode_budget_mb=int(sys.argv[2])))
path = Path(sys.argv[1])
try:
    info = probe(path, Limits.from_config(LimitsConfig()))
    check_images(path, info, spec)
    render_page(path, info, 0, spec)
    print("rendered")
except errors.OcrwatchError as exc:
    print(exc.kind)
print(spec.child_memory, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
"""


@needs_jpx
def test_a_render_child_that_still_blows_up_fails_its_own_kind_within_its_limit(
    tmp_path: Path,
) -> None:
    """What the image check cannot see meets the child's limit: an inline image, which no
    dictionary lists, fails ``render_memory_exceeded`` (not a blank page, not the machine), and the
    child's peak resident memory stays below its limit (2.4 GB and 20 s before). Measured in a
    process of its own, whose children are this one's alone."""
    pdf = hostile_pdfs.write_declared_image_pdf(
        tmp_path / "inline.pdf", 24_000, 24_000, where="inline"
    )
    child = subprocess.run(
        [sys.executable, "-c", _LIMITED_CHILD, str(pdf), "64"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr
    kind, numbers = child.stdout.splitlines()[-2:]  # after the log's lines, if any
    limit, peak = map(int, numbers.split())
    assert kind == "render_memory_exceeded" and peak < limit


def test_every_pdftoppm_runs_within_its_limit_and_ordinary_pages_fit_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each page's pdftoppm is given the configured limit; a 200-inch page rendered to the largest
    the caps allow fits in it, as every other page these tests render does."""
    limits: list[int | None] = []
    run = render_module.children.run

    def recorded(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        if argv[0] == "pdftoppm":
            limits.append(kwargs.get("memory"))
        return run(argv, **kwargs)

    monkeypatch.setattr(render_module.children, "run", recorded)
    _, page = render_first(docs.write_huge_page_pdf(tmp_path / "poster.pdf"))
    assert within(page, SPEC.max_side, SPEC.max_pixels)
    assert limits == [render_module.child_memory(RenderConfig())]


def test_a_missing_prlimit_stops_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(errors.ConfigError, match="prlimit") as caught:
        render_module.check_renderer(RenderConfig(rotate_pages=False))
    assert "util-linux" in caught.value.hint
