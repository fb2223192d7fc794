"""grounding: DeepSeek-OCR grounding output to blocks and Markdown, and loop detection, on realistic
samples."""

from __future__ import annotations

import random
import time

import pytest

from ocrwatch.engines.deepseek.grounding import LoopInfo, clean_markdown, find_loop, parse

EOS = "<｜end▁of▁sentence｜>"

# A paper's first page as DeepSeek-OCR writes it with "<|grounding|>Convert the document to
# markdown.": blocks in reading order, trailing spaces, a figure with its caption, an equation with
# \coloneqq, an HTML table, and the end-of-sentence token left in by skip_special_tokens=False.
PAPER = (
    "<|ref|>title<|/ref|><|det|>[[172, 92, 826, 140]]<|/det|>\n"
    "# Watching Folders for Documents: A Field Report  \n\n"
    "<|ref|>text<|/ref|><|det|>[[123, 160, 878, 205]]<|/det|>\n"
    "Ada Example \\(^{1}\\) Bo Sample \\(^{2}\\)  \n\n"
    "<|ref|>sub_title<|/ref|><|det|>[[460, 283, 537, 301]]<|/det|>\n"
    "## Abstract  \n\n"
    "<|ref|>text<|/ref|><|det|>[[114, 311, 884, 458]]<|/det|>\n"
    "We describe a daemon that turns scanned documents into Markdown. It renders pages at the "
    "model's "
    "geometry and keeps the engine busy.  \n\n"
    "<|ref|>image<|/ref|><|det|>[[131, 470, 863, 640]]<|/det|>\n"
    "<|ref|>image_caption<|/ref|><|det|>[[115, 653, 883, 687]]<|/det|>\n"
    "<center>Figure 1: Pages per second against pages in flight. </center>  \n\n"
    "<|ref|>equation<|/ref|><|det|>[[303, 700, 690, 740]]<|/det|>\n"
    "\\[T \\coloneqq \\frac{N}{t}, \\quad t \\eqqcolon t_r + t_o\\]\n\n"
    "<|ref|>table<|/ref|><|det|>[[115, 760, 880, 900]]<|/det|>\n"
    "<table><tr><td>Engine</td><td>Pages/s</td></tr><tr><td>vLLM</td><td>5.4</td></tr>"
    "<tr><td>Tesseract</td><td>0.8</td></tr></table>\n\n"
    "<|ref|>page_number<|/ref|><|det|>[[490, 960, 510, 975]]<|/det|>\n"
    "1" + EOS
)

PAPER_MARKDOWN = (
    "# Watching Folders for Documents: A Field Report\n\n"
    "Ada Example \\(^{1}\\) Bo Sample \\(^{2}\\)\n\n"
    "## Abstract\n\n"
    "We describe a daemon that turns scanned documents into Markdown. It renders pages at the "
    "model's "
    "geometry and keeps the engine busy.\n\n"
    "![](page-3-figure-1)\n\n"
    "<center>Figure 1: Pages per second against pages in flight. </center>\n\n"
    "\\[T := \\frac{N}{t}, \\quad t =: t_r + t_o\\]\n\n"
    "<table><tr><td>Engine</td><td>Pages/s</td></tr><tr><td>vLLM</td><td>5.4</td></tr>"
    "<tr><td>Tesseract</td><td>0.8</td></tr></table>\n\n"
    "1"
)

# A German worksheet in DeepSeek-OCR-2 style: a sub_title without '#', a list, two equations, a
# figure, a paragraph spanning two columns (two boxes for one ref).
WORKSHEET = (
    "<|ref|>sub_title<|/ref|><|det|>[[77, 66, 315, 84]]<|/det|>\n"
    "3. Volumen durch Integration \n\n"
    "<|ref|>text<|/ref|><|det|>[[74, 84, 692, 118]]<|/det|>\n"
    "- Sie kennen den Begriff des Querschnitts.\n"
    "- Sie können Volumen berechnen. \n\n"
    "<|ref|>equation<|/ref|><|det|>[[115, 135, 800, 230]]<|/det|>\n"
    "\\[\n\\begin{align*}\nV &= \\int_{-a}^{a} A(x)\\,dx\n\\end{align*}\n\\]\n\n"
    "<|ref|>figure<|/ref|><|det|>[[290, 235, 710, 415]]<|/det|>\n \n\n"
    "<|ref|>text<|/ref|><|det|>[[74, 430, 480, 700], [520, 430, 930, 520]]<|/det|>\n"
    "Wir bestimmen die Fläche der Dreiecke und integrieren über x. \n\n"
    "<|ref|>equation<|/ref|><|det|>[[240, 720, 375, 750]]<|/det|>\n"
    "\\[f'(x) = 2x\\]\n" + EOS
)


def test_paper_page_blocks_and_markdown() -> None:
    page = parse(PAPER, 999 * 2, 999 * 3, page_index=2)

    assert page.markdown == PAPER_MARKDOWN
    assert [b["type"] for b in page.blocks] == [
        "title",
        "text",
        "sub_title",
        "text",
        "image",
        "image_caption",
        "equation",
        "table",
        "page_number",
    ]
    title = page.blocks[0]
    assert title["text"] == "# Watching Folders for Documents: A Field Report"
    assert title["bbox"] == [344, 276, 1652, 420]
    assert all(isinstance(v, int) for b in page.blocks for v in b["bbox"])
    image = page.blocks[4]
    assert image == {
        "type": "image",
        "text": "",
        "bbox": [262, 1410, 1726, 1920],
        "name": "page-3-figure-1",
    }
    assert page.blocks[6]["text"] == "\\[T := \\frac{N}{t}, \\quad t =: t_r + t_o\\]"
    assert "end▁of▁sentence" not in page.markdown + str(page.blocks)


def test_worksheet_multi_box_figure_and_headings_as_emitted() -> None:
    page = parse(WORKSHEET, 1000, 1000)

    assert page.markdown.startswith("3. Volumen durch Integration\n\n- Sie kennen")
    assert "\\begin{align*}\nV &= \\int_{-a}^{a} A(x)\\,dx\n\\end{align*}" in page.markdown
    assert "![](page-1-figure-1)" in page.markdown
    spanning = page.blocks[4]
    assert spanning["boxes"] == [[74, 430, 480, 700], [520, 430, 930, 520]]
    assert spanning["bbox"] == [74, 430, 930, 700]
    assert "boxes" not in page.blocks[0]
    assert page.blocks[3]["type"] == "figure" and page.blocks[3]["text"] == ""


def test_images_dropped_but_named() -> None:
    page = parse(PAPER, 999, 999, images="drop")

    assert "![](" not in page.markdown
    assert "Markdown. It renders" in page.markdown
    assert "\n\n\n" not in page.markdown
    assert page.blocks[4]["name"] == "page-1-figure-1"


def test_several_images_numbered_in_order() -> None:
    raw = (
        "<|ref|>image<|/ref|><|det|>[[0, 0, 499, 499]]<|/det|>\n\n"
        "<|ref|>text<|/ref|><|det|>[[0, 500, 999, 600]]<|/det|>\nBetween.\n\n"
        "<|ref|>image<|/ref|><|det|>[[0, 600, 999, 999]]<|/det|>\n"
    )
    page = parse(raw, 999, 999, page_index=0)
    assert page.markdown == "![](page-1-figure-1)\n\nBetween.\n\n![](page-1-figure-2)"


def test_coordinates_clamped_ordered_and_scaled_to_the_page() -> None:
    raw = (
        "<|ref|>text<|/ref|><|det|>[[-20, 10, 1200, 1005]]<|/det|>\nWide.\n"
        "<|ref|>text<|/ref|><|det|>[[800, 900, 100, 200]]<|/det|>\nSwapped.\n"
        "<|ref|>text<|/ref|><|det|>[[0, 0, 999, 999]]<|/det|>\nWhole page.\n"
    )
    page = parse(raw, 1700, 2200)
    assert page.blocks[0]["bbox"] == [0, 22, 1700, 2200]
    assert page.blocks[1]["bbox"] == [170, 440, 1361, 1981]
    assert page.blocks[2]["bbox"] == [0, 0, 1700, 2200]


@pytest.mark.parametrize(
    ("det", "bbox"),
    [
        ("[[70,93，450,360]]", [70, 93, 450, 360]),  # full-width comma, as sampled outputs show
        ("[70, 93, 450, 360]]", [70, 93, 450, 360]),  # a bracket lost
        ("[[[70, 93, 450, 360]]]", [70, 93, 450, 360]),  # one bracket too many
        ("[[７０, 93, 450, 360]]", [70, 93, 450, 360]),  # full-width digits
        ("70, 93, 450, 360", [70, 93, 450, 360]),  # no brackets at all
        ("[[70.5, 93.2, 450.9, 360.0]]", [70, 93, 450, 360]),
        ("[[a, b, c, d]]", None),
        ("[[70, 93, 450]]", None),
        ("[[70, 93, 450, 360, 12]]", None),
        ("[[nan, 93, inf, 360]]", None),
        ("", None),
        ("garbage<>", None),
    ],
)
def test_garbled_coordinates_never_raise(det: str, bbox: list[int] | None) -> None:
    page = parse(f"<|ref|>text<|/ref|><|det|>{det}<|/det|>\nThe paragraph.", 999, 999)
    assert page.blocks == [{"type": "text", "text": "The paragraph.", "bbox": bbox}]
    assert page.markdown == "The paragraph."


def test_one_good_box_among_garbled_ones_is_kept() -> None:
    page = parse("<|ref|>text<|/ref|><|det|>[[1, 2, x, 4], [10, 20, 30, 40]]<|/det|>Body", 999, 999)
    assert page.blocks[0]["bbox"] == [10, 20, 30, 40]
    assert "boxes" not in page.blocks[0]


def test_output_cut_off_inside_tags() -> None:
    good = "<|ref|>text<|/ref|><|det|>[[10, 10, 500, 50]]<|/det|>\nFirst paragraph.\n\n"
    for tail in (
        "<|ref|>tab",
        "<|ref|>table<|/ref|>",
        "<|ref|>table<|/ref|><|det|>[[115, 363, 88",
        "<|ref|>",
    ):
        page = parse(good + tail, 999, 999)
        assert page.markdown == "First paragraph.", tail
        assert "<|" not in str(page.blocks)
        assert page.blocks[0] == {
            "type": "text",
            "text": "First paragraph.",
            "bbox": [10, 10, 500, 50],
        }


def test_unclosed_det_followed_by_text() -> None:
    raw = "<|ref|>text<|/ref|><|det|>[[10, 10, 500, 50]]\nText after an unclosed det.\n"
    page = parse(raw, 999, 999)
    assert page.blocks == [
        {"type": "text", "text": "Text after an unclosed det.", "bbox": [10, 10, 500, 50]}
    ]


def test_missing_close_ref_and_stray_tags() -> None:
    raw = (
        "<|ref|>title<|det|>[[10, 10, 500, 50]]<|/det|>\n# "
        "Heading\n\n<|ref|>text<|/ref|><|det|>[[10, 60, 500, 90]]<|/det|>Body <|/det|> with "
        "<|det|>[[1, 2]] stray tags."
    )
    page = parse(raw, 999, 999)
    assert [b["type"] for b in page.blocks] == ["title", "text"]
    assert page.markdown == "# Heading\n\nBody  with stray tags."


def test_text_before_the_first_tag_is_kept_without_bbox() -> None:
    raw = (
        "Preamble the model wrote first.\n\n<|ref|>text<|/ref|><|det|>[[0, 0, 999, "
        "100]]<|/det|>\nTagged."
    )
    page = parse(raw, 100, 100)
    assert page.blocks[0] == {
        "type": "text",
        "text": "Preamble the model wrote first.",
        "bbox": None,
    }
    assert page.markdown == "Preamble the model wrote first.\n\nTagged."


@pytest.mark.parametrize(
    "raw", ["", "   \n\n ", EOS, "<｜begin▁of▁sentence｜>" + EOS, "<|grounding|>\n"]
)
def test_empty_output(raw: str) -> None:
    page = parse(raw, 1700, 2200)
    assert page.markdown == "" and page.blocks == []


def test_free_ocr_output_without_tags() -> None:
    raw = "INVOICE   \n\n\n\n\nNo. 4711\nTotal: 12.00 EUR" + EOS
    page = parse(raw, 1700, 2200)
    assert page.markdown == "INVOICE\n\nNo. 4711\nTotal: 12.00 EUR"
    assert page.blocks == [{"type": "text", "text": page.markdown, "bbox": None}]


def test_grounded_text_refs_become_text_blocks() -> None:
    raw = (
        "<|ref|>Invoice No. 4711<|/ref|><|det|>[[100, 100, 400, 130]]<|/det|>\n"
        "<|ref|>Total: 12.00 EUR<|/ref|><|det|>[[100, 150, 400, 180]]<|/det|>\n"
    )
    page = parse(raw, 999, 999)
    assert [(b["type"], b["text"]) for b in page.blocks] == [
        ("text", "Invoice No. 4711"),
        ("text", "Total: 12.00 EUR"),
    ]
    assert page.markdown == "Invoice No. 4711\n\nTotal: 12.00 EUR"


def test_unknown_layout_label_is_kept_as_type() -> None:
    page = parse(
        "<|ref|>algorithm<|/ref|><|det|>[[0, 0, 10, 10]]<|/det|>\nfor x in xs: f(x)", 999, 999
    )
    assert page.blocks[0]["type"] == "algorithm"


def test_clean_markdown() -> None:
    text = (
        "a \\coloneqq b  \n\n\n\n\nc \\eqqcolon d\t\n<|ref|>text<|/ref|><|det|>[[1, 2, 3, "
        "4]]<|/det|>e" + EOS
    )
    assert clean_markdown(text) == "a := b\n\nc =: d\ne"
    assert clean_markdown("\n\n# T\r\n\r\n\r\n\r\nx\n\n") == "# T\n\nx"
    assert clean_markdown("<|ref|>Grounded words<|/ref|>") == "Grounded words"


# --- loops ----------------------------------------------------------------------------------------

PROSE = (
    "The committee met on Tuesday to review the budget for the coming year. Several members raised "
    "questions about the maintenance of the old library building, and the treasurer promised a "
    "report.\n\n"
)


def _prose(words: int, seed: int = 7) -> str:
    rng = random.Random(seed)
    vocabulary = [
        "the",
        "of",
        "and",
        "a",
        "to",
        "in",
        "is",
        "was",
        "for",
        "on",
        "that",
        "with",
        "as",
        "by",
        "it",
        "at",
        "from",
        "this",
        "be",
        "are",
        "or",
        "an",
        "which",
    ]
    vocabulary += [
        "report",
        "library",
        "budget",
        "member",
        "council",
        "river",
        "station",
        "meeting",
        "engine",
        "page",
        "table",
    ]
    return " ".join(rng.choice(vocabulary) for _ in range(words)) + "."


def test_loop_same_line_repeated_at_the_end() -> None:
    text = PROSE + "Item 4: see the appendix for details.\n" * 60
    loop = find_loop(text)
    assert isinstance(loop, LoopInfo)
    assert loop.unit == "Item 4: see the appendix for details."
    assert loop.repeats == pytest.approx(60, abs=0.1)
    assert text[: loop.start] == PROSE.rstrip()
    assert loop.chars == len(text) - loop.start


PARAGRAPH = (
    "<|ref|>text<|/ref|><|det|>[[100, 200, 900, 260]]<|/det|>\n"
    "The results in Table 2 show that the method is robust to noise in the input.\n\n"
)


@pytest.mark.parametrize("cut", range(0, len(PARAGRAPH), 6))
def test_loop_paragraph_repeated_and_cut_off_anywhere(cut: int) -> None:
    """max_tokens ends the output anywhere, inside a tag too."""
    text = PROSE + PARAGRAPH * 7 + PARAGRAPH[:cut]
    loop = find_loop(text)
    assert loop is not None
    assert (
        loop.unit == "The results in Table 2 show that the method is robust to noise in the input."
    )
    assert 6.9 < loop.repeats < 8.1
    assert text[: loop.start] == PROSE.rstrip()


def test_loop_of_a_block_with_moving_coordinates() -> None:
    """The model repeats a line, each time with the next box down the page: the tags do not hide
    it."""
    blocks = "".join(
        f"<|ref|>text<|/ref|><|det|>[[100, {y}, 900, {y + 20}]]<|/det|>\nContinued on the next "
        "page.\n\n"
        for y in range(100, 900, 25)
    )
    assert find_loop(PROSE + blocks) is not None


def test_loop_of_empty_table_cells_running_off_the_end() -> None:
    text = PROSE + "<table><tr><td>Name</td><td>Date</td></tr><tr>" + "<td></td>" * 1500
    loop = find_loop(text)
    assert loop is not None and loop.repeats > 1000
    assert "td" in loop.unit


@pytest.mark.parametrize(
    "tail",
    [
        "我们的产品质量很好。" * 40,  # CJK, no spaces
        "ha" * 200,
        "the same the same the same " * 30,
        "".join(
            f"Repeat this sentence please.{' ' * (i % 3)}\n" for i in range(40)
        ),  # whitespace varies
    ],
)
def test_loop_variants(tail: str) -> None:
    assert find_loop(PROSE + tail) is not None


def test_loop_before_trailing_special_tokens() -> None:
    assert find_loop(PROSE + "Thank you for reading. " * 30 + EOS + "\n") is not None


def test_no_loop_in_table_rows_of_different_numbers() -> None:
    rows = "".join(
        f"<tr><td>2024-{1 + i // 28:02d}-{1 + i % 28:02d}</td><td>{1000 + 17 * i}</td>"
        "<td>0.00</td><td>OK</td></tr>"
        for i in range(120)
    )
    assert find_loop(PROSE + "<table>" + rows + "</table>") is None
    assert find_loop(PROSE + "<table>" + rows) is None  # even with the table still open
    md_rows = "".join(f"| {i} | Widget {i % 7} | {3 * i}.00 |\n" for i in range(80))
    assert find_loop(PROSE + "| # | Item | Price |\n|---|---|---|\n" + md_rows) is None


def test_no_loop_in_a_table_of_identical_empty_rows_that_is_closed() -> None:
    table = (
        "<table><tr><td>Name</td><td>Signature</td></tr>"
        + "<tr><td></td><td></td></tr>" * 40
        + "</table>"
    )
    assert find_loop(PROSE + table) is None


def test_no_loop_in_lists_of_short_items() -> None:
    assert find_loop(PROSE + "".join(f"- Item {i}\n" for i in range(1, 80))) is None
    answers = "".join(f"{chr(97 + i)}) {answer}\n" for i, answer in enumerate(["yes", "no"] * 12))
    assert find_loop(PROSE + answers) is None


def test_no_loop_in_a_table_of_contents_with_dot_leaders() -> None:
    toc = "".join(
        f"{i}. Chapter about topic {i} {'.' * (60 - len(str(i)))} {7 * i}\n" for i in range(1, 40)
    )
    assert find_loop("## Contents\n\n" + toc) is None
    assert find_loop("## Contents\n\n" + toc + ("." * 80 + "\n") * 30) is None  # a page of dots


@pytest.mark.parametrize(
    "tail",
    [
        ("_" * 60 + "\n") * 30,  # a form's blank lines
        "| | | |\n" * 60,  # empty markdown table rows
        "| 0 | 0 | 0 |\n" * 40,  # a table of zeros
        "- - - - - - - - - -\n" * 30,
        "Signature: ______________ Date: __________\n" * 3,  # a few identical lines
        "very " * 6,
    ],
)
def test_no_loop_in_legitimate_repetition(tail: str) -> None:
    assert find_loop(PROSE + tail) is None


def test_no_loop_in_ordinary_text() -> None:
    assert find_loop("") is None
    assert find_loop("Short.") is None
    assert find_loop(PAPER) is None
    assert find_loop(_prose(5000)) is None


def test_find_loop_is_fast_on_runaway_output() -> None:
    started = time.perf_counter()
    find_loop(_prose(12000))
    find_loop(PROSE + "<td></td>" * 20000)
    assert time.perf_counter() - started < 1.0
