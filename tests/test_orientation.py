"""Pages turned upright: OSD's report read, the three bands decided with the real Tesseract, the map
back to the rendered page, and the corpus's turned and upright pages."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageDraw, ImageFont, ImageOps

from ocrwatch.config import RenderConfig
from ocrwatch.engines.base import PageRequest
from ocrwatch.engines.tesseract import TesseractEngine
from ocrwatch.engines.tesseract_options import TesseractConfig
from ocrwatch.errors import ConfigError
from ocrwatch.pages import deskew, orientation, osd, render
from ocrwatch.pages.orientation import Orientation, Settings
from ocrwatch.pages.scheduler import PageOutcome
from ocrwatch.recognize.ladder import PageResult
from ocrwatch.results import assemble
from tests.support import docs, rotated

LINES = list(rotated.PANGRAMS)
REPORT = """Page number: 0
Orientation in degrees: 90
Rotate: 270
Orientation confidence: 31.73
Script: Latin
Script confidence: 4.41
"""
ON = Settings(rotate=True)


def page(lines: list[str] = LINES) -> Image.Image:
    return docs.text_image(lines)


def test_osd_report_parsed() -> None:
    assert osd.parse_osd(REPORT) == (270, 31.73, "Latin", 4.41)
    hebrew = REPORT.replace("Script: Latin", "Script: Hebrew")
    assert osd.parse_osd(hebrew.replace("4.41", "x")) == (270, 31.73, "Hebrew", None)
    assert osd.parse_osd(REPORT.replace("Rotate: 270", "Rotate: 45")) is None
    assert osd.parse_osd(REPORT.replace("31.73", "nan")) is None
    assert osd.parse_osd("Too few characters. Skipping this page\n") is None


def test_script_picks_an_installed_language() -> None:
    """``auto``: a script's first installed language, eng for Latin or an unknown script, and eng
    with the package to install where none of the script's is."""
    installed = frozenset({"eng", "deu", "osd", "ukr", "chi_tra"})
    assert osd.language("Latin", installed) == ("eng", None)
    assert osd.language(None, installed) == ("eng", None)
    assert osd.language("Fraktur", installed) == ("eng", None)
    assert osd.language("Cyrillic", installed) == ("ukr+eng", None)
    assert osd.language("Han", installed) == ("chi_tra+eng", None)
    assert osd.language("Hebrew", installed) == ("eng", "tesseract-ocr-heb")
    assert osd.language("Han", frozenset({"eng"})) == ("eng", "tesseract-ocr-chi-sim")
    assert osd.reads("deu+eng", "Latin") and not osd.reads("deu+eng", "Arabic")
    assert osd.reads("ara+eng", "Arabic") and not osd.reads("ara", "Latin")
    assert osd.latin(installed) == "deu+eng" and osd.latin(frozenset({"ara"})) == "eng"


@pytest.mark.parametrize("clockwise", [90, 180, 270])
def test_a_turned_page_is_turned_back(clockwise: int) -> None:
    """A page of eight lines shown turned comes back upright; with the threshold at the floor,
    OSD's answer is taken as it is where its glance is that sure, else after reading its window
    both ways."""
    upright = page()
    shown = orientation.turn(upright, (360 - clockwise) % 360)
    sure = Settings(rotate=True, threshold=orientation.READ_FLOOR)
    image, turned = orientation.upright(shown, 150.0, sure)
    assert (turned.rotation, turned.detected) == (clockwise, clockwise)
    assert turned.confidence is not None
    assert turned.decided_by == ("osd" if turned.confidence >= sure.threshold else "reading")
    assert image.size == upright.size and image.tobytes() == upright.tobytes()


def test_an_upright_page_stays_as_it_is() -> None:
    image, turned = orientation.upright(page(), 150.0, ON)
    assert (turned.rotation, turned.detected, turned.decided_by) == (0, 0, "osd")
    assert image.tobytes() == page().tobytes()


def test_below_the_threshold_the_page_is_read_both_ways() -> None:
    """With a threshold no answer reaches, a turned page is turned only after reading better so."""
    shown = orientation.turn(page(), 90)
    image, turned = orientation.upright(shown, 150.0, Settings(rotate=True, threshold=100.0))
    assert (turned.rotation, turned.decided_by) == (270, "reading")
    assert image.tobytes() == page().tobytes()


def test_the_reading_check_prefers_the_upright_page(tmp_path: Path) -> None:
    """What the check rests on: upside down, a page reads less than half the confident characters
    it reads upright, so an upright page OSD misreads as upside down is kept."""
    page().save(tmp_path / "upright.pgm")
    orientation.turn(page(), 180).save(tmp_path / "turned.pgm")
    upright = orientation.readable_characters(str(tmp_path / "upright.pgm"), 150.0, 60.0)
    turned = orientation.readable_characters(str(tmp_path / "turned.pgm"), 150.0, 60.0)
    assert upright >= sum(map(len, LINES)) * 0.8 and turned * orientation.READ_RATIO < upright


PROSE = (
    "When the river rose in the spring of that year,",
    "the mill was closed for three weeks and all the",
    "hands went back to their farms. The owner had it",
    "rebuilt on higher ground the following autumn, a",
    "little further from the bank, with a wheel of iron",
    "in place of the old wooden one that the flood had",
    "carried half a mile down the valley. It stood there",
    "until the railway came, and then it was let to a",
    "baker who kept it for thirty years and more.",
)
SERIF = Path("/usr/share/fonts/truetype/dejavu/DejaVuSerif.ttf")


def prose_page() -> Image.Image:
    """A page of ordinary English prose at 12 points and 150 dpi, in a book face: what most pages
    are, and what the text-line test keeps upright without OSD."""
    image = Image.new("L", docs.A4_150DPI, 255)
    draw, font = ImageDraw.Draw(image), ImageFont.truetype(str(SERIF), 25)
    for number, line in enumerate(PROSE * 3):
        draw.text((100, 100 + number * 38), line, fill=0, font=font)
    return image


TABLE = (
    ("Boiling Points", "min", "max", "avg"),
    ("Noble gases", "-269", "-62", "-170.5"),
    ("Nonmetals", "-253", "4827", "414.1"),
    ("Metalloids", "335", "3900", "741.5"),
    ("Metals", "357", ">5000", "2755.9"),
)
SANS = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")
BOLD = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf")


def framed_table() -> Image.Image:
    """A Letter page at 150 dpi holding a small table of figures in a frame, a rule under each row
    (the shape of the issue's page, the corpus's small-table.pdf): a page of few words, which OSD
    is unsure of on its side."""
    image = Image.new("L", (1275, 1650), 255)
    draw = ImageDraw.Draw(image)
    plain, bold = (ImageFont.truetype(str(face), 18) for face in (SANS, BOLD))
    left, top, right, row = 180, 420, 1080, 45
    bottom = top + len(TABLE) * row
    for number, cells in enumerate(TABLE):
        y = top + number * row
        draw.line((left, y, right, y), fill=0, width=2)
        for column, (x, text) in enumerate(zip((left, 450, 660, 870), cells, strict=True)):
            font = bold if not column or not number else plain
            draw.text((x + 15, y + 12), text, fill=0, font=font)
    for x, y in ((left, bottom), (right, bottom)):
        draw.line((x, top, x, y), fill=0, width=2)
    draw.line((left, bottom, right, bottom), fill=0, width=2)
    return image


@pytest.mark.parametrize("made", ["prose", "table"])
def test_a_sideways_page_claiming_more_dpi_than_it_has_is_turned(tmp_path: Path, made: str) -> None:
    """Issue 37.3: a page made at 150 dpi, turned 90 degrees and saved as a PNG that says 600 dpi.
    Shrunk by what it claims, its lines were a few pixels high: the text-line test found none and
    OSD too little to say (the table was kept as it was, the prose too, at OSD's 0.8). Surveyed
    again finer, it is turned as the same page saying 150 dpi is: by its lines, or by reading."""
    if not (SANS.exists() and BOLD.exists()):
        pytest.skip("needs fonts-dejavu-core")
    page = prose_page() if made == "prose" else framed_table()
    docs.write_png(tmp_path / "sideways.png", orientation.turn(page, 90), dpi=600)
    turned = _turned_by(tmp_path, "sideways.png", 1)
    how = "text_lines" if made == "prose" else "reading"
    assert (turned.rotation, turned.decided_by, turned.reads_poorly) == (270, how, False)


def test_a_framed_table_on_its_side_reads_upright(tmp_path: Path) -> None:
    """The reading check on the table cut to its frame, turned 90 degrees: Tesseract read no line
    inside the frame any way round (0 confident characters upright), so the page stayed on its
    side. With its rules made white (``osd.unruled``), it reads upright."""
    if not (SANS.exists() and BOLD.exists()):
        pytest.skip("needs fonts-dejavu-core")
    table = framed_table()
    left, top, right, bottom = ImageOps.invert(table).getbbox() or (0, 0, 0, 0)
    framed = table.crop((left - 20, top - 20, right + 20, bottom + 20))
    reading = orientation._Reading(orientation.turn(framed, 90), 150.0, str(tmp_path), 60.0)
    rotation, read = reading.best(270)
    assert rotation == 270 and read >= orientation.GLANCE_READ_CHARACTERS


HEBREW = ["שלום עולם זהו מסמך בעברית", "הספר נמצא על השולחן בבית", "אנחנו קוראים את המכתב היום"]


def test_a_page_in_a_script_not_installed_is_read_in_eng_and_says_what_to_install() -> None:
    """OSD names a Hebrew page's script; ``auto``, with no heb installed, reads it in eng, which
    reads it poorly: its page says script_not_installed with tesseract-ocr-heb, and the document
    is partial. (DejaVu Sans has Hebrew letters.)"""
    if not SANS.exists() or "heb" in osd_languages():
        pytest.skip("needs fonts-dejavu-core, and no tesseract-ocr-heb installed")
    image = Image.new("L", (1400, 520), 255)
    draw, font = ImageDraw.Draw(image), ImageFont.truetype(str(SANS), 40)
    for number, line in enumerate(HEBREW * 2):
        draw.text((60, 60 + 70 * number), line, fill=0, font=font)
    upright, turned = orientation.upright(image, 200.0, ON)
    assert turned.script == "Hebrew"

    async def read() -> Any:
        engine = TesseractEngine(TesseractConfig(lang="auto", workers=1))
        await engine.start()
        try:
            return await engine.recognize(PageRequest("he", upright, "", script=turned.script))
        finally:
            await engine.close()

    recognition = asyncio.run(read())
    result = PageResult("ok", recognition, [])
    unread = assemble.unread_script(PageOutcome(0, 1, 1, 200.0, 0.0, result, orientation=turned))
    assert unread is not None and (unread["lang"], unread["package"]) == (
        "eng",
        "tesseract-ocr-heb",
    )


def osd_languages() -> set[str]:
    listed = subprocess.run(["tesseract", "--list-langs"], capture_output=True, text=True)
    return set(listed.stdout.split())


def counted_osd(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every page image path OSD is asked about, from here on."""
    asked: list[str] = []
    detect = orientation.detect

    def counting(
        path: str, dpi: float, timeout: float, characters: int | None = None
    ) -> osd.Answer | None:
        asked.append(path)
        return detect(path, dpi, timeout, characters)

    monkeypatch.setattr(orientation, "detect", counting)
    return asked


def test_upright_text_lines_need_no_osd(monkeypatch: pytest.MonkeyPatch) -> None:
    """An upright page of prose is kept as it is by its text lines alone: OSD is not run."""
    asked = counted_osd(monkeypatch)
    shown = prose_page()
    image, turned = orientation.upright(shown, 150.0, ON)
    assert (turned.rotation, turned.detected, turned.decided_by) == (0, None, "text_lines")
    assert turned.script == "Latin"  # only Latin lines pass the test
    assert image is shown and asked == []


@pytest.mark.parametrize("clockwise", [90, 180, 270])
def test_turned_text_lines_are_turned_back(monkeypatch: pytest.MonkeyPatch, clockwise: int) -> None:
    """The same page turned is not taken for upright, but its lines say which turn makes them
    upright: it is turned back without OSD."""
    asked = counted_osd(monkeypatch)
    shown = orientation.turn(prose_page(), (360 - clockwise) % 360)
    assert not orientation.lines_say_upright(shown, 150.0)
    image, turned = orientation.upright(shown, 150.0, ON)
    assert (turned.rotation, turned.decided_by, asked) == (clockwise, "text_lines", [])
    assert image.tobytes() == prose_page().tobytes()


def test_one_line_of_large_letters_is_not_turned(tmp_path: Path) -> None:
    """The README's first page, one line of large letters: their strokes look like text lines on
    their side, but all in one row of tiles, so no turn is taken from them (the page was read on its
    side once the lines alone decided a turn)."""
    page = Image.open(docs.write_png(tmp_path / "hello.png", ["Hello from the README"]))
    image, turned = orientation.upright(page, 150.0, ON)
    assert turned.rotation == 0 and image is page


def test_a_page_without_text_is_kept() -> None:
    blank = Image.new("L", docs.A4_150DPI, 255)
    image, turned = orientation.upright(blank, 150.0, ON)
    assert (turned.rotation, turned.detected, turned.decided_by) == (0, None, "too_little_text")
    assert image is blank


def test_nothing_runs_when_nothing_is_asked() -> None:
    shown = orientation.turn(page(), 90)
    image, turned = orientation.upright(shown, 150.0, Settings())
    assert image is shown and turned == orientation.AS_RENDERED


def test_a_failing_tesseract_keeps_the_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Tesseract that crashes (here: a script that exits 3) fails no page: it is read as it is."""
    binary = tmp_path / "tesseract"
    binary.write_text("#!/bin/sh\necho 'segmentation fault' >&2\nexit 3\n")
    binary.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    shown = orientation.turn(page(), 90)
    image, turned = orientation.upright(shown, 150.0, ON)
    assert (image, turned.rotation, turned.decided_by) == (shown, 0, "failed")


def test_start_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    orientation.check(True)  # the test machine has tesseract-ocr-osd
    monkeypatch.setenv("PATH", str(tmp_path))
    orientation.check(False)
    with pytest.raises(ConfigError, match="rotate_pages"):
        orientation.check(True)
    languages = "#!/bin/sh\necho 'List of available languages (1):'\necho eng\n"
    (tmp_path / "tesseract").write_text(languages)
    (tmp_path / "tesseract").chmod(0o755)
    with pytest.raises(ConfigError, match="no osd data"):
        orientation.check(True)


@pytest.mark.parametrize(
    "turned",
    [Orientation(rotation=r, deskew=s) for r in (0, 90, 180, 270) for s in (None, 2.5, -4.0)],
    ids=lambda o: f"r{o.rotation}-s{o.deskew}",
)
def test_to_shown_undoes_the_turn(turned: Orientation) -> None:
    """A dot drawn on a rendered page, turned and levelled as ``upright`` does, is found in the
    upright image where ``to_shown`` maps back onto the dot."""
    shown = Image.new("L", (600, 400), 255)
    ImageDraw.Draw(shown).ellipse((430, 90, 442, 102), fill=0)  # centre (436, 96)
    image = orientation.turn(shown, turned.rotation)
    if turned.deskew:
        image = deskew.straighten(image, turned.deskew)
    box = ImageOps.invert(image).point(lambda value: 255 if value > 128 else 0).getbbox()
    assert box is not None
    u, v = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    a, b, c, d, e, f = orientation.to_shown(turned, image.width, image.height)
    assert a * u + c * v + e == pytest.approx(436.5, abs=1.5)
    assert b * u + d * v + f == pytest.approx(96.5, abs=1.5)


def test_render_page_turns_a_sideways_pdf_page(tmp_path: Path) -> None:
    """Through the renderer: the page image is the upright one, its size the turned size."""
    path = docs.write_pdf(tmp_path / "sideways.pdf", [orientation.turn(page(), 90)])
    info = render.probe(path, render.Limits(1 << 30, 10))
    spec = render.render_spec(RenderConfig(dpi=150))
    rendered = render.render_page(path, info, 0, spec)
    assert rendered.orientation.rotation == 270
    assert (rendered.width, rendered.height) == docs.A4_150DPI
    assert rendered.image.info["dpi"] == (150.0, 150.0)
    spec = render.render_spec(RenderConfig(dpi=150, rotate_pages=False))
    off = render.render_page(path, info, 0, spec)
    assert off.orientation == orientation.AS_RENDERED and off.width > off.height


# --- the corpus ----------------------------------------------------------------------------------


def _spec(**keys: Any) -> render.RenderSpec:
    return render.render_spec(RenderConfig(**keys), render.Geometry(dpi=TesseractConfig().dpi))


def _pages(manifest: list[dict[str, Any]], per_document: int) -> list[tuple[str, int]]:
    return [
        (entry["file"], number)
        for entry in manifest
        if entry["expected"] == "ok" and entry["file"] != "GeoTopo-komprimiert.pdf"
        for number in range(1, min(entry["pages"], per_document) + 1)
    ]


def _turned_by(corpus: Path, name: str, number: int) -> Orientation:
    path = corpus / name
    info = render.probe(path, render.Limits(1 << 30, 10_000))
    return render.render_page(path, info, number - 1, _spec()).orientation


@pytest.mark.parametrize("key", sorted(rotated.TURNED), ids=lambda key: f"{key[0]}-p{key[1]}")
def test_corpus_turned_pages_are_turned(corpus_dir: Path, key: tuple[str, int]) -> None:
    assert _turned_by(corpus_dir, *key).rotation == rotated.TURNED[key]


@pytest.mark.parametrize("part", range(4))
def test_corpus_upright_pages_stay_upright(
    corpus_dir: Path, manifest: list[dict[str, Any]], part: int
) -> None:
    """The first two pages of every other document (the 117-page GeoTopo's first two too): none is
    turned. In four parts, so that xdist runs them side by side."""
    pages = _pages(manifest, 2)
    pages += [("GeoTopo-komprimiert.pdf", 1), ("GeoTopo-komprimiert.pdf", 2)]
    upright = [key for key in pages if key not in rotated.TURNED][part::4]
    turned = {key: o for key in upright if (o := _turned_by(corpus_dir, *key)).rotation}
    assert not turned, turned


def _read(path: Path, spec: render.RenderSpec) -> list[str]:
    async def run() -> list[str]:
        engine = TesseractEngine(TesseractConfig(workers=2))
        await engine.start()
        try:
            info = render.probe(path, render.Limits(1 << 30, 10_000))
            pages = [render.render_page(path, info, index, spec) for index in range(info.pages)]
            requests = [PageRequest(str(page.index), page.image, prompt="") for page in pages]
            return [r.markdown for r in await asyncio.gather(*map(engine.recognize, requests))]
        finally:
            await engine.close()

    return asyncio.run(run())


@pytest.mark.parametrize("name", rotated.LEGIBLE)
def test_corpus_rotated_documents_read_upright(corpus_dir: Path, name: str) -> None:
    """Every page of the legible rotated documents reads as its reference, word for word, to 0.9
    (rotated_skew.pdf levelled too: it leans 2.8 degrees)."""
    spec = _spec(deskew=name == "rotated_skew.pdf")
    want = rotated.reference(corpus_dir, name)
    similarity = [rotated.word_similarity(text, want) for text in _read(corpus_dir / name, spec)]
    assert min(similarity) >= 0.9, similarity


def test_a_sideways_png_without_resolution_is_turned(corpus_dir: Path, tmp_path: Path) -> None:
    """Issue 37.3: a table page rendered at 150 dpi, turned 90 degrees and saved as a PNG with no
    resolution recorded (the renderer assumes one). OSD is unsure of it (about 2); read both ways
    on the whole page at the assumed resolution, it was kept on its side and read as gibberish.
    Detection on its densest text, scaled by the text's own height, turns it upright, and it reads
    as its reference."""
    table = corpus_dir / "small-table.pdf"
    info = render.probe(table, render.Limits(1 << 30, 10))
    spec = render.render_spec(RenderConfig(dpi=150, rotate_pages=False))
    shown = orientation.turn(render.render_page(table, info, 0, spec).image, 90)
    shown.info.clear()
    shown.save(tmp_path / "sideways.png")
    with Image.open(tmp_path / "sideways.png") as saved:
        assert "dpi" not in saved.info
    rendered = _turned_by(tmp_path, "sideways.png", 1)
    assert (rendered.rotation, rendered.decided_by, rendered.reads_poorly) == (
        270,
        "reading",
        False,
    )
    want = (corpus_dir / "small-table.pdf.gt.txt").read_text()
    (got,) = _read(tmp_path / "sideways.png", _spec())
    assert rotated.bag_similarity(got, want) >= 0.9


def test_a_sideways_table_at_300_dpi_is_turned(corpus_dir: Path, tmp_path: Path) -> None:
    """The same table page rendered at 300 dpi, turned 90 degrees and saved saying so: the glance's
    window cut across the table's frame and rules, inside which Tesseract read 17 confident
    characters at most any way round, so the page was kept on its side. With the rules made white
    it reads upright."""
    table = corpus_dir / "small-table.pdf"
    info = render.probe(table, render.Limits(1 << 30, 10))
    spec = render.render_spec(RenderConfig(dpi=300, rotate_pages=False))
    shown = orientation.turn(render.render_page(table, info, 0, spec).image, 90)
    docs.write_png(tmp_path / "sideways.png", shown, dpi=300)
    turned = _turned_by(tmp_path, "sideways.png", 1)
    assert (turned.rotation, turned.decided_by, turned.reads_poorly) == (270, "reading", False)


def test_a_page_no_way_round_reads_says_so(tmp_path: Path) -> None:
    """The reading check on a page of marks that are no letters: no way round reads, the page is
    kept as it is, and its orientation says it reads poorly (the JSON's ``reads_poorly``)."""
    marks = Image.new("L", (600, 400), 255)
    draw = ImageDraw.Draw(marks)
    for index in range(40):
        x, y = 30 + (index % 8) * 70, 30 + (index // 8) * 70
        draw.rectangle((x, y, x + 8 + index % 5 * 6, y + 30), fill=0)
    reading = orientation._Reading(marks, 150.0, str(tmp_path), 60.0)
    rotation, read = reading.best(90)
    turned = Orientation(rotation, 90, 2.0, "reading", read=read)
    assert rotation == 0 and turned.reads_poorly
    assert not Orientation(0, 90, 2.0, "reading", read=orientation.READ_MIN_CHARACTERS).reads_poorly
    assert not Orientation(decided_by="osd").reads_poorly
