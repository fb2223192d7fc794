"""Documents to page images, lazily, one page at a time.

``probe`` decides what a file is from its content (magic bytes, then a parse probe: ``pdfinfo`` for
PDFs, the Pillow header for images), counts its pages and applies the size and page limits before
anything is rendered. ``render_page`` rasterises one page: PDFs through one ``pdftoppm`` run per
page at a DPI lowered where a page is too large for the caps, each run within a memory limit
(``child_memory``), images through Pillow (``imagepages``:
every TIFF frame, EXIF orientation applied, downscaled to the caps, and a DPI even where the file
records none); then each page is turned upright (``orientation``: ``[render] rotate_pages`` and
``deskew``). Both are blocking and meant for a worker thread; the heavy PDF work happens in a
subprocess with a deadline. Decoding is bounded twice: oversized images are refused before decoding
(an image file by its header, a PDF's images by their dictionaries: ``check_images``), and the
full-size images that workers hold at once are bounded by one shared ``DecodeBudget``.

Every failure is one of the specific errors in ``ocrwatch.errors``; no shell is ever involved, and
file names reach poppler as absolute paths, so spaces, non-ASCII and leading dashes are plain file
names.
"""

from __future__ import annotations

import importlib.util
import io
import math
import os
import re
import shutil
import stat
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Protocol

import structlog
from PIL import Image, UnidentifiedImageError

from ocrwatch.config import RenderConfig
from ocrwatch.errors import (
    ConfigError,
    CorruptPdf,
    DiskFull,
    EmptyFile,
    FileTooLarge,
    NoPages,
    NotADocument,
    NotARegularFile,
    OcrwatchError,
    RenderFailed,
    RenderMemoryExceeded,
    RenderTimeout,
    SourceGone,
    TooManyPages,
    TooManyPixels,
)
from ocrwatch.infra import children
from ocrwatch.infra.memory import UNBOUNDED, DecodeBudget
from ocrwatch.pages import orientation, pdfpixels, poppler
from ocrwatch.pages.imagepages import BAND_BYTES as BAND_BYTES  # re-exported: the text layer's too
from ocrwatch.pages.imagepages import (
    IMAGE_DECODE_FACTOR,
    DpiFrom,
    fit_size,
    fits,
    probe_image,
    render_image_page,
    shrink,
)
from ocrwatch.pages.renderspec import (
    DEFAULT_DPI as DEFAULT_DPI,
)
from ocrwatch.pages.renderspec import (  # re-exported: render's own names
    PDF_BYTES_PER_PIXEL as PDF_BYTES_PER_PIXEL,
)
from ocrwatch.pages.renderspec import (
    DocumentInfo as DocumentInfo,
)
from ocrwatch.pages.renderspec import (
    Geometry as Geometry,
)
from ocrwatch.pages.renderspec import (
    Limits as Limits,
)
from ocrwatch.pages.renderspec import (
    RenderedPage as RenderedPage,
)
from ocrwatch.pages.renderspec import (
    RenderSpec as RenderSpec,
)
from ocrwatch.sources.sniff import HEAD_BYTES, MIME, sniff

log = structlog.get_logger()

# pdfinfo only reads the cross-reference table and the page tree; the deadline exists so that a
# pathological file cannot hang the caller, not because a healthy probe ever comes near it.
PROBE_TIMEOUT_SECONDS = 60.0

_PDFINFO_PAGES = re.compile(r"^Pages:\s+(\d+)\s*$", re.MULTILINE)
_PDFINFO_SIZE = re.compile(r"^Page\s+(\d+) size:\s+([\d.]+) x ([\d.]+) pts", re.MULTILINE)
_PDFINFO_ROT = re.compile(r"^Page\s+(\d+) rot:\s+(-?\d+)", re.MULTILINE)
MiB = 1024 * 1024
CHILD_BASE_BYTES = 256 * MiB
"""What a pdftoppm child maps besides the images it decodes and its page: the program, its
libraries and fonts, the document's objects (30 to 60 MB for the corpus's pages)."""


def render_spec(cfg: RenderConfig, geometry: Geometry | None = None) -> RenderSpec:
    """``[render] dpi`` when set, else the engine's DPI, else ``DEFAULT_DPI``; the engine's geometry
    may only tighten the caps, so a page is never larger than the engine can use, whoever chose the
    DPI."""
    max_side, max_pixels = cfg.max_side, cfg.max_pixels
    dpi = DEFAULT_DPI
    if geometry is not None:
        max_side = min(max_side, geometry.max_side or max_side)
        max_pixels = min(max_pixels, geometry.max_pixels or max_pixels)
        dpi = geometry.dpi
    if isinstance(cfg.dpi, int):  # else "auto"
        dpi = cfg.dpi
    return RenderSpec(
        dpi=float(dpi),
        max_side=max_side,
        max_pixels=max_pixels,
        min_dpi=float(cfg.min_dpi),
        limit_side=cfg.max_side,
        limit_pixels=cfg.max_pixels,
        timeout_seconds=cfg.timeout_seconds,
        renderer=cfg.renderer,
        image_dpi=cfg.image_dpi if isinstance(cfg.image_dpi, int) else None,
        upright=orientation.Settings(
            cfg.rotate_pages, cfg.rotate_pages_threshold, cfg.deskew, cfg.timeout_seconds
        ),
        child_memory=child_memory(cfg),
    )


def child_memory(cfg: RenderConfig) -> int:
    """The address space a pdftoppm child may map: the decode budget (what all render workers may
    hold at once; at least two 4-byte copies of the largest page the caps allow, a page and one
    transparency group), plus ``CHILD_BASE_BYTES``. A page that needs more fails
    ``render_memory_exceeded``; the machine never runs short for it."""
    return CHILD_BASE_BYTES + max(cfg.decode_budget_mb * MiB, 2 * 4 * cfg.max_pixels)


def probe(
    path: Path, limits: Limits, *, timeout_seconds: float = PROBE_TIMEOUT_SECONDS
) -> DocumentInfo:
    """Identify the document and check the limits, cheaply and before rendering anything.

    Raises the specific permanent error (EmptyFile, FileTooLarge, NotADocument, EncryptedPdf,
    CorruptPdf, CorruptImage, NoPages, TooManyPages, TooManyPixels, NotARegularFile), SourceGone if
    the file vanished, or RenderTimeout if pdfinfo exceeded ``timeout_seconds``.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise SourceGone(f"{path}: no such file") from None
    if not stat.S_ISREG(st.st_mode):
        raise NotARegularFile(f"{path}: not a regular file")  # opening a FIFO would block forever
    if st.st_size == 0:
        raise EmptyFile(f"{path}: zero bytes")
    if st.st_size > limits.max_bytes:
        raise FileTooLarge(f"{path}: {st.st_size} bytes, more than max_bytes={limits.max_bytes}")
    # had it become a FIFO since stat, no block
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        head = os.read(fd, HEAD_BYTES)
    finally:
        os.close(fd)
    kind = sniff(head)
    # a PDF if poppler reads pages from it, as tolerant readers do: a header after more than
    # 1 KiB of junk, or none at all (poppler rebuilds the cross-reference table)
    if kind is None:
        try:
            pages, sizes = _probe_pdf(path, limits, timeout_seconds)
        except (CorruptPdf, NoPages):  # stray PDF keywords in a text give no pages
            raise NotADocument(
                f"{path}: neither a PDF nor a PNG, JPEG, TIFF or WebP image (by content)"
            ) from None
        kind = "pdf"
    elif kind == "pdf":
        pages, sizes = _probe_pdf(path, limits, timeout_seconds)
    else:
        pages, sizes = probe_image(path, MIME[kind], limits.max_pages)
    return DocumentInfo(
        kind="pdf" if kind == "pdf" else "image",
        mime=MIME[kind],
        pages=pages,
        size_bytes=st.st_size,
        page_sizes=sizes,
    )


def render_page(
    path: Path,
    info: DocumentInfo,
    index: int,
    spec: RenderSpec,
    *,
    budget: DecodeBudget = UNBOUNDED,
) -> RenderedPage:
    """Render page ``index`` (0-based). Blocking: call it from a worker thread. The page's full-size
    image is decoded only within ``budget``, which every render worker of the process must share."""
    if not 0 <= index < info.pages:
        raise IndexError(f"page {index} of a {info.pages}-page document")
    started = time.perf_counter()
    dpi_from: DpiFrom = "render"
    source_dpi = None
    if info.kind == "pdf":
        render_pdf = _render_pdf_page_pdfium if spec.renderer == "pdfium" else _render_pdf_page
        image, dpi = render_pdf(path, info, index, spec, budget)
    else:
        image, dpi, dpi_from, source_dpi = render_image_page(
            path,
            info.mime,
            index,
            max_side=spec.max_side,
            max_pixels=spec.max_pixels,
            limit_pixels=spec.limit_pixels,
            configured_dpi=spec.image_dpi,
            budget=budget,
        )
    seconds = time.perf_counter() - started
    image, turned = orientation.upright(image, dpi, spec.upright)
    image.info["dpi"] = (dpi, dpi)  # what Tesseract is told, whatever the file recorded
    log.debug(
        "page_rendered",
        page=index + 1,  # from 1, as the sidecars number pages
        width=image.width,
        height=image.height,
        dpi=dpi,
        dpi_from=dpi_from,
        seconds=seconds,
    )
    if turned.turned or turned.decided_by == "failed":
        log.info(
            "page_turned",
            page=index + 1,
            rotation=turned.rotation,
            detected=turned.detected,
            confidence=turned.confidence,
            decided_by=turned.decided_by,
            deskew=turned.deskew,
        )
    return RenderedPage(
        index=index,
        image=image,
        dpi=dpi,
        width=image.width,
        height=image.height,
        seconds=seconds,
        dpi_from=dpi_from,
        orientation=turned,
        source_dpi=source_dpi,
    )


def page_dpi(width_pt: float, height_pt: float, spec: RenderSpec) -> float:
    """The DPI for a page of this size: the wanted DPI, lowered until pdftoppm's output fits the
    caps.

    pdftoppm makes ``ceil(points * dpi / 72)`` pixels per side; the result is rounded down to 1/100
    DPI, which is how it is passed on the command line. Raises TooManyPixels when the config's caps
    cannot be met at ``min_dpi``.
    """
    width_pt, height_pt = max(width_pt, 1.0), max(height_pt, 1.0)
    limit = _fit_dpi(width_pt, height_pt, spec.limit_side, spec.limit_pixels)
    if limit < spec.min_dpi:
        raise TooManyPixels(
            f"a {width_pt / 72:.0f} x {height_pt / 72:.0f} inch page needs {limit:.1f} dpi to fit "
            f"max_side={spec.limit_side} and max_pixels={spec.limit_pixels}, below "
            f"min_dpi={spec.min_dpi:g}"
        )
    return min(spec.dpi, _fit_dpi(width_pt, height_pt, spec.max_side, spec.max_pixels))


def plan_pdf(info: DocumentInfo, spec: RenderSpec, *, job_id: str, uri: str) -> None:
    """Before a PDF's first page is rendered: raise TooManyPixels for a page too large at any usable
    DPI, and say in one line which pages (numbered from 1, as the sidecars number them) are rendered
    below the wanted DPI, rather than one line a page each time it is rendered."""
    lowered = {}
    for number, (width_pt, height_pt) in enumerate(info.page_sizes, 1):
        dpi = page_dpi(width_pt, height_pt, spec)
        if dpi < spec.dpi:
            lowered[number] = dpi
    if lowered:
        log.info(
            "page_dpi_lowered",
            job_id=job_id,
            uri=uri,
            pages=_ranges(list(lowered)),
            count=len(lowered),
            of=info.pages,
            wanted=spec.dpi,
            dpi_min=min(lowered.values()),
            dpi_max=max(lowered.values()),
        )


def check_images(path: Path, info: DocumentInfo, spec: RenderSpec) -> None:
    """Before a PDF's first page is rendered: raise TooManyPixels when a page lists an image that
    would decode to more than an image file may (``IMAGE_DECODE_FACTOR`` x the configured
    ``max_pixels``), however small the file is. Blocking (``pdfpixels.oversized``)."""
    bound = IMAGE_DECODE_FACTOR * spec.limit_pixels
    found = pdfpixels.oversized(path, info.pages, bound)
    if found is not None:
        raise TooManyPixels(
            f"{path}: page {found.page} holds a {found.width} x {found.height} image, more than "
            f"{IMAGE_DECODE_FACTOR} x max_pixels={spec.limit_pixels} pixels to decode",
            hint=(
                "an image inside the PDF is larger than [render] max_pixels lets a page decode "
                "(4 x max_pixels); export the PDF with smaller images, or raise max_pixels"
            ),
        )


def _ranges(numbers: list[int]) -> str:
    """Ascending page numbers as ranges: [2, 3, 4, 7] -> "2-4,7"."""
    runs: list[list[int]] = []
    for number in numbers:
        if runs and number == runs[-1][1] + 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    return ",".join(str(first) if first == last else f"{first}-{last}" for first, last in runs)


def _fit_dpi(width_pt: float, height_pt: float, max_side: int, max_pixels: int) -> float:
    dpi = min(
        max_side * 72 / max(width_pt, height_pt),
        72 * math.sqrt(max_pixels / (width_pt * height_pt)),
    )
    dpi = math.floor(dpi * 100) / 100
    while dpi > 0.01 and not fits(_pdftoppm_size(width_pt, height_pt, dpi), max_side, max_pixels):
        dpi = round(dpi - 0.01, 2)
    return dpi


def _pdftoppm_size(width_pt: float, height_pt: float, dpi: float) -> tuple[int, int]:
    return math.ceil(width_pt * dpi / 72), math.ceil(height_pt * dpi / 72)


# --- PDF ------------------------------------------------------------------------------------------


def _probe_pdf(
    path: Path, limits: Limits, timeout: float
) -> tuple[int, tuple[tuple[float, float], ...]]:
    """One pdfinfo call gives the page count and the size and rotation of every page up to
    max_pages."""
    argv = ["pdfinfo", "-f", "1", "-l", str(limits.max_pages), os.path.abspath(path)]
    try:
        done = children.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RenderTimeout(f"{path}: pdfinfo took longer than {timeout:g}s") from None
    except FileNotFoundError:  # not the document's fault: classify() would call it SourceGone
        raise poppler.missing() from None
    out = done.stdout.decode("utf-8", "replace")
    err = done.stderr.decode("utf-8", "replace")
    counts = list(_PDFINFO_PAGES.finditer(out))
    if done.returncode != 0 or not counts:
        raise poppler.pdf_error(path, err)
    # The document's Info strings (Title, Author...) come before "Pages:" and could imitate its
    # lines, so only what follows the last "Pages:" line is trusted.
    pages = int(counts[-1].group(1))
    out = out[counts[-1].end() :]
    if pages == 0:
        raise NoPages(f"{path}: {poppler.NO_PAGES}")
    if pages > limits.max_pages:
        raise TooManyPages(f"{path}: {pages} pages, more than max_pages={limits.max_pages}")
    sizes = {int(n): (float(w), float(h)) for n, w, h in _PDFINFO_SIZE.findall(out)}
    rotations = {int(n): int(r) % 360 for n, r in _PDFINFO_ROT.findall(out)}
    if len(sizes) != pages:
        raise CorruptPdf(f"{path}: pdfinfo reported {pages} pages but the sizes of {len(sizes)}")
    page_sizes = []
    for number in range(1, pages + 1):
        width, height = sizes[number]
        # poppler's stand-in for a page it could not find (a looping page tree)
        if width <= 0 or height <= 0:
            raise CorruptPdf(f"{path}: page {number} has no size ({width:g} x {height:g} pts)")
        page_sizes.append(
            (height, width) if rotations.get(number, 0) in (90, 270) else (width, height)
        )
    return pages, tuple(page_sizes)


def _render_pdf_page(
    path: Path, info: DocumentInfo, index: int, spec: RenderSpec, budget: DecodeBudget
) -> tuple[Image.Image, float]:
    width_pt, height_pt = info.page_sizes[index]
    dpi = page_dpi(width_pt, height_pt, spec)
    # One pdftoppm per page, called directly (not through pdf2image, which runs pdfinfo and
    # `pdftoppm -v` before every page and ignores the exit status), so a pdftoppm killed midway is
    # told apart from a document poppler cannot read. The PPM goes to a private file, not a pipe: a
    # pipe is read 32 KiB at a time, and each read gives up the GIL and waits for it again; beside
    # GIL-bound threads (the vLLM front end's share of this process) a pipe gives several times
    # fewer pages a second than the finished file.
    number = str(index + 1)
    with tempfile.TemporaryDirectory(prefix="ocrwatch-page-") as tmp:
        root = os.path.join(tmp, "page")
        argv = ["pdftoppm", "-r", str(dpi), "-f", number, "-l", number, "-cropbox", "-singlefile"]
        argv += [os.path.abspath(path), root]
        try:
            done = children.run(
                argv,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                timeout=spec.timeout_seconds,
                memory=spec.child_memory,
            )
        except subprocess.TimeoutExpired:
            raise RenderTimeout(
                f"{path}: page {number} took longer than {spec.timeout_seconds:g}s"
            ) from None
        except FileNotFoundError:
            raise poppler.missing() from None
        stderr = done.stderr.decode("utf-8", "replace")
        # Whatever the status: poppler draws the page without what it could not allocate.
        if spec.child_memory is not None and (short := poppler.OUT_OF_MEMORY.search(stderr)):
            raise RenderMemoryExceeded(
                f"{path}: page {number} needs more than the {spec.child_memory // MiB} MiB a "
                f"renderer may map (pdftoppm: {short.group(0)})"
            )
        if done.returncode < 0:
            raise RenderFailed(
                f"{path}: pdftoppm was killed by signal {-done.returncode} while rendering page "
                f"{number}"
            )
        width, height = _pdftoppm_size(width_pt, height_pt, dpi)
        need = width * height * 3 + 64
        if done.returncode != 0:
            if "could not write image" in stderr.lower():
                raise _scratch_error(
                    tmp, need, f"{path}: pdftoppm could not write page {number}: {stderr.strip()}"
                )
            raise poppler.pdf_error(path, stderr)
        if collection := poppler.missing_data(stderr):
            log.warning(
                "render_font_data_missing",
                page=index + 1,
                collection=collection,
                hint="install poppler-data: without it this page's text in fonts the PDF does not"
                " embed is drawn blank",
            )
        with budget.hold(width * height * PDF_BYTES_PER_PIXEL):
            try:
                image = ppm_image(Path(root + ".ppm").read_bytes())
            except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
                # pdftoppm exits 0 when its write ran out of room
                if shutil.disk_usage(tmp).free < need:
                    raise _scratch_error(
                        tmp, need, f"{path}: page {number}'s image was cut short: {exc}"
                    ) from None
                raise CorruptPdf(
                    f"{path}: pdftoppm produced no usable image for page {number}: {exc}"
                ) from None
            size = fit_size(image.size, spec.max_side, spec.max_pixels)
            if size != image.size:  # only if poppler's geometry disagrees with pdfinfo
                dpi, image = dpi * size[0] / image.width, shrink(image, size)
    return image, dpi


def _scratch_error(folder: str, need: int, message: str) -> OcrwatchError:
    """The temporary folder failed a page, not the document: retried, never a permanent error."""
    if shutil.disk_usage(folder).free < need:
        return DiskFull(
            f"{message} (temporary folder {os.path.dirname(folder)} has less than {need} bytes "
            "free)"
        )
    return RenderFailed(
        message, hint="check that the temporary folder (TMPDIR) is writable; ocrwatch retries"
    )


def ppm_image(data: bytes) -> Image.Image:
    """A PPM decoded in one call. ``Image.open(...).load()`` decodes in 64 KiB steps and gives up
    the GIL at each, so a render thread queued for the GIL ~90 times a page. Other flavours (16-bit,
    bitmaps) and short data take that path, which reads them or raises."""
    image = Image.open(io.BytesIO(data), formats=["PPM"])
    codec, _, offset, rawmode = image.tile[0]
    size = image.width * image.height * len(image.getbands())
    if (
        image.mode not in ("RGB", "L")
        or len(image.tile) != 1
        or codec != "raw"
        or len(data) < offset + size
    ):
        image.load()
        return image
    return Image.frombytes(
        image.mode, image.size, memoryview(data)[offset : offset + size], "raw", rawmode
    )


_PDFIUM_LOCK = threading.Lock()
"""PDFium is not thread-safe: one call at a time in this process, whatever the number of render
workers."""


def check_renderer(cfg: RenderConfig) -> None:
    """Fail at start, not on every document, when the configured renderer, or the Tesseract that
    ``rotate_pages`` detects orientation with, is not installed; pdftoppm runs under ``prlimit``,
    which bounds its memory."""
    orientation.check(cfg.rotate_pages)
    if cfg.renderer == "pdftoppm" and shutil.which(children.PRLIMIT) is None:
        raise ConfigError(
            "prlimit is not installed: it bounds the memory of each pdftoppm child",
            hint="install util-linux (apt-get install util-linux)",
        )
    if cfg.renderer == "pdfium" and importlib.util.find_spec("pypdfium2") is None:
        raise ConfigError(
            'render.renderer = "pdfium" needs pypdfium2',
            hint="pip install 'ocrwatch[pdfium]', or remove the key",
        )


def _render_pdf_page_pdfium(
    path: Path, info: DocumentInfo, index: int, spec: RenderSpec, budget: DecodeBudget
) -> tuple[Image.Image, float]:
    """The optional renderer (``[render] renderer = "pdfium"``): several times pdftoppm's pages per
    core, but inside this process, so it has no timeout and no isolation from a hostile PDF;
    pdftoppm stays the default for that reason."""
    import pypdfium2 as pdfium

    width_pt, height_pt = info.page_sizes[index]
    dpi = page_dpi(width_pt, height_pt, spec)
    # PDFium sizes the bitmap as ceil(points * scale) with its boxes stored as float32 (470.88 pt
    # reads back as 470.8800049), so an exact 1962.0 px becomes 1963. Shaving a millionth off the
    # scale, far more than float32's error and far less than a pixel, gives pdftoppm's ceil(points *
    # dpi / 72) geometry.
    scale = dpi / 72 * (1 - 1e-6)
    width, height = _pdftoppm_size(width_pt, height_pt, dpi)
    with budget.hold(width * height * PDF_BYTES_PER_PIXEL), _PDFIUM_LOCK:
        try:
            document = pdfium.PdfDocument(os.path.abspath(path))
        except pdfium.PdfiumError as exc:
            raise CorruptPdf(f"{path}: pdfium could not open it: {exc}") from None
        try:
            page = document[index]
            try:
                # BGR to RGB: a copy, not the bitmap
                image: Image.Image = page.render(scale=scale).to_pil()
            finally:
                page.close()
        except pdfium.PdfiumError as exc:
            raise CorruptPdf(f"{path}: page {index + 1} could not be rendered: {exc}") from None
        finally:
            document.close()
        size = fit_size(image.size, spec.max_side, spec.max_pixels)
        if size != image.size:
            dpi, image = dpi * size[0] / image.width, shrink(image, size)
    return image, dpi


class Spooled(Protocol):
    """The job's private copy as measured (``jobs.steps.Probed``): what page makers read."""

    @property
    def path(self) -> Path: ...

    @property
    def info(self) -> DocumentInfo: ...

    @property
    def spec(self) -> RenderSpec: ...

    @property
    def sha256(self) -> str: ...
