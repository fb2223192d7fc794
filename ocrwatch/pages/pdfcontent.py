"""What a PDF page draws, read within bounds: its content and the forms it invokes with ``Do``.

A page's resources may list forms it never draws, and a form of a few megabytes on disk may decode
to gigabytes (a Flate stream of zeros), so only what the page draws is read: its content, then each
form a ``Do`` in it names. Forms are taken from a work list, not by recursion (they may nest
thousands deep), each once (a form may draw itself), at most ``MAX_FORM_DEPTH`` deep and
``MAX_PAGE_BYTES`` decoded in all. A stream's decoded size is counted first, inflating it a chunk
at a time and keeping nothing; only a stream within the page's bound is then decoded whole, by
qpdf, within the process's ``DecodeBudget``. The decoded bytes are scanned for what matters here
(a string a text operator shows, a name ``Do`` draws) by a tokenizer that makes no object per
token, so its memory is the decoded bytes alone.
"""

from __future__ import annotations

import base64
import contextlib
import re
import zlib
from collections.abc import Callable, Container, Iterable, Iterator
from dataclasses import dataclass

import pikepdf
from pikepdf import Array, Dictionary, Name

from ocrwatch.infra.memory import UNBOUNDED, DecodeBudget

MiB = 1024 * 1024

MAX_PAGE_BYTES = 16 * MiB
"""Decoded content a page may draw, its forms' included: a page of dense text or drawing takes a
megabyte or less; one that takes more gets no text layer (``CONTENT_TOO_LARGE``). The scan is
linear in it: a fraction of a second for 16 MiB of drawing, some fifteen for the worst content."""

MAX_FORM_DEPTH = 64
"""Forms drawn within forms; a page whose forms nest deeper gets no text layer
(``FORMS_TOO_DEEP``)."""

FORM_BYTES = 4096
"""What each form drawn counts against ``MAX_PAGE_BYTES`` besides its content: looking it up costs
time too, so a page that draws a million tiny forms is bounded as well."""

CONTENT_TOO_LARGE = "content_too_large"
FORMS_TOO_DEEP = "forms_too_deep"

_CHUNK = MiB
"""Inflated at a time; also the decoded size below which a stream takes no place in the budget's
queue (a page's content is kilobytes, and must not wait behind a huge image)."""

_WS = rb"\x00\t\n\x0c\r "
_REGULAR = rb"[^\x00\t\n\x0c\r ()<>\[\]{}/%]"
_ENDS = rb"(?=[\x00\t\n\x0c\r ()<>\[\]{}/%]|\Z)"
# Where the scan stops: a comment; a string (an empty one is passed over), a simple one with the
# token after it; dictionary and array brackets; a name drawn by Do; the operator ID, which binary
# data follows. The rest (numbers, other names and operators) the regular expression engine skips.
_NEXT = re.compile(
    rb"%[^\r\n]*"
    + rb"|\(([^()\\]+)\)(?:["
    + _WS
    + rb"]*("
    + _REGULAR
    + rb"+)"
    + _ENDS
    + rb")?"
    + rb"|\((?!\))|<<|>>|<(?!>)[^>]*>?|\[|\]"
    + rb"|/("
    + _REGULAR
    + rb"*)["
    + _WS
    + rb"]+Do"
    + _ENDS
    + rb"|I(?<=[\x00\t\n\x0c\r )>\]}]I)D(?=["
    + _WS
    + rb"])"
)
_FOLLOWING = re.compile(rb"(?:[" + _WS + rb"]|%[^\r\n]*)*(" + _REGULAR + rb"+)" + _ENDS)
_HEX_DIGIT = re.compile(rb"[0-9A-Fa-f]")
_IMAGE_END = re.compile(rb"[" + _WS + rb"]EI" + _ENDS)
_NAME_ESCAPE = re.compile(rb"#([0-9A-Fa-f]{2})")
_SPACES = re.compile(rb"[" + _WS + rb"]")
_SHOW_STRING = (b"Tj", b"'", b'"')
_UNREADABLE = (pikepdf.PikepdfError, RuntimeError)  # a decoder of qpdf may raise either


@dataclass(frozen=True)
class Drawn:
    """What a page draws, as far as it was read: whether it shows text of its own, or why it could
    not be read within the bounds (``refused``, the reason the JSON records; ``detail`` for people).
    """

    text: bool
    refused: str | None = None
    detail: str = ""


def read_page(
    page: pikepdf.Page,
    budget: DecodeBudget = UNBOUNDED,
    limit: int = MAX_PAGE_BYTES,
    depth: int = MAX_FORM_DEPTH,
) -> Drawn:
    """Whether ``page`` shows text of its own (a text-showing operator with a non-empty string, in
    its content or in a form it draws), reading at most ``limit`` decoded bytes and forms at most
    ``depth`` deep."""
    contents = page.obj.get(Name.Contents)
    work: list[tuple[list[pikepdf.Stream], object, int]] = [
        (_streams(contents if isinstance(contents, Array) else [contents]), page.resources, 0)
    ]
    seen: set[tuple[int, int]] = set()
    spent = 0
    while work:
        streams, resources, level = work.pop()
        xobjects = resources.get(Name.XObject) if isinstance(resources, Dictionary) else None
        xobjects = xobjects if isinstance(xobjects, Dictionary) else Dictionary()
        sizes = [_decoded_size(stream, limit - spent) for stream in streams]
        decoded = sum(size for size in sizes if size is not None)
        spent += decoded
        if spent > limit:
            detail = f"the page draws more than {limit // MiB} MiB of decoded content"
            return Drawn(False, CONTENT_TOO_LARGE, detail)
        # qpdf's buffer, its copy as bytes, and the streams joined
        held = budget.hold(3 * decoded) if decoded > _CHUNK else contextlib.nullcontext()
        with held:
            readable = [
                stream for stream, size in zip(streams, sizes, strict=True) if size is not None
            ]
            data = b"\n".join(_decoded(stream) for stream in readable)
            shows, names = _scan(data, frozenset(xobjects.keys()))
            del data  # freed before the budget is
        if shows:
            return Drawn(True)
        for name in names:
            form = xobjects.get(name)
            if not isinstance(form, pikepdf.Stream) or form.get(Name.Subtype) != Name.Form:
                continue
            if form.objgen in seen:
                continue
            seen.add(form.objgen)
            if level + 1 > depth:
                detail = f"the page's forms are nested more than {depth} deep"
                return Drawn(False, FORMS_TOO_DEEP, detail)
            spent += FORM_BYTES
            # A form without resources of its own uses those of what draws it.
            work.append(([form], form.get(Name.Resources, resources), level + 1))
    return Drawn(False)


def _streams(objects: Iterable[object]) -> list[pikepdf.Stream]:
    return [stream for stream in objects if isinstance(stream, pikepdf.Stream)]


def _decoded(stream: pikepdf.Stream) -> bytes:
    """The stream as qpdf decodes it (RunLength is of its "specialized" filters); content qpdf
    cannot decode shows nothing a reader could extract either."""
    try:
        return stream.read_bytes(pikepdf.StreamDecodeLevel.specialized)
    except _UNREADABLE:
        return b""


# --- counting what a stream decodes to ------------------------------------------------------------


def _decoded_size(stream: pikepdf.Stream, limit: int) -> int | None:
    """The bytes ``stream`` decodes to, counted a chunk at a time and kept nowhere; more than
    ``limit`` once it passes it. None for a stream that no content filter decodes (an image
    codec's): it shows nothing. A predictor is not undone: it only shortens the data."""
    filters = stream.get(Name.Filter)
    names = list(filters) if isinstance(filters, Array) else [] if filters is None else [filters]
    try:
        chunks: Iterable[bytes] = (stream.read_raw_bytes(),)  # decrypted, still encoded
    except _UNREADABLE:
        return None
    for name in names:
        stage = _STAGES.get(str(name))
        if stage is None:
            return None
        chunks = stage(chunks)
    total = 0
    for chunk in chunks:
        total += len(chunk)
        if total > limit:
            break
    return total


def _inflate(chunks: Iterable[bytes]) -> Iterator[bytes]:
    inflater = zlib.decompressobj()
    try:
        for data in chunks:
            while data and not inflater.eof:
                out = inflater.decompress(data, _CHUNK)
                yield out
                data = inflater.unconsumed_tail
                while len(out) == _CHUNK and not data and not inflater.eof:  # zlib holds more
                    out = inflater.decompress(b"", _CHUNK)
                    yield out
    except zlib.error:  # damaged: what came before it is what any reader gets
        return


def _ascii_hex(chunks: Iterable[bytes]) -> Iterator[bytes]:
    pending = b""
    for chunk in chunks:
        end = chunk.find(b">")
        digits = pending + _SPACES.sub(b"", chunk if end < 0 else chunk[:end])
        whole = len(digits) // 2 * 2
        try:
            yield bytes.fromhex(digits[:whole].decode("ascii"))
        except ValueError:
            return
        pending = digits[whole:]
        if end >= 0:
            break
    try:
        yield bytes.fromhex((pending + b"0").decode("ascii")) if pending else b""
    except ValueError:
        return


def _ascii85(chunks: Iterable[bytes]) -> Iterator[bytes]:
    pending = b""
    for chunk in chunks:
        end = chunk.find(b"~>")
        data = pending + _SPACES.sub(b"", chunk if end < 0 else chunk[:end]).replace(b"z", b"!!!!!")
        whole = len(data) if end >= 0 else len(data) // 5 * 5
        try:
            yield base64.a85decode(data[:whole])
        except ValueError:
            return
        pending = data[whole:]
        if end >= 0:
            return
    try:
        yield base64.a85decode(pending)
    except ValueError:
        return


def _run_length(chunks: Iterable[bytes]) -> Iterator[bytes]:
    pending = b""
    for chunk in chunks:
        data, out, at = pending + chunk, bytearray(), 0
        while at < len(data):
            length = data[at]
            if length == 128:
                yield bytes(out)
                return
            step = length + 2 if length < 128 else 2
            if at + step > len(data):
                break
            if length < 128:
                out += data[at + 1 : at + step]
            else:
                out += data[at + 1 : at + 2] * (257 - length)
            at += step
            if len(out) >= _CHUNK:
                yield bytes(out)
                out = bytearray()
        pending = data[at:]
        yield bytes(out)


def _lzw(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """PDF's LZW, with its default early change of the code width."""
    table: list[bytes] = []
    width, bits, count, previous = 9, 0, 0, b""

    def reset() -> None:
        nonlocal width, previous
        table[:] = [bytes([code]) for code in range(256)] + [b"", b""]
        width, previous = 9, b""

    reset()
    for chunk in chunks:
        out = bytearray()
        for byte in chunk:
            bits, count = (bits << 8) | byte, count + 8
            while count >= width:
                count -= width
                code, bits = bits >> count, bits & ((1 << count) - 1)
                if code == 256:
                    reset()
                    continue
                if code == 257 or code > len(table) or (code == len(table) and not previous):
                    yield bytes(out)
                    return
                entry = table[code] if code < len(table) else previous + previous[:1]
                if previous and len(table) < 4096:
                    table.append(previous + entry[:1])
                out += entry
                previous = entry
                width = min(12, max(width, (len(table) + 1).bit_length()))
            if len(out) >= _CHUNK:
                yield bytes(out)
                out = bytearray()
        yield bytes(out)


def _decrypted(chunks: Iterable[bytes]) -> Iterator[bytes]:
    yield from chunks  # qpdf decrypts the raw bytes already


_STAGES: dict[str, Callable[[Iterable[bytes]], Iterator[bytes]]] = {
    "/FlateDecode": _inflate,
    "/Fl": _inflate,
    "/ASCIIHexDecode": _ascii_hex,
    "/AHx": _ascii_hex,
    "/ASCII85Decode": _ascii85,
    "/A85": _ascii85,
    "/RunLengthDecode": _run_length,
    "/RL": _run_length,
    "/LZWDecode": _lzw,
    "/LZW": _lzw,
    "/Crypt": _decrypted,
}


# --- scanning decoded content ---------------------------------------------------------------------


def _scan(data: bytes, drawable: Container[str]) -> tuple[bool, list[str]]:
    """Whether ``data`` shows a non-empty string (``Tj``, ``'``, ``"``, or in an array ``TJ``
    shows), and the names of ``drawable`` it draws with ``Do``, each once, in order. An operand
    comes right before its operator, so each string and array is checked against the token after
    it."""
    names: dict[str, None] = {}
    pos, depth, array_shows = 0, 0, False
    while (match := _NEXT.search(data, pos)) is not None:
        token, pos = match.group(), match.end()
        lead = token[:1]
        if lead == b"(":
            if match.group(1) is not None:  # no parenthesis or escape inside
                shown, after = True, match.group(2) or _operator(data, pos)
            else:
                pos = _literal_end(data, pos)
                shown, after = True, _operator(data, pos)
        elif lead == b"<" and token != b"<<":
            shown, after = _HEX_DIGIT.search(token) is not None, _operator(data, pos)
        elif token == b"[":
            depth, array_shows = depth + 1, array_shows and depth > 0
            continue
        elif token == b"]":
            closed = depth and (depth := depth - 1) == 0
            if closed and array_shows and _operator(data, pos) == b"TJ":
                return True, list(names)
            continue
        elif lead == b"/":
            name = "/" + _NAME_ESCAPE.sub(_unescape, match.group(3)).decode("utf-8", "replace")
            if not depth and name in drawable:
                names[name] = None
            continue
        elif lead == b"I":  # binary data runs up to a whitespace and EI
            image_end = _IMAGE_END.search(data, pos)
            pos = image_end.end() if image_end else len(data)
            continue
        else:  # a comment, a dictionary's bracket
            continue
        if shown and depth:
            array_shows = True
        elif shown and after in _SHOW_STRING:
            return True, list(names)
    return False, list(names)


def _operator(data: bytes, pos: int) -> bytes | None:
    """The token right after ``pos`` when it is an operator or a number (regular characters)."""
    match = _FOLLOWING.match(data, pos)
    return match.group(1) if match else None


def _literal_end(data: bytes, pos: int) -> int:
    """Where the literal string opened just before ``pos`` ends: parentheses balanced, backslashes
    escaping. One step per closing parenthesis or escape, the bytes between them counted in C."""
    depth = 1
    while (close := data.find(b")", pos)) >= 0:
        escape = data.find(b"\\", pos, close)
        if escape >= 0:  # the escaped byte (a parenthesis, maybe) is no bracket
            depth += data.count(b"(", pos, escape)
            pos = escape + 2
            continue
        depth += data.count(b"(", pos, close) - 1
        pos = close + 1
        if depth == 0:
            return pos
    return len(data)


def _unescape(match: re.Match[bytes]) -> bytes:
    return bytes([int(match.group(1), 16)])
