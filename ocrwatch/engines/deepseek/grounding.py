"""DeepSeek-OCR's grounding output: its tags to page blocks and clean Markdown, and repetition
loops.

With the ``<|grounding|>`` prompt the model writes, for each layout block in reading order::

    <|ref|>LABEL<|/ref|><|det|>[[x1, y1, x2, y2], ...]<|/det|>
    the block's Markdown (a heading with its ``#``, a paragraph, an HTML ``<table>``,
    ``\\[ ... \\]``)

Coordinates lie on a 0-999 grid of the page (the official scripts scale by ``/ 999``). Image regions
(``image``; ``figure`` in some outputs) carry no text. Output read with
``skip_special_tokens=False`` keeps ``<｜end▁of▁sentence｜>`` and friends. A truncated or sampled
output may hold unclosed tags and garbled coordinates (full-width commas, a missing bracket), so
parsing here never raises: what cannot be read becomes a block without a bbox, and stray tag
fragments never reach the Markdown.

Everything here is pure: no I/O, no logging, safe to call from any thread.
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass
from typing import Any, Literal

GRID = 999
IMAGE_LABELS = frozenset({"image", "figure"})
KNOWN_LABELS = frozenset(
    {
        "title",
        "sub_title",
        "text",
        "table",
        "table_caption",
        "table_footnote",
        "image",
        "image_caption",
        "figure",
        "figure_title",
        "figure_caption",
        "equation",
        "formula",
        "code",
        "header",
        "footer",
        "page_header",
        "page_footer",
        "page_number",
        "footnote",
        "list",
        "reference",
        "abstract",
        "caption",
    }
)

# Special tokens the tokenizer leaves in when skip_special_tokens=False: the full-width DeepSeek
# ones (<｜end▁of▁sentence｜>) and ASCII ones other than the grounding tags this module parses.
_SPECIAL = r"<｜[^｜<>\n]{1,40}｜>|<\|(?!/?(?:ref|det)\|>)/?[A-Za-z_▁]{1,40}\|>"
_SPECIAL_RE = re.compile(_SPECIAL)
_REF_OPEN = "<|ref|>"
_LABEL_END_RE = re.compile(r"<\|/ref\|>|<\|det\|>|\n")
_DET_RE = re.compile(r"\s*<\|det\|>")
_DET_CLOSE = "<|/det|>"
_COORDS_PREFIX_RE = re.compile(r"[\s\d.,，、\-+\[\]［］]*")
_BOX_GROUP_RE = re.compile(r"\[([^\[\]]*)\]")
_NUMBER_SPLIT_RE = re.compile(r"[\s,;]+")
_LAYOUT_LABEL_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")
# Tag fragments that may survive in text: a det span (closed or not) with its coordinates, lone
# tags.
_STRAY_TAG_RE = re.compile(r"<\|det\|>[\s\d.,，、\-+\[\]［］]*(?:<\|/det\|>)?|<\|/?(?:ref|det)\|>")
_REF_PAIR_RE = re.compile(r"<\|ref\|>(.*?)<\|/ref\|>", re.DOTALL)
_BLANK_RUN_RE = re.compile(r"\n{3,}")
_TRAILING_SPACE_RE = re.compile(r"[ \t]+$", re.MULTILINE)
_LATEX_REPLACEMENTS = (("\\coloneqq", ":="), ("\\eqqcolon", "=:"))


@dataclass(frozen=True)
class ParsedPage:
    """One page's Markdown and its blocks (``type``, ``text``, ``bbox`` in page pixels or None)."""

    markdown: str
    blocks: list[dict[str, Any]]


def parse(
    raw: str,
    width: int,
    height: int,
    *,
    images: Literal["placeholder", "drop", "extract"] = "placeholder",
    page_index: int = 0,
) -> ParsedPage:
    """Turn one page of model output into blocks and Markdown; ``width``/``height`` are the page's
    pixels.

    A block spanning several boxes (a paragraph across columns) gets their union as ``bbox`` and all
    of them as ``boxes``. Image blocks get a ``name`` (``page-N-figure-K``, 1-based) that the
    Markdown placeholder ``![](page-N-figure-K)`` points to, so a sink can crop and store the region
    under it. Text before the first tag (or a whole output without tags, as from the "Free OCR."
    prompt) is one ``text`` block without a bbox.
    """
    text = _SPECIAL_RE.sub("", raw)
    blocks: list[dict[str, Any]] = []
    parts: list[str] = []
    figures = 0
    for label, coords, body in _segments(text):
        kind, body = _block_kind(label, clean_markdown(body))
        boxes = [_to_pixels(box, width, height) for box in _boxes(coords)]
        block: dict[str, Any] = {"type": kind, "text": body, "bbox": _union(boxes)}
        if len(boxes) > 1:
            block["boxes"] = boxes
        if kind in IMAGE_LABELS:
            figures += 1
            block["name"] = f"page-{page_index + 1}-figure-{figures}"
            # "extract": the assembler links the placeholder to the figure's file
            if images != "drop":
                parts.append(f"![]({block['name']})")
        if kind == "text" and not body and not boxes:
            continue
        blocks.append(block)
        if body:
            parts.append(body)
    return ParsedPage(markdown=clean_markdown("\n\n".join(parts)), blocks=blocks)


def clean_markdown(text: str) -> str:
    """Markdown fit for the sidecar: no special tokens or grounding tags, the model's LaTeX colon
    macros rewritten as the official scripts do, no trailing spaces, no runs of blank lines."""
    text = _SPECIAL_RE.sub("", text)
    text = _REF_PAIR_RE.sub(
        lambda m: "" if _is_layout_label(m.group(1).strip()) else m.group(1), text
    )
    text = _strip_stray_tags(text)
    for macro, replacement in _LATEX_REPLACEMENTS:
        text = text.replace(macro, replacement)
    text = _TRAILING_SPACE_RE.sub("", text.replace("\r\n", "\n"))
    return _BLANK_RUN_RE.sub("\n\n", text).strip("\n")


def _segments(text: str) -> list[tuple[str | None, str, str]]:
    """Split at each ``<|ref|>`` into (label, coordinates, body); the prefix has no label."""
    pieces = text.split(_REF_OPEN)
    segments: list[tuple[str | None, str, str]] = [(None, "", pieces[0])]
    for piece in pieces[1:]:
        end = _LABEL_END_RE.search(piece)
        if end is None:  # output cut off inside the label: nothing readable follows
            continue
        label, rest = piece[: end.start()].strip(), piece[end.start() :]
        if rest.startswith("<|/ref|>"):
            rest = rest[len("<|/ref|>") :]
        coords = ""
        det = _DET_RE.match(rest)
        if det is not None:
            rest = rest[det.end() :]
            close = rest.find(_DET_CLOSE)
            if close >= 0:
                coords, rest = rest[:close], rest[close + len(_DET_CLOSE) :]
            else:  # unclosed det: take what looks like coordinates, the rest is text
                prefix = _COORDS_PREFIX_RE.match(rest)
                cut = prefix.end() if prefix else 0
                coords, rest = rest[:cut], rest[cut:]
        segments.append((label, coords, rest))
    return segments


def _block_kind(label: str | None, body: str) -> tuple[str, str]:
    """The block type; a ref that holds text rather than a layout label (the "OCR this image."
    prompt grounds words and lines) is a text block whose text is the ref itself."""
    if label is None:
        return "text", body
    normal = label.strip().lower()
    if normal in KNOWN_LABELS or (body and _is_layout_label(normal)):
        return normal, body
    grounded = _strip_stray_tags(label).strip()
    return "text", f"{grounded} {body}".strip() if body else grounded


def _is_layout_label(label: str) -> bool:
    return label in KNOWN_LABELS or _LAYOUT_LABEL_RE.fullmatch(label) is not None


def _boxes(coords: str) -> list[tuple[float, float, float, float]]:
    """Every readable ``[x1, y1, x2, y2]`` group; unreadable groups are skipped, never guessed."""
    coords = unicodedata.normalize("NFKC", coords).replace("、", ",")
    if not coords.strip():
        return []
    groups = _BOX_GROUP_RE.findall(coords) or [coords]
    boxes = []
    for group in groups:
        numbers = [token for token in _NUMBER_SPLIT_RE.split(group.strip()) if token]
        if len(numbers) != 4:
            continue
        try:
            values = [float(token) for token in numbers]
        except ValueError:
            continue
        if all(math.isfinite(value) for value in values):
            boxes.append((values[0], values[1], values[2], values[3]))
    return boxes


def _to_pixels(box: tuple[float, float, float, float], width: int, height: int) -> list[int]:
    """Grid box to page pixels, clamped to the grid and ordered, as the official scripts scale
    it."""
    x1, y1, x2, y2 = (min(max(value, 0.0), GRID) for value in box)
    x1, x2 = sorted((x1, x2))
    y1, y2 = sorted((y1, y2))
    return [
        int(x1 / GRID * width),
        int(y1 / GRID * height),
        int(x2 / GRID * width),
        int(y2 / GRID * height),
    ]


def _union(boxes: list[list[int]]) -> list[int] | None:
    if not boxes:
        return None
    return [
        min(b[0] for b in boxes),
        min(b[1] for b in boxes),
        max(b[2] for b in boxes),
        max(b[3] for b in boxes),
    ]


def _strip_stray_tags(text: str) -> str:
    return _STRAY_TAG_RE.sub("", text)


# --- repetition loops -----------------------------------------------------------------------------


@dataclass(frozen=True)
class LoopInfo:
    """A repetition running to the end of the output.

    ``unit`` is one period of it (whitespace collapsed, tags removed), ``repeats`` how many periods
    the tail holds (fractional: the last copy is usually cut off), ``start`` the offset in the text
    where the repetition begins (``text[:start]`` is what came before it), ``chars`` how long the
    tail is.
    """

    unit: str
    repeats: float
    start: int
    chars: int


# Tags, special tokens and whitespace count as one space, so a loop that repeats a block with its
# tags, or a line with varying spaces, is still seen as periodic.
_LOOP_SKIP_RE = re.compile(
    rf"(?:{_SPECIAL}|<\|ref\|>[a-z_]{{1,32}}<\|/ref\|>|{_STRAY_TAG_RE.pattern}|\s)+"
)
_HEADER_MAX = 200  # a block header with a few boxes is well under this
# The start of a tag cut off by the end of the output ("<|re", "<|ref|>te", "...<|det|>[[100, 2").
_CUT_TAG_RE = re.compile(r"<(?:\|[a-z/]{0,4}\|?)?\Z")


def find_loop(
    text: str,
    *,
    min_chars: int = 240,
    min_repeats: float = 4.0,
    max_unit: int = 2000,
    window: int = 32000,
) -> LoopInfo | None:
    """The repetition loop at the end of ``text``, or None.

    A decoding loop never stops by itself, so only the tail is looked at: the shortest period ``p``
    with which the end of the text is exactly periodic, found for every ``p`` at once with the
    Z-function of the reversed text. It counts as a loop when the periodic tail is at least
    ``min_chars`` long and holds at least ``max(min_repeats, min_chars / p)`` copies, so a short
    unit needs many copies ("ha" 120 times) and a paragraph needs four. Legitimate repetition
    passes: table rows of different numbers break the period within a row; a table of identical rows
    still ends with ``</table>``; units without a single letter (dot leaders, rules, underscores for
    a form, pipes and zeros of an empty table) are ignored, since a model stuck on those is caught
    by ``finish_reason == "length"`` instead. Only the last ``window`` characters are examined,
    which bounds the cost (linear) on runaway output.
    """
    chars, offsets = _normalised_tail(text[: _complete_end(text)], window)
    n = len(chars)
    if n < min_chars:
        return None
    tail = "".join(chars)
    z = _z_function(tail[::-1])
    for period in range(1, min(max_unit, n // 2) + 1):
        length = z[period] + period
        repeats = length / period
        if length < min_chars or repeats < max(min_repeats, min_chars / period):
            continue
        first = n - length
        if not any(char.isalpha() for char in tail[first : first + period]):
            continue
        # Begin the loop at a word boundary within its first period, so the unit reads naturally,
        # and with the whitespace and tags before it, so text[:start] ends where the good output
        # ended.
        aligned = next(
            (i for i in range(first, first + period) if i == 0 or tail[i - 1] == " "), first
        )
        start = (
            offsets[aligned - 1] if aligned > 0 and tail[aligned - 1] == " " else offsets[aligned]
        )
        return LoopInfo(
            unit=tail[aligned : aligned + period].strip(),
            repeats=round((n - aligned) / period, 2),
            start=start,
            chars=len(text) - start,
        )
    return None


def _complete_end(text: str) -> int:
    """Where the text ends once a block header cut off by the end of the output is left out."""
    last_ref = text.rfind(_REF_OPEN)
    if last_ref >= 0 and len(text) - last_ref < _HEADER_MAX and _DET_CLOSE not in text[last_ref:]:
        return last_ref
    cut = _CUT_TAG_RE.search(text)
    return cut.start() if cut else len(text)


def _normalised_tail(text: str, window: int) -> tuple[list[str], list[int]]:
    """The last ``window`` characters with tags and whitespace runs collapsed to one space, trailing
    ones dropped, and for each kept character its offset in ``text``."""
    base = max(0, len(text) - window)
    chars: list[str] = []
    offsets: list[int] = []
    position = base
    for match in _LOOP_SKIP_RE.finditer(text, base):
        for index in range(position, match.start()):
            chars.append(text[index])
            offsets.append(index)
        if chars and chars[-1] != " ":
            chars.append(" ")
            offsets.append(match.start())
        position = match.end()
    for index in range(position, len(text)):
        chars.append(text[index])
        offsets.append(index)
    while chars and chars[-1] == " ":
        chars.pop()
        offsets.pop()
    return chars, offsets


def _z_function(s: str) -> list[int]:
    """z[i] = length of the longest common prefix of s and s[i:] (z[0] = len(s))."""
    n = len(s)
    z = [0] * n
    if n:
        z[0] = n
    left = right = 0
    for i in range(1, n):
        if i < right:
            z[i] = min(right - i, z[i - left])
        while i + z[i] < n and s[z[i]] == s[i + z[i]]:
            z[i] += 1
        if i + z[i] > right:
            left, right = i, i + z[i]
    return z
