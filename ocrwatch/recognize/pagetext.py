"""A PDF page's own text, taken instead of its OCR where it is good (``[[inbox]] text``).

``Pages`` is what the render workers call for each page of a document. With ``text = "ocr"``, or for
an image, it renders the page for the engine. Otherwise it first reads the page's own text:
``pdfcontent`` says, within its bounds, whether the page shows any text at all (a scan shows none
and costs no more), then ``pdftotext -f N -l N`` extracts it in a subprocess with the render
timeout, so a hostile page costs what rendering it would. ``layer`` takes any text the page has;
``auto`` takes it only where ``judge`` finds it good, or in a script the page's Tesseract languages
do not read (``missing_script``: OCR would make Latin gibberish of it; one warning a document names
the package), and renders the page for the engine otherwise. A page taken from its layer skips the
engine and the render, and its searchable PDF page keeps its own text (``textlayer``: ``own``).

``judge`` asks what Tesseract knows (``tessdata``): the letters of the page's languages' character
sets and the words of their word lists. A layer fails when it is mostly unreadable codes (a font
without a Unicode map: TAMReview's pages 2–5 show private-use codes), when its letters are ones its
languages lack, or when too few of its words are words. A taken page's text is plain text to the
assembler, escaped and its line-break hyphens joined as Tesseract's is (``plaintext``). Poppler's
reading order is taken, not ``-layout``: ``-layout`` sets two columns side by side on each line,
which Markdown interleaves; a taken page's blocks are then put in the order a reader reads them
(``readingorder``), their boxes read by ``pdftotext -bbox-layout``.
"""

from __future__ import annotations

import math
import os
import re
import selectors
import subprocess
import threading
import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pikepdf
import structlog

from ocrwatch import plaintext
from ocrwatch.config import Config, TextMode
from ocrwatch.engines import registry
from ocrwatch.engines.base import Recognition
from ocrwatch.infra import children
from ocrwatch.infra.memory import DecodeBudget
from ocrwatch.pages import osd, pdfcontent, readingorder, render
from ocrwatch.pages.scheduler import Checked, PageOutcome
from ocrwatch.recognize import ladder, tessdata
from ocrwatch.sources.base import LocalFile, Origin

log = structlog.get_logger()

MIN_CHARACTERS = 20
"""Letters and digits a layer needs to be judged: fewer (a page number, a stamp on a scan) tell
nothing of the page, whose OCR is cheap then."""

MIN_READABLE = 0.9
"""Share of a layer's characters that must be readable: neither private-use nor unassigned codes,
controls or U+FFFD, which a font without a Unicode map gives (TAMReview's pages: 6–16 % readable).
A few such codes are the pieces of large brackets a math font draws."""

MIN_ALPHANUMERIC = 0.5
"""Share of the characters (dot leaders left out) that must be letters or digits: a layer of
punctuation alone is a font poppler could not map (its letters lost)."""

MIN_KNOWN_LETTERS = 0.95
"""Share of the letters that an installed language's character set must hold: a symbol font
mapped onto Latin Extended and Greek letters fails, a page with a few Greek formulas passes."""

MIN_KNOWN_WORDS = 0.5
"""Share of the words' letters in words the page's languages know: the corpus's born-digital
English pages score 0.93–1.0 (names and terms are the rest), its German ones 0.7–1.0 with
``deu``; words run together or letters read as others (a wrong encoding) score near 0."""

MIN_PART = 4
"""Letters of each part of a compound ``_known`` accepts: shorter parts would let words run
together (``thecommittee``) pass."""

MIN_WORD_LETTERS = 40
"""Letters in words below which the word test is not made (a table of figures, a CJK page)."""

MAX_TEXT_BYTES = 4 * 1024 * 1024
"""What pdftotext may write for one page: a dense page of text is some ten kilobytes, and a page
past this is a content bomb's (``text_too_large``: OCR'd within the renderer's bounds)."""

MAX_LAYOUT_BYTES = 2 * MAX_TEXT_BYTES
"""What ``pdftotext -bbox-layout`` may write for one page to order its blocks: some twenty times
its text (each word's box), a hundred kilobytes for a dense page; a page past it keeps poppler's
order."""

REASONS = (
    "good",
    "asked",
    "script_not_installed",
    "script_not_in_lang",
    "no_text",
    "little_text",
    "unreadable_codes",
    "unmapped_font",
    "unknown_letters",
    "unknown_words",
    "no_dictionary",
    pdfcontent.CONTENT_TOO_LARGE,
    pdfcontent.FORMS_TOO_DEEP,
    "unreadable_pdf",
    "extraction_failed",
    "extraction_timeout",
    "text_too_large",
)
"""Every ``TextCheck.reason``: the first four take the layer (``TAKEN``), the others OCR it."""

TAKEN = REASONS[:4]

SCRIPTS: dict[str, tuple[str, str]] = {
    "CJK": ("chi_sim", "tesseract-ocr-chi-sim"),
    "HIRAGANA": ("jpn", "tesseract-ocr-jpn"),
    "KATAKANA": ("jpn", "tesseract-ocr-jpn"),
    "HANGUL": ("kor", "tesseract-ocr-kor"),
    "ARABIC": ("ara", "tesseract-ocr-ara"),
    "HEBREW": ("heb", "tesseract-ocr-heb"),
    "DEVANAGARI": ("hin", "tesseract-ocr-hin"),
    "BENGALI": ("ben", "tesseract-ocr-ben"),
    "TAMIL": ("tam", "tesseract-ocr-tam"),
    "THAI": ("tha", "tesseract-ocr-tha"),
    "ARMENIAN": ("hye", "tesseract-ocr-hye"),
    "GEORGIAN": ("kat", "tesseract-ocr-kat"),
}
"""A script (the first word of its letters' Unicode names) and the Tesseract language, with the
Debian package that installs it, that reads it: a layer in one of them, where that language is
not installed, is kept (``script_not_installed``) rather than OCR'd into Latin gibberish. Greek
and Cyrillic are left out: a Latin font's wrong map lands on their letters as often as real text
does (``unknown_letters``)."""

MIN_ONE_SCRIPT = 0.9
"""Share of a layer's unknown letters that one script of ``SCRIPTS`` must hold for the layer to be
taken as text in that script: a symbol font mapped onto letters spreads them over Latin Extended
and Greek."""

_LEADERS = re.compile(r"(?:[.·…_\-–—]\s*){4,}")
_WORD = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)*")
_UNREADABLE = {"Co", "Cn", "Cs", "Cc"}
_UNSPACED = ("CJK", "HIRAGANA", "KATAKANA", "THAI", "LAO", "KHMER", "MYANMAR", "TIBETAN")
"""Scripts written without spaces between words: a run of them is no word, so only the letter test
judges them."""


@dataclass(frozen=True)
class TextCheck:
    """What the text check found: the text to take (None: OCR the page) and why."""

    text: str | None
    reason: str
    known_words: float | None = None
    seconds: float = 0.0
    package: str | None = None

    def record(self) -> dict[str, Any]:
        """The JSON's ``text_check`` (``package`` only where the layer's script wants one)."""
        words = None if self.known_words is None else round(self.known_words, 3)
        found = {"reason": self.reason, "known_words": words, "seconds": round(self.seconds, 4)}
        return {**found, "package": self.package} if self.package else found


class Knowledge(Protocol):
    """What ``judge`` asks of Tesseract: the installed languages, the letters and the words of its
    languages ``lang`` (``deu+eng``; None where none can be read)."""

    def languages(self) -> frozenset[str]: ...

    def letters(self, lang: str) -> frozenset[str] | None: ...

    def words(self, lang: str) -> frozenset[str] | None: ...


def judge(text: str, knowledge: Knowledge, lang: str) -> tuple[str, float | None]:
    """Whether ``text`` stands for the page read in ``lang``: ``("good", share of known words)``,
    or the reason it does not. Its letters are judged by ``lang``'s alone, as OCR in ``lang`` could
    read no others. Compared in NFKC, so a ligature (ﬁ) is its letters."""
    folded = _LEADERS.sub(" ", unicodedata.normalize("NFKC", text))
    marks = [c for c in folded if not c.isspace()]
    unreadable = sum(1 for c in marks if unicodedata.category(c) in _UNREADABLE or c == "\ufffd")
    if len(marks) >= MIN_CHARACTERS and unreadable > (1 - MIN_READABLE) * len(marks):
        return "unreadable_codes", None
    alphanumeric = sum(1 for c in marks if c.isalnum())
    if alphanumeric < MIN_CHARACTERS:
        return "little_text", None
    if alphanumeric < MIN_ALPHANUMERIC * len(marks):
        return "unmapped_font", None
    known = knowledge.letters(lang)
    if known is None:
        return "no_dictionary", None
    letters = [c for c in marks if c.isalpha()]
    if sum(1 for c in letters if c not in known) > (1 - MIN_KNOWN_LETTERS) * len(letters):
        return "unknown_letters", None
    words = [w for w in _WORD.findall(folded.replace("’", "'")) if len(w) > 1 and _spaced(w)]
    total = sum(len(w) for w in words)
    if total < MIN_WORD_LETTERS:
        return "good", None
    vocabulary = knowledge.words(lang)
    if vocabulary is None:
        return "no_dictionary", None
    share = sum(len(w) for w in words if _known(w, vocabulary)) / total
    return ("good" if share >= MIN_KNOWN_WORDS else "unknown_words"), share


def missing_script(text: str, known: frozenset[str]) -> tuple[str, str] | None:
    """The Tesseract language and its package that would read ``text``'s letters, where
    ``MIN_ONE_SCRIPT`` of those ``known`` lacks are of one script of ``SCRIPTS`` (kana make CJK
    Japanese); None where they are not."""
    scripts: dict[str, int] = {}
    unknown = 0
    for c in unicodedata.normalize("NFKC", text):
        if c.isalpha() and c not in known:
            unknown += 1
            script = unicodedata.name(c, "").split(" ", 1)[0]
            scripts[script] = scripts.get(script, 0) + 1
    if "HIRAGANA" in scripts or "KATAKANA" in scripts:
        scripts["HIRAGANA"] = sum(scripts.pop(name, 0) for name in ("HIRAGANA", "KATAKANA", "CJK"))
    found = max(
        (name for name in scripts if name in SCRIPTS), key=scripts.__getitem__, default=None
    )
    if found is None or scripts[found] < MIN_ONE_SCRIPT * unknown:
        return None
    return SCRIPTS[found]


def _spaced(word: str) -> bool:
    return not any(unicodedata.name(c, "").startswith(_UNSPACED) for c in word[:1])


def _known(word: str, vocabulary: frozenset[str]) -> bool:
    """A word the list has, before an apostrophe too (``committee's``), or a compound of two it
    has of ``MIN_PART`` letters or more, joined by a linking ``s`` or not (``Fundamentalgruppe``,
    ``Gruppenoperationen``): German writes its compounds as one word, the list holds few."""
    lower = word.lower()
    if lower in vocabulary or lower.split("'", 1)[0] in vocabulary:
        return True
    for cut in range(MIN_PART, len(lower) - MIN_PART + 1):
        head, tail = lower[:cut], lower[cut:]
        linked = head[-1] == "s" and head[:-1] in vocabulary
        if tail in vocabulary and (head in vocabulary or linked):
            return True
    return False


def check(
    path: Path,
    index: int,
    mode: TextMode,
    lang: str,
    knowledge: Knowledge,
    *,
    budget: DecodeBudget,
    timeout: float,
) -> TextCheck:
    """Page ``index``'s own text, and whether to take it (``mode`` ``auto`` or ``layer``), judged
    by the languages OCR would read it in: ``lang``, or for ``osd.AUTO`` the installed Latin ones,
    then those of the layer's own script where it is of another."""
    started = time.perf_counter()
    text, reason = _extract(path, index, budget, timeout)
    package, known = None, None
    if text is not None and mode == "layer":
        reason = "asked" if text.strip() else "no_text"
    elif text is not None:
        reason, known, package = _judged(text, knowledge, lang)
    taken = text if reason in TAKEN else None
    if taken:
        taken = _in_reading_order(path, index, taken, timeout - (time.perf_counter() - started))
    seconds = time.perf_counter() - started
    return TextCheck(taken, reason, known if text is not None else None, seconds, package)


def _judged(text: str, knowledge: Knowledge, lang: str) -> tuple[str, float | None, str | None]:
    """``judge``'s answer for a layer OCR would read in ``lang``, and the package of the language
    of its script where OCR cannot read that script. A layer of a script ``lang`` does not read is
    kept, never traded for Latin gibberish: ``script_not_installed`` where no installed language
    reads it, ``script_not_in_lang`` where one does but ``lang`` does not name it."""
    judged = judged_in(lang, knowledge)
    reason, known = judge(text, knowledge, judged)
    letters = knowledge.letters(judged) if reason == "unknown_letters" else None
    wanted = missing_script(text, letters) if letters is not None else None
    if wanted is None:
        return reason, known, None
    script_lang, package = wanted
    if script_lang not in knowledge.languages():
        return "script_not_installed", None, package
    if lang != osd.AUTO:
        return "script_not_in_lang", None, package
    reason, known = judge(text, knowledge, f"{script_lang}+{osd.FALLBACK}")
    return reason, known, None


def judged_in(lang: str, knowledge: Knowledge) -> str:
    """The languages a layer's words are judged in: ``lang``, or for ``osd.AUTO``, before any
    page's script is known, every installed Latin one (``osd.latin``)."""
    return osd.latin(knowledge.languages()) if lang == osd.AUTO else lang


def _extract(
    path: Path, index: int, budget: DecodeBudget, timeout: float
) -> tuple[str | None, str]:
    """The page's text, or None and why there is none to take."""
    try:
        with pikepdf.Pdf.open(path) as pdf:
            drawn = pdfcontent.read_page(pdf.pages[index], budget)
    except (pikepdf.PdfError, pikepdf.PasswordError, IndexError) as exc:
        log.info("text_layer_unread", page=index + 1, error=str(exc))
        return None, "unreadable_pdf"
    if drawn.refused is not None:
        return None, drawn.refused
    if not drawn.text:
        return None, "no_text"
    number = str(index + 1)
    argv = ["pdftotext", "-q", "-enc", "UTF-8", "-f", number, "-l", number]
    argv += [os.path.abspath(path), "-"]
    try:
        out = _bounded(argv, timeout, MAX_TEXT_BYTES)
    except subprocess.TimeoutExpired:
        log.warning("text_layer_timeout", page=index + 1, seconds=timeout)
        return None, "extraction_timeout"
    except OSError as exc:
        log.warning("text_layer_unread", page=index + 1, error=f"pdftotext: {exc}")
        return None, "extraction_failed"
    if out is None:
        log.warning("text_layer_too_large", page=index + 1, limit=MAX_TEXT_BYTES)
        return None, "text_too_large"
    return out.decode("utf-8", "replace"), "good"


def _in_reading_order(path: Path, index: int, text: str, timeout: float) -> str:
    """``text`` (poppler's of page ``index``) with its blocks in reading order (``readingorder``),
    their boxes read by ``pdftotext -bbox-layout`` within what is left of the timeout; poppler's
    order where they cannot be read."""
    number = str(index + 1)
    argv = ["pdftotext", "-q", "-enc", "UTF-8", "-bbox-layout", "-f", number, "-l", number]
    try:
        out = _bounded([*argv, os.path.abspath(path), "-"], max(timeout, 0.001), MAX_LAYOUT_BYTES)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.info("text_layer_unordered", page=index + 1, error=str(exc) or type(exc).__name__)
        return text
    if out is None:
        log.info("text_layer_unordered", page=index + 1, error="too many words to order")
        return text
    arranged = readingorder.arrange(text, readingorder.parse(out.decode("utf-8", "replace")))
    if arranged is None:
        log.info("text_layer_unordered", page=index + 1, error="its words and blocks differ")
    return text if arranged is None else arranged


def _bounded(argv: list[str], timeout: float, limit: int) -> bytes | None:
    """The child's stdout, read as it comes: None (the child killed) past ``limit`` bytes, whatever
    the page's content made it write; TimeoutExpired past ``timeout``; OSError when it fails."""
    deadline = time.monotonic() + timeout
    chunks: list[bytes] = []
    size = 0
    with (
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as process,
        children.tracked(process),
        selectors.DefaultSelector() as selector,
    ):
        assert process.stdout is not None
        selector.register(process.stdout, selectors.EVENT_READ)
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    raise subprocess.TimeoutExpired(argv, timeout)
                chunk = os.read(process.stdout.fileno(), 1 << 16)
                if not chunk:
                    break
                size += len(chunk)
                if size > limit:
                    return None
                chunks.append(chunk)
            if process.wait(max(deadline - time.monotonic(), 0.001)) != 0:
                raise OSError(f"exited {process.returncode}")
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    return b"".join(chunks)


def markdown(text: str) -> str:
    """The layer's text as the page's Markdown: its lines in reading order, paragraphs
    (poppler's blocks) apart by one blank line."""
    lines = [line.rstrip() for line in text.replace("\f", "\n").splitlines()]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def text_mode(cfg: Config, origin: Origin, asked: TextMode | None, engine: str) -> TextMode:
    """The job's text mode: asked (``ocrwatch ocr --text``), else its inbox's ``text``, else the
    default the engine states (``EngineSpec.text``)."""
    if asked is not None:
        return asked
    if isinstance(origin, LocalFile):
        for inbox in cfg.inbox:
            if inbox.text is not None and inbox.path.expanduser().resolve() == origin.inbox:
                return inbox.text
    return registry.find(engine).text


def pages(
    cfg: Config,
    origin: Origin,
    copy: render.Spooled,
    asked: TextMode | None,
    engine: str,
    lang: str | None,
    budget: DecodeBudget,
    observe: Callable[[float], None],
    job_id: str,
) -> Pages:
    """The page maker for the job ``job_id`` of ``origin`` read by ``engine`` in Tesseract's
    languages ``lang`` (None: ``[engine.tesseract] lang``; ``auto``: a layer's words are judged by
    every installed Latin language's); ``asked``: ``ocrwatch ocr --text``."""
    tess = cfg.engine.tesseract
    mode = text_mode(cfg, origin, asked, engine)
    return Pages(
        copy.path,
        copy.info,
        copy.spec,
        mode,
        lang or tess.lang,
        tessdata.shared(tess.binary),
        budget,
        observe,
        job_id,
        origin.uri,
    )


@dataclass(frozen=True)
class Pages:
    """A document's page maker for the render workers (``recognition.PageMaker``): each page
    rendered, or its own text checked first and taken where it stands for its recognition.
    ``observe`` is told each render's seconds. A worker's log lines carry the document's ``job_id``
    and ``uri``, as its other lines do: a worker thread has none of the job's context."""

    path: Path
    info: render.DocumentInfo
    spec: render.RenderSpec
    mode: TextMode
    lang: str
    knowledge: Knowledge
    budget: DecodeBudget
    observe: Callable[[float], None]
    job_id: str
    uri: str
    warned: set[str] = field(default_factory=set, compare=False)
    warned_lock: threading.Lock = field(default_factory=threading.Lock, compare=False)

    def __call__(self, index: int) -> render.RenderedPage | Checked:
        with structlog.contextvars.bound_contextvars(job_id=self.job_id, uri=self.uri):
            return self._page(index)

    def _page(self, index: int) -> render.RenderedPage | Checked:
        if self.mode == "ocr" or self.info.kind != "pdf":
            return self._render(index)
        found = check(
            self.path,
            index,
            self.mode,
            self.lang,
            self.knowledge,
            budget=self.budget,
            timeout=self.spec.timeout_seconds,
        )
        log.debug("text_checked", page=index + 1, reason=found.reason, seconds=found.seconds)
        if found.package is not None:
            self._warn_once(found.reason, found.package)
        if found.text is None:
            return Checked(found.record(), self._render(index))
        return Checked(found.record(), taken=self._taken(index, found))

    def _warn_once(self, reason: str, package: str) -> None:
        """One warning a document for each language pack its layers want: the pages are kept
        from their own text, and OCR in its languages could not read them."""
        with self.warned_lock:
            if package in self.warned:
                return
            self.warned.add(package)
        fix = (
            f"install {package}"
            if reason == "script_not_installed"
            else f'name the language {package} installs in lang, or set lang = "auto",'
        )
        log.warning(
            f"text_layer_{reason}",
            package=package,
            hint=f"its own text is kept; {fix} to have such pages OCR'd",
        )

    def _render(self, index: int) -> render.RenderedPage:
        page = render.render_page(self.path, self.info, index, self.spec, budget=self.budget)
        self.observe(page.seconds)
        return page

    def _taken(self, index: int, found: TextCheck) -> PageOutcome:
        """The page as its layer reads, sized as it would have been rendered (the JSON's pixels)."""
        assert found.text is not None
        width_pt, height_pt = self.info.page_sizes[index]
        dpi = render.page_dpi(width_pt, height_pt, self.spec)
        text = markdown(found.text)
        words = self.knowledge.words(judged_in(self.lang, self.knowledge))
        plain = plaintext.PlainText(words or frozenset())
        recognition = Recognition(markdown=text, raw=found.text, seconds=found.seconds, plain=plain)
        result = ladder.PageResult("ok", recognition, [])
        width, height = (max(1, math.ceil(side * dpi / 72)) for side in (width_pt, height_pt))
        return PageOutcome(
            index, width, height, dpi, 0.0, result, text_source="layer", text_check=found.record()
        )
