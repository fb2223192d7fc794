"""figures and outputs: figure blocks of recorded DeepSeek-OCR output cut out of real rendered
pages, linked from the Markdown and listed in the JSON; the searchable PDF's section, and its
failure kept off the document."""

from __future__ import annotations

import asyncio
import hashlib
import io
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from PIL import Image, ImageChops, ImageStat

from ocrwatch.config import LimitsConfig, OutputConfig, RenderConfig
from ocrwatch.engines.base import PageRequest, Recognition
from ocrwatch.engines.deepseek.grounding import parse
from ocrwatch.pages import orientation, render
from ocrwatch.pages.render import Geometry
from ocrwatch.pages.scheduler import PageOutcome
from ocrwatch.recognize import figures
from ocrwatch.recognize.ladder import PageResult
from ocrwatch.results import assemble
from ocrwatch.results import further as outputs
from ocrwatch.sources.base import Job, LocalFile
from tests.support import docs
from tests.test_grounding import PAPER, WORKSHEET


def rendered(path: Path, index: int = 0) -> render.RenderedPage:
    info = render.probe(path, render.Limits.from_config(LimitsConfig()))
    return render.render_page(
        path, info, index, render.render_spec(RenderConfig(), Geometry(dpi=100))
    )


@pytest.fixture
def page(tmp_path: Path) -> render.RenderedPage:
    pdf = docs.write_pdf(
        tmp_path / "paper.pdf", [["Watching Folders for Documents", "Ada Example, Bo Sample"]]
    )
    return rendered(pdf)


def recognised(
    page: render.RenderedPage, raw: str = PAPER, status: str = "ok"
) -> tuple[PageResult, PageRequest]:
    parsed = parse(raw, page.width, page.height, images="extract", page_index=page.index)
    recognition = Recognition(markdown=parsed.markdown, raw=raw, blocks=parsed.blocks)
    attempt = {"rung": 0, "request_id": "p/a0", "sampling": {}, "outcome": status, "seconds": 0.1}
    result = PageResult(status, recognition, [attempt])  # type: ignore[arg-type]
    return result, PageRequest(f"doc/p{page.index}", page.image, "markdown", page_index=page.index)


def outcome(
    page: render.RenderedPage, result: PageResult, cut: tuple[figures.Figure, ...]
) -> PageOutcome:
    return PageOutcome(page.index, page.width, page.height, page.dpi, 0.1, result, cut)


def test_figures_are_cut_from_the_rendered_page_at_its_resolution(
    page: render.RenderedPage,
) -> None:
    result, request = recognised(page)
    cut = asyncio.run(figures.extract(request, result))

    blocks = [block for block in result.recognition.blocks if block["type"] == "image"]  # type: ignore[union-attr]
    assert [figure.name for figure in cut] == ["page-1-figure-1"] and len(blocks) == 1
    figure = cut[0]
    assert figure.page == 1 and list(figure.bbox) == blocks[0]["bbox"]
    with Image.open(io.BytesIO(figure.png)) as image:
        assert image.format == "PNG" and image.size == (
            figure.bbox[2] - figure.bbox[0],
            figure.bbox[3] - figure.bbox[1],
        )
        assert (
            ImageChops.difference(
                image.convert(page.image.mode), page.image.crop(figure.bbox)
            ).getbbox()
            is None
        )
    assert figures.is_ours(figure.png[:4096])


def test_figures_of_a_page_scanned_sideways_are_cut_upright(tmp_path: Path) -> None:
    """The same page scanned on its side is read upright: its figure is the upright page's."""
    lines = ["Watching Folders for Documents", "Ada Example, Bo Sample"] + [
        f"Section {n}: documents dropped in a folder are read and written next to it"
        for n in range(1, 9)
    ]
    upright = rendered(docs.write_pdf(tmp_path / "paper.pdf", [lines]))
    shown = orientation.turn(docs.text_image(lines), 90)
    sideways = rendered(docs.write_pdf(tmp_path / "sideways.pdf", [shown]))
    assert (sideways.orientation.rotation, upright.orientation.rotation) == (270, 0)
    assert (sideways.width, sideways.height) == (upright.width, upright.height)
    cut = []
    for page in (upright, sideways):
        result, request = recognised(page)
        cut.append(asyncio.run(figures.extract(request, result)))
    (straight,), (turned,) = cut
    assert turned.bbox == straight.bbox
    as_shown = orientation.turn(sideways.image, 90).crop(straight.bbox)  # what a cut unturned gives
    with Image.open(io.BytesIO(straight.png)) as one, Image.open(io.BytesIO(turned.png)) as other:
        same = ImageStat.Stat(ImageChops.difference(one, other)).mean[0]  # pdftoppm's resampling
        wrong = ImageStat.Stat(ImageChops.difference(one, as_shown.convert(one.mode))).mean[0]
        assert same < 0.4 * wrong, (same, wrong)


def test_a_user_png_is_not_taken_for_a_figure(page: render.RenderedPage) -> None:
    out = io.BytesIO()
    page.image.save(out, "PNG")
    assert not figures.is_ours(out.getvalue()[:4096])


def test_failed_pages_and_figures_without_boxes_give_no_files(page: render.RenderedPage) -> None:
    result, request = recognised(page, status="failed")
    assert asyncio.run(figures.extract(request, result)) == ()
    unboxed = PAPER.replace(
        "<|ref|>image<|/ref|><|det|>[[131, 470, 863, 640]]<|/det|>", "<|ref|>image<|/ref|>"
    )
    result, request = recognised(page, unboxed)
    assert asyncio.run(figures.extract(request, result)) == ()
    assert "![](page-1-figure-1)" in assemble.markdown(
        [outcome(page, result, ())], "paper.pdf.assets"
    )
    assert (
        figures.extractor("placeholder") is None and figures.extractor("extract") is figures.extract
    )


def test_markdown_and_json_link_each_figure_to_its_file(
    page: render.RenderedPage, tmp_path: Path
) -> None:
    result, request = recognised(page, WORKSHEET)
    cut = asyncio.run(figures.extract(request, result))
    pages = [outcome(page, result, cut)]
    assets = "my report (2).pdf.assets"

    markdown = assemble.markdown(pages, assets)
    assert "![](my%20report%20%282%29.pdf.assets/page-1-figure-1.png)" in markdown
    assert "![](page-1-figure-1)" not in markdown

    job = Job(LocalFile(tmp_path / "my report (2).pdf", tmp_path), "local")
    copy = type("Copy", (), {"path": tmp_path / "none.pdf", "info": None})()
    made = asyncio.run(
        outputs.prepare(OutputConfig(images="extract"), job.origin, copy, pages, tmp_path, {})
    )
    assert made.assets == assets and list(made.files) == [f"{assets}/page-1-figure-1.png"]
    listed = made.sections["figures"]
    assert listed == [
        {
            "page": 1,
            "name": "page-1-figure-1",
            "bbox": list(cut[0].bbox),
            "path": f"{assets}/page-1-figure-1.png",
            "bytes": len(cut[0].png),
            "sha256": hashlib.sha256(cut[0].png).hexdigest(),
        }
    ]
    document = _document(job, pages, made)
    jsonschema.validate(document, assemble.JSON_SCHEMA)
    assert (
        "![](my%20report%20%282%29.pdf.assets/page-1-figure-1.png)"
        in document["pages"][0]["markdown"]
    )
    assert list(document).index("figures") < list(document).index("pages")


def test_searchable_pdf_section_and_a_source_it_cannot_be_made_of(tmp_path: Path) -> None:
    pdf = docs.write_pdf(tmp_path / "letter.pdf", [["Invoice 4711 was paid"]])
    page = rendered(pdf)
    result, _ = recognised(page, "Invoice 4711 was paid")
    pages = [outcome(page, result, ())]
    info = render.probe(pdf, render.Limits.from_config(LimitsConfig()))
    copy = type(
        "Copy",
        (),
        {"path": pdf, "info": info, "sha256": hashlib.sha256(pdf.read_bytes()).hexdigest()},
    )()
    job = Job(LocalFile(tmp_path / "inbox" / "letter.pdf", tmp_path / "inbox"), "local")
    stages: dict[str, float] = {}
    made = asyncio.run(
        outputs.prepare(
            OutputConfig(searchable_pdf=True), job.origin, copy, pages, tmp_path, stages
        )
    )
    built = made.files["letter.pdf.ocr.pdf"]
    assert isinstance(built, Path) and stages["searchable_pdf"] > 0
    assert made.sections["searchable_pdf"] == {
        "path": "letter.pdf.ocr.pdf",
        "bytes": built.stat().st_size,
        "sha256": hashlib.sha256(built.read_bytes()).hexdigest(),
        "text_layer": ["ocr"],
    }
    jsonschema.validate(_document(job, pages, made), assemble.JSON_SCHEMA)

    # the copy read again for the layer is no longer a PDF: the document stands
    docs.write_corrupt_pdf(pdf)
    made = asyncio.run(
        outputs.prepare(OutputConfig(searchable_pdf=True), job.origin, copy, pages, tmp_path, {})
    )
    assert made.files == {}
    error = made.sections["searchable_pdf"]["error"]
    assert error["kind"] == "corrupt_pdf" and str(pdf) not in error["message"]
    # named as the user knows it, not as the spool copy
    assert str(job.origin.path) in error["message"]
    jsonschema.validate(_document(job, pages, made), assemble.JSON_SCHEMA)


def test_corpus_paper_page(corpus_dir: Path) -> None:
    """A real paper's first page (born digital) with the recorded paper output: the figure is its
    region."""
    page = rendered(corpus_dir / "tracemonkey.pdf")
    result, request = recognised(page)
    (figure,) = asyncio.run(figures.extract(request, result))
    with Image.open(io.BytesIO(figure.png)) as image:
        assert (
            ImageChops.difference(
                image.convert(page.image.mode), page.image.crop(figure.bbox)
            ).getbbox()
            is None
        )


def _document(job: Job, pages: list[PageOutcome], made: outputs.Outputs) -> dict[str, Any]:
    provenance = assemble.Provenance(
        source=assemble.source_section(job, None, "0" * 64, "application/pdf"),
        engine={"name": "recorded"},
        render={"dpi": 100},
    )
    return assemble.document(
        provenance,
        pages,
        detected=0.0,
        started=0.0,
        finished=1.0,
        stages={},
        assets=made.assets,
        outputs=made.sections,
    )
