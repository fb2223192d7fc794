"""Plain engine text as Markdown that renders as it reads: syntax characters escaped, line-break
hyphens joined.

An engine whose text is plain (Tesseract) says so with ``PlainText`` on its ``Recognition``; the
assembler then turns that text into Markdown here. Escaping is by CommonMark's rules (and GFM's
tables and strikethrough): a character is escaped only where a renderer would take it for syntax, so
ordinary text stays readable as it is (``11.`` opening a line stays: the list it makes shows it as
written; a lone ``*`` in running text stays: nothing can pair with it). A word hyphenated across a
line break (``wa-`` / ``ter``) is joined where the joined word is known, elsewhere on the page or in
the engine's dictionary, and its hyphenated form is not; anything else keeps its hyphen.

The dictionary is Tesseract's own word list, read out of a language's traineddata with
``combine_tessdata`` and ``dawg2wordlist`` (Debian's tesseract-ocr ships both), once per language
file per process.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import tempfile
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

WORDLIST_TIMEOUT = 60.0


@dataclass(frozen=True)
class PlainText:
    """An engine's statement that its text is plain, not Markdown; ``known``: its dictionary's
    words, lower case, which decide where a line-break hyphen is joined."""

    known: frozenset[str] = field(default_factory=frozenset, repr=False)


def markdown(text: str, plain: PlainText) -> str:
    """``text`` as Markdown whose rendering reads as the text: hyphens joined, then syntax
    escaped."""
    return escape(join_hyphens(text, plain.known))


# -- line-break hyphens

_LETTERS = r"[^\W\d_]+"
_BROKEN = re.compile(rf"({_LETTERS})-$")
_CONTINUED = re.compile(rf"^({_LETTERS})")
_EDGES = "\"'()[]{}<>.,;:!?«»„“”‘’*_`"


def _core(token: str) -> str:
    return token.strip(_EDGES).lower()


def join_hyphens(text: str, known: Iterable[str] = frozenset()) -> str:
    """Join each word broken by a hyphen at a line's end and continued on the next line of its
    paragraph, when the page or ``known`` knows the joined word and not the hyphenated one (the page
    asked first: it is the better witness of its own spelling). ``wa-`` / ``ter is`` becomes
    ``water`` / ``is``."""
    page = {_core(token) for token in text.split()}
    dictionary = known if isinstance(known, (set, frozenset)) else frozenset(known)

    def joins(prefix: str, suffix: str) -> bool:
        joined, hyphenated = (prefix + suffix).lower(), f"{prefix}-{suffix}".lower()
        for words in (page, dictionary):
            if hyphenated in words:
                return False
            if joined in words:
                return True
        return False

    paragraphs = []
    for paragraph in text.split("\n\n"):
        lines = [line.rstrip() for line in paragraph.split("\n")]
        index = 0
        while index < len(lines) - 1:
            head, _, last = lines[index].rpartition(" ")
            rest = lines[index + 1].lstrip().split(" ", 1)
            broken, continued = _BROKEN.search(last), _CONTINUED.match(rest[0])
            if (
                broken is None
                or continued is None
                or not joins(broken.group(1), continued.group(1))
            ):
                index += 1
                continue
            lines[index] = f"{head} {last[:-1]}{rest[0]}" if head else f"{last[:-1]}{rest[0]}"
            if len(rest) > 1 and rest[1].strip():
                lines[index + 1] = rest[1]
            else:
                del lines[index + 1]
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs)


# -- escaping

_ASCII_PUNCTUATION = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
_HEADING = re.compile(r"#{1,6}(?=\s|$)")
_BULLET = re.compile(r"[-+*>](?=\s|$)|>")
_ORDERED = re.compile(r"([0-9]{1,9})[.)](?=\s|$)")
_FENCE = re.compile(r"`{3,}|~{3,}")
_RULE = re.compile(r"(?:=[=\s]*|-[-\s]*|_[_\s]*|\*[*\s]*)$")  # setext underline or thematic break
_TABLE_DELIMITER = re.compile(r"[|:\-\s]*-[|:\-\s]*$")
_ENTITY = re.compile(r"&(?:[A-Za-z][A-Za-z0-9]{0,31}|#[0-9]{1,7}|#[xX][0-9A-Fa-f]{1,6});")
_LINK = re.compile(r"\]\s*[(\[]")
_REFERENCE = re.compile(r"\[[^\]]*\]:")
_DELIMITER_RUN = re.compile(r"\*+|_+|~+")
_CODE_RUN = re.compile(r"`+")


def escape(text: str) -> str:
    """Backslash-escape what CommonMark or GFM would read as syntax in ``text``, and only that:
    block markers at a line's start (``#``, ``>``, list bullets, a fence, a line of ``-`` or ``=``
    that would make the line above a heading; a numbered line only where the list would show
    another number or delimiter than the text, since ``11. March`` reads the same as a list), and
    inline ``*`` ``_`` ``~`` only where another run of the same character in the paragraph could
    pair with it, `````` where another run of backticks could close it, ``\\`` ``<`` ``&`` ``[``
    ``|`` where they would open or close something. Lines lose their leading and trailing blanks
    (no indented code, no hard breaks); paragraphs stay separated by blank lines."""
    paragraphs = []
    for paragraph in re.split(r"\n[ \t]*\n", text.strip()):
        lines = [line.strip() for line in paragraph.split("\n")]
        lines = [line for line in lines if line]
        if not lines:
            continue
        joined = "\n".join(lines)
        links = [match.start() for match in _LINK.finditer(joined)]
        inline = _pairs(joined)
        offset, escaped, numbered = 0, [], None
        for number, line in enumerate(lines):
            later = [at - offset for at in links if at >= offset]
            marks = {at - offset for at in inline if offset <= at < offset + len(line)}
            numbered = _list_number(line, marks, first=number == 0, numbered=numbered)
            escaped.append(_escape_line(line, marks, links=later))
            offset += len(line) + 1
        paragraphs.append("\n".join(escaped))
    return "\n\n".join(paragraphs)


def _list_number(line: str, marks: set[int], *, first: bool, numbered: int | None) -> int | None:
    """Mark a numbered line's delimiter where the list it would make shows other than the text: a
    ``)`` (shown as ``.``), a number written otherwise than the list counts it (``007.``, or
    ``13.`` where the list's next item is 12), or a line whose rest would open a block of its own
    in the item. A numbered line makes a list item when it opens its paragraph, follows an open
    list (a new list where its delimiter differs), or interrupts a paragraph as ``1.`` with text
    after it. ``numbered``: the number the open list's next item shows (None: no list open);
    returns it after this line."""
    ordered = _ORDERED.match(line)
    if ordered is None:
        return numbered  # a lazy continuation of the open item, if any
    digits, delimiter, rest = ordered.group(1), line[ordered.end() - 1], line[ordered.end() :]
    if not (first or numbered is not None or (digits.lstrip("0") == "1" and rest.strip())):
        return numbered
    shown = numbered if numbered is not None and delimiter == "." else int(digits)
    if delimiter == "." and digits == str(shown) and not _opens_block(rest):
        return shown + 1
    marks.add(ordered.end() - 1)
    return numbered


def _opens_block(rest: str) -> bool:
    """Whether a list item's text would open a block of its own: a heading, quote, list, fence or
    rule, or code indented past the item."""
    content = rest.lstrip(" ")
    return len(rest) - len(content) > 4 or any(
        pattern.match(content) for pattern in (_HEADING, _BULLET, _ORDERED, _FENCE, _RULE)
    )


def _pairs(text: str) -> set[int]:
    """Where in a paragraph's text an emphasis, strikethrough or code delimiter could act: each
    ``*`` ``_`` ``~`` run that can open (CommonMark's flanking rules) with a run of its character
    after it that can close, or close one that can open before it; every backtick where there are
    two runs of them or more (a code span needs an opening and a closing run)."""
    runs = []
    for match in _DELIMITER_RUN.finditer(text):
        start, end = match.span()
        before = text[start - 1] if start else " "
        after = text[end] if end < len(text) else " "
        left = not after.isspace() and (
            not _punctuation(after) or before.isspace() or _punctuation(before)
        )
        right = not before.isspace() and (
            not _punctuation(before) or after.isspace() or _punctuation(after)
        )
        if match.group()[0] == "_":
            opens = left and (not right or _punctuation(before))
            closes = right and (not left or _punctuation(after))
        else:
            opens, closes = left, right
        runs.append((match.group()[0], start, end, opens, closes))
    marks: set[int] = set()
    for index, (char, start, end, opens, closes) in enumerate(runs):
        paired = (opens and any(r[0] == char and r[4] for r in runs[index + 1 :])) or (
            closes and any(r[0] == char and r[3] for r in runs[:index])
        )
        if paired:
            marks.update(range(start, end))
    code = [match.span() for match in _CODE_RUN.finditer(text)]
    if len(code) > 1:  # a backslash inside a code span is text: every backtick goes
        marks.update(at for start, end in code for at in range(start, end))
    return marks


def _punctuation(char: str) -> bool:
    """CommonMark's punctuation: ASCII punctuation, and Unicode's punctuation and symbols."""
    return char in _ASCII_PUNCTUATION or unicodedata.category(char)[0] in "PS"


def _escape_line(line: str, marks: set[int], *, links: list[int]) -> str:
    """One line, with ``marks`` (where a list number or a pair already asks for a backslash);
    ``links``: where a ``](`` or ``][`` begins, from this line's start on."""
    if _HEADING.match(line) or _BULLET.match(line) or _RULE.match(line):
        marks.add(0)
    if fence := _FENCE.match(line):
        marks.update(range(fence.end()))
    if _REFERENCE.match(line):
        marks.add(0)
    delimiter_row = "|" in line and _TABLE_DELIMITER.match(line) is not None
    entities = {match.start() for match in _ENTITY.finditer(line)}
    for index, char in enumerate(line):
        after = line[index + 1] if index + 1 < len(line) else " "
        if char == "\\":
            acts = after in _ASCII_PUNCTUATION or index + 1 == len(line)
        elif char == "<":
            acts = after.isascii() and (after.isalpha() or after in "/!?")
        elif char == "&":
            acts = index in entities
        elif char == "[":
            acts = any(at > index for at in links)
        elif char == "|":
            acts = delimiter_row
        else:
            continue
        if acts:
            marks.add(index)
    return "".join(f"\\{char}" if index in marks else char for index, char in enumerate(line))


# -- the dictionary


def tessdata_dir(list_langs: str) -> Path | None:
    """The folder of the language data, from the first line of ``tesseract --list-langs``
    (``List of available languages in "/usr/share/tesseract-ocr/5/tessdata/" (3):``)."""
    found = re.search(r'"(.+)"', list_langs.splitlines()[0] if list_langs else "")
    return Path(found.group(1)) if found else None


def wordlist(tessdata: Path, lang: str) -> frozenset[str]:
    """The dictionary words (lower case) of Tesseract's languages ``lang`` (``deu+eng``), empty for
    a language without a word list or where the tools are not installed. Blocking (half a second a
    language, the first time); each language file is read once per process. Raises OSError or
    ``subprocess.SubprocessError`` when a tool fails to run."""
    words: set[str] = set()
    if tools_missing():
        return frozenset()
    for name in lang.split("+"):
        path = tessdata / f"{name}.traineddata"
        try:
            info = path.stat()
        except OSError:
            continue
        words |= _wordlist(path, info.st_mtime_ns, info.st_size)
    return frozenset(words)


def tools_missing() -> list[str]:
    """The Tesseract tools that reading a word list needs and this host lacks."""
    return [tool for tool in ("combine_tessdata", "dawg2wordlist") if shutil.which(tool) is None]


@functools.lru_cache(maxsize=16)
def _wordlist(path: Path, mtime_ns: int, size: int) -> frozenset[str]:
    """One traineddata file's words; its modification time and size in the key, so an updated
    package is read again."""
    with tempfile.TemporaryDirectory(prefix="ocrwatch-wordlist-") as folder:
        prefix = f"{folder}/lang."
        unpacked = subprocess.run(
            ["combine_tessdata", "-u", str(path), prefix],
            capture_output=True,
            timeout=WORDLIST_TIMEOUT,
        )
        if unpacked.returncode != 0:
            return frozenset()
        for dawg, unicharset in (
            ("lstm-word-dawg", "lstm-unicharset"),
            ("word-dawg", "unicharset"),
        ):
            if Path(prefix + dawg).is_file() and Path(prefix + unicharset).is_file():
                listed = subprocess.run(
                    ["dawg2wordlist", prefix + unicharset, prefix + dawg, f"{folder}/words"],
                    capture_output=True,
                    timeout=WORDLIST_TIMEOUT,
                )
                if listed.returncode == 0:
                    text = Path(f"{folder}/words").read_text(encoding="utf-8", errors="replace")
                    return frozenset(word.lower() for word in text.split())
    return frozenset()
