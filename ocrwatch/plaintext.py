"""Plain engine text as Markdown that renders as it reads: syntax characters escaped, line-break
hyphens joined.

An engine whose text is plain (Tesseract) says so with ``PlainText`` on its ``Recognition``; the
assembler then turns that text into Markdown here. Escaping is by CommonMark's rules (and GFM's
tables and strikethrough): a character is escaped only where a renderer would take it for syntax, so
ordinary text stays readable as it is. A word hyphenated across a line break (``wa-`` / ``ter``) is
joined where the joined word is known, elsewhere on the page or in the engine's dictionary, and its
hyphenated form is not; anything else keeps its hyphen.

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
_RULE = re.compile(r"(?:=[=\s]*|-[-\s]*|_[_\s]*|\*[*\s]*)$")  # setext underline or thematic break
_TABLE_DELIMITER = re.compile(r"[|:\-\s]*-[|:\-\s]*$")
_ENTITY = re.compile(r"&(?:[A-Za-z][A-Za-z0-9]{0,31}|#[0-9]{1,7}|#[xX][0-9A-Fa-f]{1,6});")
_LINK = re.compile(r"\]\s*[(\[]")
_REFERENCE = re.compile(r"\[[^\]]*\]:")


def escape(text: str) -> str:
    """Backslash-escape what CommonMark or GFM would read as syntax in ``text``: block markers at a
    line's start (``#``, ``>``, list markers, ``1.``, a line of ``-`` or ``=`` that would make the
    line above a heading), and inline ``*`` ``_`` ``~`` `````` ``\\`` ``<`` ``&`` ``[`` ``|`` where
    they would open or close something. Lines lose their leading and trailing blanks (no indented
    code, no hard breaks); paragraphs stay separated by blank lines."""
    paragraphs = []
    for paragraph in re.split(r"\n[ \t]*\n", text.strip()):
        lines = [line.strip() for line in paragraph.split("\n")]
        lines = [line for line in lines if line]
        if not lines:
            continue
        joined = "\n".join(lines)
        links = [match.start() for match in _LINK.finditer(joined)]
        offset, escaped = 0, []
        for number, line in enumerate(lines):
            later = [at - offset for at in links if at >= offset]
            escaped.append(_escape_line(line, first=number == 0, links=later))
            offset += len(line) + 1
        paragraphs.append("\n".join(escaped))
    return "\n\n".join(paragraphs)


def _escape_line(line: str, *, first: bool, links: list[int]) -> str:
    """One line; ``first``: it opens its paragraph (any ordered-list number acts there, elsewhere
    only a 1 with text after it); ``links``: where a ``](`` or ``][`` begins, from this line's start
    on."""
    marks: set[int] = set()
    if _HEADING.match(line) or _BULLET.match(line) or _RULE.match(line):
        marks.add(0)
    ordered = _ORDERED.match(line)
    if ordered and (
        first or (ordered.group(1).lstrip("0") == "1" and line[ordered.end() :].strip())
    ):
        marks.add(ordered.end() - 1)
    if _REFERENCE.match(line):
        marks.add(0)
    delimiter_row = "|" in line and _TABLE_DELIMITER.match(line) is not None
    entities = {match.start() for match in _ENTITY.finditer(line)}
    for index, char in enumerate(line):
        before = line[index - 1] if index else " "
        after = line[index + 1] if index + 1 < len(line) else " "
        if char == "\\":
            acts = after in _ASCII_PUNCTUATION or index + 1 == len(line)
        elif char == "`":
            acts = True
        elif char in "*~":
            acts = not (before.isspace() and after.isspace())
        elif char == "_":
            acts = not (before.isspace() and after.isspace()) and not (
                before.isalnum() and after.isalnum()
            )
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
