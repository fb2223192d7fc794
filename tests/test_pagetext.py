"""A PDF page's own text taken where it is good: the judge's rules (a small word list stands in for
Tesseract's in the logic tests), Tesseract's real language data, real PDFs through pikepdf and
pdftotext, the render workers' page maker, and the corpus (skipped where it is absent)."""

from __future__ import annotations

import collections
import difflib
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pikepdf
import pytest
import structlog
from pikepdf import Name
from structlog.testing import capture_logs

from ocrwatch.config import Config, InboxConfig, RenderConfig
from ocrwatch.infra.memory import DecodeBudget
from ocrwatch.pages import orientation, pdfcontent, render
from ocrwatch.pages.scheduler import Checked
from ocrwatch.recognize import pagetext, tessdata
from ocrwatch.sources.base import LocalFile, S3Object
from tests.support import docs, hostile_pdfs

ENGLISH = (
    "The committee met on Tuesday to review the annual report. Members agreed that the budget for "
    "the coming year should be approved without further changes, and the chair thanked everyone "
    "for their careful work on the figures."
)
LINES = [" ".join(ENGLISH.split()[i : i + 5]) for i in range(0, len(ENGLISH.split()), 5)]
BUDGET = DecodeBudget(256 * 1024 * 1024)
JOB_ID = "0123456789ab"
HAS_TOOLS = all(shutil.which(tool) for tool in ("tesseract", "combine_tessdata", "dawg2wordlist"))
needs_tesseract = pytest.mark.skipif(
    not HAS_TOOLS, reason="tesseract and its training tools absent"
)


LATIN = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


class Words:
    """A Knowledge with fixed alphabets and one word list: the judge's logic, apart from Tesseract.
    ``eng`` has ``letters`` and ``words``; ``others`` are further installed languages, each with
    its letters and words."""

    def __init__(
        self,
        words: str,
        letters: str = LATIN,
        others: dict[str, tuple[str, str | None]] | None = None,
    ):
        self._letters = {"eng": frozenset(letters)}
        self._words = {"eng": frozenset(words.lower().split())}
        for lang, (its_letters, its_words) in (others or {}).items():
            self._letters[lang] = frozenset(its_letters)
            if its_words is not None:
                self._words[lang] = frozenset(its_words.split())

    def languages(self) -> frozenset[str]:
        return frozenset(self._letters) | {"osd"}

    def letters(self, lang: str) -> frozenset[str] | None:
        return frozenset().union(*(self._letters.get(name, ()) for name in lang.split("+")))

    def words(self, lang: str) -> frozenset[str] | None:
        names = lang.split("+")
        if not all(name in self._words for name in names):
            return None
        return frozenset().union(*(self._words[name] for name in names))


KNOWN = Words(ENGLISH.replace(".", "").replace(",", ""))


def test_a_page_of_known_words_is_good() -> None:
    assert pagetext.judge(ENGLISH, KNOWN, "eng") == ("good", 1.0)


def test_words_run_together_are_unknown() -> None:
    reason, share = pagetext.judge(ENGLISH.replace(" ", ""), KNOWN, "eng")
    assert reason == "unknown_words" and share == 0.0


def test_private_use_codes_are_unreadable() -> None:
    broken = "".join(chr(0xE000 + ord(c)) if c.isalpha() else c for c in ENGLISH)
    assert pagetext.judge(broken, KNOWN, "eng") == ("unreadable_codes", None)


def test_punctuation_alone_is_a_font_poppler_could_not_map() -> None:
    assert pagetext.judge(". , ; : ( ) . , 1 2 3 . , . ; " * 10 + " ab", KNOWN, "eng") == (
        "unmapped_font",
        None,
    )


def test_letters_no_language_has_fail() -> None:
    """TAMReview's symbol font mapped onto Latin Extended-B and Greek letters."""
    shifted = "".join(chr(0x01E0 + ord(c) % 32) if c.isalpha() else c for c in ENGLISH)
    assert pagetext.judge(shifted, KNOWN, "eng") == ("unknown_letters", None)


def test_a_page_number_is_too_little_to_judge() -> None:
    assert pagetext.judge("  17  \n", KNOWN, "eng") == ("little_text", None)


def test_dot_leaders_do_not_count_as_punctuation() -> None:
    contents = "\n".join(
        f"{word.title()} . . . . . . . . . . . . . . . . {n}"
        for n, word in enumerate(ENGLISH.split()[:20])
    )
    assert pagetext.judge(contents, KNOWN, "eng")[0] == "good"


def test_unspaced_scripts_are_judged_by_their_letters_alone() -> None:
    chinese = "表格中的数据来自年度报告，所有数字均已审核。" * 4
    known = Words("", letters="".join(set(chinese)))
    assert pagetext.judge(chinese, known, "eng") == ("good", None)
    assert pagetext.judge(chinese, KNOWN, "eng") == ("unknown_letters", None)


def test_a_layer_in_one_script_no_language_reads_names_its_package() -> None:
    """Issue 37.1: letters of one script Tesseract has no language for are that script's text, not
    a font's wrong map: the language pack that would read it is named. Kana make it Japanese;
    a symbol font mapped onto Latin Extended and Greek letters is no script's."""
    assert pagetext.missing_script("表格中的数据来自年度报告。" * 4, KNOWN.letters("eng")) == (
        "chi_sim",
        "tesseract-ocr-chi-sim",
    )
    assert pagetext.missing_script("تحسين الإنتاجية وحل المشكلات", KNOWN.letters("eng")) == (
        "ara",
        "tesseract-ocr-ara",
    )
    assert pagetext.missing_script("東京の天気はとても良いです。", KNOWN.letters("eng"))[0] == "jpn"
    shifted = "".join(chr(0x01E0 + ord(c) % 32) if c.isalpha() else c for c in ENGLISH)
    assert pagetext.missing_script(shifted, KNOWN.letters("eng")) is None


ARABIC = "تحسين الإنتاجية وحل المشكلات من خلال البرمجة بلغة واحدة " * 3


def _judged(knowledge: Words, lang: str) -> tuple[str, str | None]:
    found = pagetext._judged(ARABIC, knowledge, lang)
    return found[0], found[2]


def test_a_layer_is_judged_by_the_letters_of_the_languages_ocr_would_read_it_in() -> None:
    """Issue 37.1: an Arabic layer, where Arabic data is installed but ``lang`` is ``eng``, would
    be OCR'd in eng into Latin gibberish; it is kept and says which language to name. Where ``lang``
    names Arabic, or is ``auto``, the layer is judged by Arabic's letters and words and taken."""
    arabic_letters = "".join({c for c in ARABIC if c.isalpha()})
    arabic = Words(ENGLISH, others={"ara": (arabic_letters, " ".join(set(ARABIC.split())))})
    assert _judged(KNOWN, "eng") == ("script_not_installed", "tesseract-ocr-ara")
    assert _judged(arabic, "eng") == ("script_not_in_lang", "tesseract-ocr-ara")
    assert _judged(arabic, "ara+eng") == ("good", None)
    assert _judged(arabic, "auto") == ("good", None)
    assert {"script_not_installed", "script_not_in_lang"} <= set(pagetext.TAKEN)
    unknown_words = Words(ENGLISH, others={"ara": (arabic_letters, "كلمة")})
    assert _judged(unknown_words, "auto") == ("unknown_words", None)  # OCR reads it in ara


def test_a_language_without_a_word_list_cannot_be_judged() -> None:
    without = Words(ENGLISH, others={"fra": (LATIN, None)})
    assert pagetext.judge(ENGLISH, without, "fra") == ("no_dictionary", None)


@needs_tesseract
def test_tesseracts_language_data_gives_letters_and_words() -> None:
    knowledge = tessdata.Tessdata("tesseract")
    letters = knowledge.letters("eng")
    assert letters is not None and {"a", "Z", "é"} <= letters and not {"ǡ", "ͳ"} & letters
    assert knowledge.letters("eng+no_such_language") == letters
    words = knowledge.words("eng")
    assert words is not None and {"the", "committee", "annual"} <= words and len(words) > 100_000
    assert knowledge.words("no_such_language") is None
    assert pagetext.judge(ENGLISH, knowledge, "eng")[0] == "good"
    # lang auto judges a layer by the words of every installed Latin language (osd.latin)
    assert {"eng", "osd"} <= knowledge.languages()
    assert tessdata.shared("tesseract") is tessdata.shared("tesseract")  # read once per process


def test_without_tesseract_nothing_is_judged_good() -> None:
    knowledge = tessdata.Tessdata("/nonexistent/tesseract")
    assert knowledge.letters("eng") is None and knowledge.words("eng") is None
    assert pagetext.judge(ENGLISH, knowledge, "eng") == ("no_dictionary", None)


# --- real PDFs ---------------------------------------------------------------------------------


def _remapped(path: Path, first: int) -> Path:
    """The page's font given a ToUnicode map sending its codes 0x20..0x7E to ``first``...: a
    layer whose text reads as other characters, as a subset font without a right map does."""
    with pikepdf.open(path, allow_overwriting_input=True) as pdf:
        cmap = (
            "/CIDInit /ProcSet findresource begin 12 dict begin begincmap\n"
            "1 begincodespacerange <00> <FF> endcodespacerange\n"
            f"1 beginbfrange <20> <7E> <{first:04X}> endbfrange\n"
            "endcmap CMapName currentdict /CMap defineresource pop end end\n"
        )
        for page in pdf.pages:
            page.obj.Resources.Font.F1.ToUnicode = pdf.make_stream(cmap.encode())
        pdf.save(path)
    return path


def check(
    path: Path, mode: Any = "auto", index: int = 0, timeout: float = 60.0
) -> pagetext.TextCheck:
    return pagetext.check(
        path, index, mode, "eng", tessdata.shared("tesseract"), budget=BUDGET, timeout=timeout
    )


@needs_tesseract
def test_a_good_layer_is_taken_as_poppler_reads_it(tmp_path: Path) -> None:
    pdf = docs.write_pdf(tmp_path / "born.pdf", [LINES], text_layer=True)
    found = check(pdf)
    assert found.reason == "good" and found.known_words is not None and found.known_words > 0.9
    assert found.text is not None and " ".join(found.text.split()) == " ".join(
        " ".join(LINES).split()
    )
    assert found.record()["reason"] == "good"


@needs_tesseract
def test_a_broken_layer_is_ocrd_in_auto_and_taken_in_layer(tmp_path: Path) -> None:
    unreadable = _remapped(docs.write_pdf(tmp_path / "pua.pdf", [LINES], text_layer=True), 0xE020)
    wrong = _remapped(docs.write_pdf(tmp_path / "greek.pdf", [LINES], text_layer=True), 0x0370)
    assert (check(unreadable).text, check(unreadable).reason) == (None, "unreadable_codes")
    assert check(wrong).reason == "unknown_letters"
    taken = check(unreadable, "layer")
    assert taken.reason == "asked" and taken.text is not None and "\ue054" in taken.text


def test_a_scan_shows_no_text_and_costs_no_extraction(tmp_path: Path) -> None:
    scan = docs.write_pdf(tmp_path / "scan.pdf", [LINES])
    found = check(scan)
    assert (found.text, found.reason, found.known_words) == (None, "no_text", None)


def test_a_page_too_large_to_read_is_ocrd_unextracted(tmp_path: Path) -> None:
    """pdfcontent's bound holds before pdftotext runs: a form of 64 MiB of zeros is not decoded."""
    bomb = hostile_pdfs.write_form_bomb(
        tmp_path / "bomb.pdf", pdfcontent.MAX_PAGE_BYTES * 4, drawn=True
    )
    started = time.monotonic()
    assert check(bomb).reason == pdfcontent.CONTENT_TOO_LARGE
    assert time.monotonic() - started < 30


def test_a_page_whose_text_is_a_bomb_is_cut_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Text shown before a bomb ends pdfcontent's look (it only asks whether there is text), so
    pdftotext's output is bounded itself: a page of 1 MB of text, past a bound of 100 kB (the real
    one, 4 MiB, takes pdftotext a minute to reach: its time bound comes first then)."""
    monkeypatch.setattr(pagetext, "MAX_TEXT_BYTES", 100_000)
    line = b"0 -12 Td (" + b"word " * 200 + b") Tj\n"
    pdf = pikepdf.new()
    page = pdf.add_blank_page(page_size=(14400, 14400))
    font = pikepdf.Dictionary(Type=Name.Font, Subtype=Name.Type1, BaseFont=Name.Helvetica)
    page.obj.Resources = pikepdf.Dictionary(Font=pikepdf.Dictionary(F1=font))
    page.obj.Contents = pdf.make_stream(b"BT /F1 10 Tf 10 14390 Td\n" + line * 1000 + b"ET\n")
    pdf.save(tmp_path / "text-bomb.pdf")
    assert check(tmp_path / "text-bomb.pdf").reason == "text_too_large"


def test_nested_forms_are_ocrd(tmp_path: Path) -> None:
    deep = hostile_pdfs.write_nested_forms(
        tmp_path / "deep.pdf", pdfcontent.MAX_FORM_DEPTH + 5, text="x"
    )
    assert check(deep).reason == pdfcontent.FORMS_TOO_DEEP


def test_extraction_past_the_timeout_is_ocrd(tmp_path: Path) -> None:
    pdf = docs.write_pdf(tmp_path / "born.pdf", [LINES], text_layer=True)
    assert check(pdf, timeout=1e-6).reason == "extraction_timeout"


def test_a_pdf_qpdf_cannot_read_is_ocrd(tmp_path: Path) -> None:
    path = docs.write_corrupt_pdf(tmp_path / "corrupt.pdf")
    assert check(path).reason in ("unreadable_pdf", "no_text")


def test_markdown_keeps_poppler_blocks_as_paragraphs() -> None:
    assert pagetext.markdown("one  \ntwo\n\n\n\nthree\f") == "one\ntwo\n\nthree"


# --- the page maker ----------------------------------------------------------------------------


def pages(path: Path, mode: Any) -> pagetext.Pages:
    info = render.probe(path, render.Limits(10**9, 100))
    spec = render.render_spec(RenderConfig(dpi=100))
    seen: list[float] = []
    knowledge = tessdata.shared("tesseract")
    return pagetext.Pages(
        path, info, spec, mode, "eng", knowledge, BUDGET, seen.append, JOB_ID, path.as_uri()
    )


def test_a_render_workers_lines_carry_the_documents_job_id_and_uri(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker thread has none of the job's context: the page maker gives its lines the job's id
    and uri, as the document's other lines carry them, and numbers its page from 1."""
    scan = docs.write_pdf(tmp_path / "scan.pdf", [["one"], ["two"]], dpi=72)
    maker = pages(scan, "ocr")
    turned = orientation.Orientation(rotation=180, detected=180, confidence=20.0, decided_by="osd")
    monkeypatch.setattr(orientation, "upright", lambda image, dpi, settings: (image, turned))
    with (
        capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs,
        ThreadPoolExecutor(1) as workers,
    ):
        workers.submit(maker, 1).result()
    [line] = [line for line in logs if line["event"] == "page_turned"]
    assert (line["job_id"], line["uri"], line["page"]) == (JOB_ID, scan.as_uri(), 2)


@needs_tesseract
def test_a_layer_page_skips_the_render_and_a_scan_is_rendered(tmp_path: Path) -> None:
    born = docs.write_pdf(tmp_path / "born.pdf", [LINES], text_layer=True)
    scan = docs.write_pdf(tmp_path / "scan.pdf", [LINES])
    with pikepdf.open(born, allow_overwriting_input=True) as pdf, pikepdf.open(scan) as other:
        pdf.pages.extend(other.pages)
        pdf.save(born)
    maker = pages(born, "auto")
    first, second = maker(0), maker(1)
    assert isinstance(first, Checked) and first.page is None and first.taken is not None
    taken = first.taken
    rendered = render.render_page(born, maker.info, 0, maker.spec)
    assert (taken.width, taken.height, taken.dpi) == (rendered.width, rendered.height, rendered.dpi)
    assert taken.text_source == "layer" and taken.text_check is not None
    assert taken.result.status == "ok" and "committee" in taken.result.recognition.markdown
    assert taken.result.attempts == [] and taken.result.recognition.blocks == []
    assert isinstance(second, Checked) and second.taken is None and second.page is not None
    assert second.check["reason"] == "no_text" and second.page.image.size == (
        rendered.width,
        rendered.height,
    )
    plain = pages(born, "ocr")(0)
    assert isinstance(plain, render.RenderedPage)  # no check at all


def test_an_image_is_always_rendered(tmp_path: Path) -> None:
    png = docs.write_png(tmp_path / "a.png", LINES[:2])
    assert isinstance(pages(png, "layer")(0), render.RenderedPage)


def test_the_text_mode_asked_then_the_inboxs_then_the_engines(tmp_path: Path) -> None:
    inbox = tmp_path / "in"
    cfg = Config(
        inbox=(InboxConfig(path=inbox, text="layer"), InboxConfig(path=tmp_path / "other"))
    )
    here = LocalFile(inbox / "a.pdf", inbox.resolve())
    there = LocalFile(tmp_path / "other" / "a.pdf", (tmp_path / "other").resolve())
    bucket = S3Object("bucket", "a.pdf")
    assert pagetext.text_mode(cfg, here, "ocr", "tesseract") == "ocr"
    assert pagetext.text_mode(cfg, here, None, "vllm") == "layer"
    assert pagetext.text_mode(cfg, there, None, "tesseract") == "auto"
    assert pagetext.text_mode(cfg, bucket, None, "vllm") == "ocr"
    assert pagetext.text_mode(cfg, bucket, None, "plugin") == "ocr"


# --- the corpus --------------------------------------------------------------------------------


def words_similarity(got: str, want: str, ordered: bool) -> float:
    """Word similarity: difflib's ratio over the word sequences, or their multisets' overlap."""
    a, b = got.split(), want.split()
    if ordered:
        return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()
    common = sum((collections.Counter(a) & collections.Counter(b)).values())
    return 2 * common / max(len(a) + len(b), 1)


@needs_tesseract
def test_corpus_test_orient_reads_from_its_correct_layer(corpus_dir: Path) -> None:
    """Its OCR scored 0.15 against this layer (rotated boxes of text); auto now takes the layer."""
    path = corpus_dir / "test Orient.pdf"
    found = check(path)
    assert found.reason == "good" and found.text is not None
    want = (corpus_dir / "test Orient.pdf.gt.txt").read_text().split("\f")[0]
    assert words_similarity(pagetext.markdown(found.text), want, ordered=False) >= 0.95


@needs_tesseract
def test_corpus_born_digital_layers(corpus_dir: Path, manifest: list[dict[str, Any]]) -> None:
    """The first five pages of each born-digital English document with a text layer: taken, and
    word for word the ground truth (``pdftotext -layout``; order-free, since reading order and
    layout order differ on two columns). German pages pass with deu+eng."""
    chosen = [
        e
        for e in manifest
        if e.get("has_text_layer")
        and "born_digital" in e["tags"]
        and not {"cjk", "rtl"} & set(e["tags"])
    ]
    assert len(chosen) >= 5
    taken = 0
    for entry in chosen:
        path = corpus_dir / entry["file"]
        truth = (corpus_dir / f"{entry['file']}.gt.txt").read_text().split("\f")
        lang = "deu+eng" if "german" in entry["tags"] else "eng"
        for index in range(min(entry["pages"], 5)):
            found = pagetext.check(
                path, index, "auto", lang, tessdata.shared("tesseract"), budget=BUDGET, timeout=60
            )
            if found.text is None:
                assert found.reason in ("little_text", "unmapped_font"), (
                    entry["file"],
                    index,
                    found,
                )
                continue
            taken += 1
            score = words_similarity(pagetext.markdown(found.text), truth[index], ordered=False)
            assert score >= 0.95, (entry["file"], index + 1, score)
    assert taken >= 15


@needs_tesseract
def test_corpus_chinese_layer_is_kept_without_chinese_data(corpus_dir: Path) -> None:
    """Issue 37.1: issue-914-xmp-data.pdf's Chinese layer is right, and OCR in eng makes Latin
    gibberish of it: the layer is taken, text_check says why and names the package (to install,
    or installed but not in ``lang``), and the document's log warns once, however many of its
    pages want it."""
    listed = subprocess.run(["tesseract", "--list-langs"], capture_output=True, text=True).stdout
    reason = "script_not_in_lang" if "chi_sim" in listed.split() else "script_not_installed"
    maker = pages(corpus_dir / "issue-914-xmp-data.pdf", "auto")
    with capture_logs() as logs:
        found = [maker(0), maker(0)]
    for page in found:
        assert isinstance(page, Checked) and page.taken is not None and page.page is None
        assert page.check["reason"] == reason
        assert page.check["package"] == "tesseract-ocr-chi-sim"
        assert "商品编码" in page.taken.result.recognition.markdown
    [warning] = [line for line in logs if line["event"] == f"text_layer_{reason}"]
    assert warning["log_level"] == "warning" and "tesseract-ocr-chi-sim" in warning["hint"]


@needs_tesseract
def test_corpus_japanese_layer_is_read_with_poppler_data(corpus_dir: Path) -> None:
    """issue16538.pdf draws Japanese in a CID font that needs poppler-data's Adobe-Japan1 map
    (tests/run.sh and the images install it; apt's --no-install-recommends leaves it out): with
    it, its layer reads as the reference and is kept (``lang`` eng cannot read Japanese); without
    it pdftotext gave dots, the page was OCR'd and its Markdown was two letters."""
    path = corpus_dir / "issue16538.pdf"
    found = check(path)
    assert found.reason in ("script_not_installed", "script_not_in_lang"), found
    assert found.text is not None
    want = (corpus_dir / "issue16538.pdf.gt.txt").read_text().split("\f")[0]
    assert words_similarity(pagetext.markdown(found.text), want, ordered=False) >= 0.95


@needs_tesseract
def test_corpus_tamreview_broken_pages_are_ocrd(corpus_dir: Path) -> None:
    """TAMReview.pdf (pdf.js's test file): page 1's layer is right, pages 2–5 show a font without a
    Unicode map."""
    path = corpus_dir / "TAMReview.pdf"
    if not path.is_file():
        pytest.skip(f"TAMReview.pdf is not in the corpus at {corpus_dir} (pdf.js test/pdfs)")
    assert check(path, index=0).reason == "good"
    for index in range(1, 5):
        assert check(path, index=index).text is None, index + 1
