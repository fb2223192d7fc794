"""Plain text made Markdown: each escape where CommonMark/GFM would act, none where it would not,
the rendering read back through markdown-it-py; line-break hyphens joined only where the joined word
is known."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ocrwatch import plaintext
from ocrwatch.plaintext import PlainText, escape, join_hyphens
from tests.support.markdown_words import rendered_words, words

# Each line is a paragraph of its own or the line named; (text, escaped) pairs.
ESCAPES = [
    ("#", "\\#"),
    ("# Title", "\\# Title"),
    ("###### six", "\\###### six"),
    ("#7 is not a heading", "#7 is not a heading"),
    ("> quoted", "\\> quoted"),
    (">no space", "\\>no space"),
    ("- item", "\\- item"),
    ("+ item", "\\+ item"),
    ("* item", "\\* item"),
    ("-5 degrees", "-5 degrees"),
    # A numbered line is a list that shows it as written: escaped only where it would not.
    ("1. first", "1. first"),
    ("11. March 2023", "11. March 2023"),
    ("1986. The year", "1986. The year"),
    ("3) third", "3\\) third"),
    ("007. Agent", "007\\. Agent"),
    ("2. # not a heading", "2\\. # not a heading"),
    ("4. - not a bullet", "4\\. - not a bullet"),
    ("see page 11. Then", "see page 11. Then"),
    ("2.5 litres", "2.5 litres"),
    # Emphasis needs a run that opens and a later one that closes: a lone star is text.
    ("Gal**, Brendan Eich*", "Gal**, Brendan Eich*"),
    ("Price* incl. VAT", "Price* incl. VAT"),
    ("*Note: none", "*Note: none"),
    ("2*3 = 6", "2*3 = 6"),
    ("*a* and **b**", "\\*a\\* and \\*\\*b\\*\\*"),
    ("5 * 3 = 15", "5 * 3 = 15"),
    ("a*b*c", "a\\*b\\*c"),
    ("snake_case_name stays", "snake_case_name stays"),
    ("_emphasis_ here", "\\_emphasis\\_ here"),
    ("__init__", "\\_\\_init\\_\\_"),
    ("a _ b", "a _ b"),
    ("~~struck~~", "\\~\\~struck\\~\\~"),
    ("~/bin and ~user", "~/bin and ~user"),
    ("use `code` here", "use \\`code\\` here"),
    ("don`t", "don`t"),
    ("``a` b``", "\\`\\`a\\` b\\`\\`"),
    ("```", "\\`\\`\\`"),
    ("~~~", "\\~\\~\\~"),
    ("<lazy> fox", "\\<lazy> fox"),
    ("</p> end", "\\</p> end"),
    ("<!-- note -->", "\\<!-- note -->"),
    ("<http://example.org>", "\\<http://example.org>"),
    ("a < b and c<3", "a < b and c<3"),
    ("AT&T &amp; &#169; &copy;", "AT&T \\&amp; \\&#169; \\&copy;"),
    ("[label](http://x.org)", "\\[label](http://x.org)"),
    ("![alt](img.png)", "!\\[alt](img.png)"),
    ("[a][b]", "\\[a][b]"),
    ("[1]: http://x.org", "\\[1]: http://x.org"),
    ("see [1] and [2]", "see [1] and [2]"),
    ("C:\\dir\\file", "C:\\dir\\file"),
    ("back\\*slash", "back\\\\*slash"),
    ("back\\*slash*", "back\\\\\\*slash\\*"),
    ("ends in \\", "ends in \\\\"),
    ("a | b | c", "a | b | c"),
]


@pytest.mark.parametrize(("text", "expected"), ESCAPES)
def test_each_escape_where_it_acts_and_only_there(text: str, expected: str) -> None:
    assert escape(text) == expected
    assert rendered_words(expected) == words(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Heading above\n---", "Heading above\n\\---"),
        ("Heading above\n===", "Heading above\n\\==="),
        ("Heading above\n=", "Heading above\n\\="),
        ("rule\n- - -", "rule\n\\- - -"),
        ("***", "\\***"),
        ("___", "\\___"),
        ("name | value\n--- | ---\nx | 1", "name | value\n--- \\| ---\nx | 1"),
        ("| a |\n|:-:|", "| a |\n\\|:-:\\|"),
        # An ordered list interrupts a paragraph only from 1 with text after it; its items after
        # the first show the next number, whatever is written.
        ("the year\n1986. went on", "the year\n1986. went on"),
        ("the list\n1. went on", "the list\n1. went on"),
        ("the list\n1) went on", "the list\n1\\) went on"),
        ("the list\n1.", "the list\n1."),
        ("11. March\n12. April\nand May", "11. March\n12. April\nand May"),
        ("11. March\n11. April", "11. March\n11\\. April"),
        ("11. March\nrain\n13. April", "11. March\nrain\n13\\. April"),
        ("11. March\n3) April", "11. March\n3\\) April"),
        ("it *spans\ntwo* lines", "it \\*spans\ntwo\\* lines"),
        ("a [link\ntext](http://x.org)", "a \\[link\ntext](http://x.org)"),
        ("    indented four\n\n    again", "indented four\n\nagain"),
        ("hard  \nbreak", "hard\nbreak"),
    ],
)
def test_escapes_that_depend_on_the_lines_around(text: str, expected: str) -> None:
    assert escape(text) == expected
    assert rendered_words(expected) == words(text)


def test_made_up_page_renders_as_its_words() -> None:
    """Every construct at once, unescaped it renders otherwise; escaped it reads word for word."""
    text = (
        "\n".join(text for text, _ in ESCAPES) + "\n\nTitle\n---\n\nname | value\n--- | ---\nx | 1"
    )
    assert rendered_words(text) != words(text)
    assert rendered_words(escape(text)) == words(text)


def test_paragraphs_stay_paragraphs() -> None:
    assert escape("one\ntwo\n\n\nthree\n  \nfour") == "one\ntwo\n\nthree\n\nfour"


def test_hyphen_joined_when_the_joined_word_is_known() -> None:
    assert join_hyphens("clear wa-\nter runs", {"water"}) == "clear water\nruns"
    assert join_hyphens("(wa-\nter),", {"water"}) == "(water),"
    assert join_hyphens("Wa-\nter is wet", {"water"}) == "Water\nis wet"


def test_hyphen_kept_when_the_joined_word_is_unknown() -> None:
    assert join_hyphens("a well-\nknown fact", {"water"}) == "a well-\nknown fact"
    assert join_hyphens("a well-\nknown fact", frozenset()) == "a well-\nknown fact"


def test_hyphen_kept_when_the_hyphenated_word_is_known_too() -> None:
    assert join_hyphens("a well-\nknown fact", {"wellknown", "well-known"}) == "a well-\nknown fact"


def test_page_words_decide_before_the_dictionary() -> None:
    page = "the water is cold; the wa-\nter is deep"
    assert join_hyphens(page) == "the water is cold; the water\nis deep"
    page = "a well-known fact, a well-\nknown name"
    assert join_hyphens(page, {"wellknown"}) == page


def test_hyphen_not_joined_across_paragraphs_or_onto_numbers() -> None:
    assert join_hyphens("wa-\n\nter", {"water"}) == "wa-\n\nter"
    assert join_hyphens("page 12-\n13 of", {"1213"}) == "page 12-\n13 of"
    assert join_hyphens("wa--\nter", {"water"}) == "wa--\nter"


def test_markdown_joins_then_escapes() -> None:
    text = "# of wa-\nter *cold*"
    made = plaintext.markdown(text, PlainText(frozenset({"water"})))
    assert made == "\\# of water\n\\*cold\\*"
    assert rendered_words(made) == ["#", "of", "water", "*cold*"]


def test_tessdata_folder_from_list_langs() -> None:
    listing = 'List of available languages in "/usr/share/tesseract-ocr/5/tessdata/" (3):\neng\n'
    assert plaintext.tessdata_dir(listing) == Path("/usr/share/tesseract-ocr/5/tessdata/")
    assert plaintext.tessdata_dir("") is None


def _tessdata() -> Path:
    if shutil.which("tesseract") is None or plaintext.tools_missing():
        pytest.skip("tesseract-ocr's combine_tessdata and dawg2wordlist are not installed")
    listing = subprocess.run(
        ["tesseract", "--list-langs"], capture_output=True, text=True, check=True
    )
    folder = plaintext.tessdata_dir(listing.stdout)
    assert folder is not None
    return folder


def test_wordlist_read_from_the_installed_traineddata() -> None:
    words = plaintext.wordlist(_tessdata(), "eng")
    assert len(words) > 100_000
    assert {"water", "well-known", "dictionary"} <= words
    assert "qxzvwk" not in words


def test_wordlist_joins_languages_and_ignores_missing_ones() -> None:
    folder = _tessdata()
    english = plaintext.wordlist(folder, "eng")
    if not (folder / "deu.traineddata").is_file():
        pytest.skip("tesseract-ocr-deu is not installed")
    both = plaintext.wordlist(folder, "deu+eng")
    assert english < both and "wasser" in both
    assert plaintext.wordlist(folder, "eng+nosuchlang") == english


def test_real_dictionary_joins_water_and_keeps_well_known() -> None:
    known = plaintext.wordlist(_tessdata(), "eng")
    text = "the wa-\nter and a well-\nknown fact"
    assert join_hyphens(text, known) == "the water\nand a well-\nknown fact"


CORPUS_PAGES = [
    "typewriter.png",
    "google-doc-document.pdf",
    "AutoCad_Diagram.pdf",
    "deepseek_show1.jpg",
]
"""A scan with line-break hyphens, and pages whose Tesseract text (5.3, eng) holds what Markdown
takes for syntax: ``*``, ``<...>``, ``#`` or a list marker at a line's start, ``_``, a line of
``-``."""


@pytest.mark.parametrize("name", CORPUS_PAGES)
def test_corpus_markdown_renders_as_the_recognised_words(
    corpus_dir: Path, manifest: list[dict[str, object]], tmp_path: Path, name: str
) -> None:
    """``ocrwatch ocr`` end to end: each page's Markdown, rendered, reads word for word as
    Tesseract's text with its line-break hyphens joined, and so does the whole Markdown sidecar."""
    known = plaintext.wordlist(_tessdata(), "eng")
    if not any(entry["file"] == name for entry in manifest):
        pytest.skip(f"{name} is not in this corpus")
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "ocrwatch",
        "ocr",
        "--engine",
        "tesseract",
        "--lang",
        "eng",
        "--out",
    ]
    proc = subprocess.run(
        [*command, str(out), str(corpus_dir / name)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads((out / f"{name}.json").read_text())
    expected: list[str] = []
    for page in data["pages"]:
        recognised = join_hyphens(page["raw"].strip(), known)
        assert rendered_words(page["markdown"]) == words(recognised), page["index"]
        expected += words(recognised)
    markdown = (out / f"{name}.md").read_text()
    assert rendered_words(markdown) == expected
    if name == "typewriter.png":  # "in-l liter kokend wa-" / "ter 1 dag laten weken"
        assert "kokend water\n" in markdown and "wa-" not in markdown
