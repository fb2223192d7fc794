"""The single-table sections of the configuration (``[render]``, ``[engine]``, ``[retry]``, ...),
each key declared once with its default, bounds and description."""

from __future__ import annotations

import json
import string
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo

import ocrwatch.config.engines as config_engines
import ocrwatch.config.env as config_env
from ocrwatch.config.base import (
    SIDECARS,
    Auto,
    Formats,
    KeyProblem,
    MiB,
    Model,
    NonEmptyPath,
    OnSuccess,
    TableProblem,
    no_zero_for_auto,
)


class RenderConfig(Model):
    dpi: Annotated[int, Field(ge=50, le=1200)] | Auto = Field(
        "auto",
        description=(
            'Resolution pages are rendered at. "auto": the engine\'s own dpi (vLLM: 210 for'
            " DeepSeek-OCR-2, 175 for DeepSeek-OCR, where A4 and Letter fill its tile grid;"
            " Tesseract: [engine.tesseract] dpi). Set: this dpi, bounded by what the engine can use"
            " (DeepSeek-OCR's tile grid caps a page's long side)."
        ),
    )
    max_side: Annotated[int, Field(ge=256, le=20000)] = Field(
        4096,
        description=(
            "Cap on a page's longest side in pixels: a poster is rendered smaller, not refused."
        ),
    )
    max_pixels: Annotated[int, Field(ge=65536, le=400_000_000)] = Field(
        40_000_000, description=("Cap on pixels per page, for the same reason.")
    )
    min_dpi: Annotated[int, Field(ge=10, le=600)] = Field(
        20,
        description=(
            "Below this DPI a page is refused as too_many_pixels instead of rendered unreadably "
            "small."
        ),
    )
    timeout_seconds: Annotated[float, Field(gt=0, le=3600)] = Field(
        120.0, description=("pdftoppm gets this long per page; then render_timeout (retried).")
    )
    renderer: Literal["pdftoppm", "pdfium"] = Field(
        "pdftoppm",
        description=(
            '"pdftoppm" (poppler, one subprocess per page with a deadline) or "pdfium"'
            " (pip install ocrwatch[pdfium]; in-process, faster, no deadline)."
        ),
    )
    decode_budget_mb: Annotated[int, Field(ge=64, le=1_048_576)] = Field(
        1024,
        description=(
            "MiB of full-size page images that all render workers together may hold while decoding "
            "(one budget, not one per worker). A 12,600 x 12,600 RGBA PNG decodes to 635 MB "
            "whatever its size on disk; a page that needs more than the budget decodes alone. "
            "Ordinary pages (an A4 page at 300 dpi: 60 MB) never wait."
        ),
    )
    image_dpi: Annotated[int, Field(ge=50, le=2400)] | Auto = Field(
        "auto",
        description=(
            "The resolution of an image that records none (a screenshot, many scanners' PNGs):"
            " its searchable PDF page's size and Tesseract's scale. \"auto\": its long side is an"
            " A4 page's (11.7 in), never below 96 dpi. Each page's dpi and dpi_from (\"image\","
            ' "image_dpi", "assumed") are in the JSON.'
        ),
    )
    rotate_pages: bool = Field(
        True,
        description=(
            "Turn each page upright before it is read (either engine): Tesseract's orientation "
            "detection (`tesseract --psm 0`; needs tesseract-ocr and tesseract-ocr-osd, checked at "
            "start), in the render workers, about a second of one core per page here. The source "
            "is never changed: the JSON records each page's rotation, the boxes and figures are "
            "the upright page's, and the searchable PDF's text lies over the glyphs as the page is "
            "shown. false: pages are read as they are rendered."
        ),
    )
    rotate_pages_threshold: Annotated[float, Field(ge=0, le=100)] = Field(
        14.0,
        description=(
            "OSD's confidence from which its answer is taken as it is (OCRmyPDF's "
            "--rotate-pages-threshold). Below it (a page with little text, where OSD is often "
            "wrong) the page is read both ways and turned only if turned it reads twice as many "
            "confident characters; below 1.0 it is kept as it is."
        ),
    )
    deskew: bool = Field(
        False,
        description=(
            "Level each page's text lines (as OCRmyPDF's --deskew), by up to 5 degrees: for crooked"
            " scans. About a fifth of a second of one core per page here; the JSON records the "
            "angle as"
            ' "deskew".'
        ),
    )


class LimitsConfig(Model):
    max_bytes: Annotated[int, Field(ge=1)] = Field(
        512 * MiB,
        description=("Documents larger than this fail as file_too_large (checked before reading)."),
    )
    max_pages: Annotated[int, Field(ge=1)] = Field(
        2000,
        description=(
            "Documents with more pages fail as too_many_pages (checked before rendering)."
        ),
    )


class OutputConfig(Model):
    name_template: str = Field(
        "{name}",
        description=(
            'Sidecar base name; {name} = "report.pdf", {stem} = "report", {suffix} = ".pdf".'
            " No path separators."
        ),
    )
    dir: NonEmptyPath | None = Field(
        None,
        examples=["/srv/ocr-out"],
        description=(
            "Write sidecars under this folder instead of beside each source, e.g. for read-only"
            " inboxes. Each inbox is mirrored, subfolders and all, in a folder of its own named "
            "after"
            " the inbox's folder (/srv/scans -> DIR/scans); where two inboxes' folders share a "
            "name,"
            ' each gets "-" and 8 hex digits of the sha256 of its path after it'
            " (DIR/scans-1a2b3c4d). A deleted JSON sidecar is noticed at the next start, and its"
            " document done again. Created at start; a dir that cannot be written stops the start."
        ),
    )
    images: Literal["placeholder", "drop", "extract"] = Field(
        "placeholder",
        description=(
            'Figures in Markdown: "placeholder" (![](page-1-figure-1)), "drop", or "extract":'
            " each figure DeepSeek-OCR finds is cut out of the page at the resolution it was "
            "rendered"
            " at and saved as NAME.assets/page-N-figure-K.png, and the Markdown links it"
            " (![](report.pdf.assets/page-1-figure-1.png)); the JSON lists the files (figures: "
            "path,"
            " bytes, sha256, page, bbox). Tesseract finds no figures."
        ),
    )
    searchable_pdf: bool = Field(
        False,
        description=(
            "Also write NAME.ocr.pdf (report.pdf -> report.pdf.ocr.pdf, beside the sidecars, "
            "before the JSON): the source's pages untouched (an image source: the image at its "
            "DPI) with an invisible text layer where the engine read the text, for search and copy "
            "in any PDF viewer. The JSON records it (searchable_pdf: path, bytes, sha256); a "
            "source whose layer cannot be made (a PDF qpdf cannot read) keeps its .md and .json, "
            "and searchable_pdf says why. Files named *.ocr.pdf are never taken as documents."
        ),
    )
    formats: Formats = Field(
        SIDECARS,
        description=(
            'The files written for each document: "md" and "json" always; "alto" adds NAME.alto.xml'
            ' (ALTO 4.4, the Library of Congress\'s layout format that archives keep) and "hocr"'
            " NAME.hocr (hOCR 1.2, as Tesseract writes it and OCRmyPDF reads it): the text with"
            " each page's size, rotation and boxes, words' boxes and confidences from Tesseract,"
            " blocks' boxes from DeepSeek-OCR's grounding. Written beside the sidecars before the"
            " JSON, which records them (alto, hocr: path, bytes, sha256). Overridable per"
            " [[inbox]] and per [[s3]]. The searchable PDF stays searchable_pdf's."
        ),
    )
    on_success: OnSuccess = Field(
        "keep",
        description=(
            'What becomes of a source once its document is "ok" (a "partial" or failed one always'
            ' stays): "keep", "move" (into archive_dir, with its sidecars and outputs when they'
            ' lie beside it), or "delete" (once every sidecar is on disk). Overridable per'
            " [[inbox]] and per [[s3]]. Neither touches a file changed since it was read."
        ),
    )
    archive_dir: NonEmptyPath | None = Field(
        None,
        examples=["/srv/archive"],
        description=(
            'Where "move" puts sources, mirroring each inbox\'s folders in a folder named after the'
            " inbox (as dir does): /srv/scans/2024/invoice.pdf ->"
            " /srv/archive/scans/2024/invoice.pdf, with its .md, .json, .ocr.pdf, .alto.xml, .hocr"
            " and .assets/ "
            "beside"
            " it. Nothing there is replaced: a name taken moves the whole group as report.1.pdf,"
            ' report.1.pdf.md, ... Required with "move"; neither inside an inbox nor holding one.'
            " Relative to this file."
        ),
    )

    @field_validator("name_template")
    @classmethod
    def _template_stays_in_folder(cls, value: str) -> str:
        fields = set()
        for _, field, spec, conversion in string.Formatter().parse(value):
            if field is None:
                continue
            if field not in ("name", "stem", "suffix") or spec or conversion:
                raise ValueError("only the plain fields {name}, {stem} and {suffix} may appear")
            fields.add(field)
        if not fields & {"name", "stem"}:
            raise ValueError("must contain {name} or {stem}")
        rendered = value.format(name="x", stem="x", suffix=".pdf")
        if "/" in rendered or "\\" in rendered or rendered in (".", "..") or "\0" in rendered:
            raise ValueError("must not contain path separators: sidecars stay beside their source")
        return value


class LogConfig(Model):
    format: Literal["auto", "json", "console"] = Field(
        "auto",
        description=(
            '"auto" = JSON when not on a terminal (systemd), key=value on a terminal; or "json" / '
            '"console".'
        ),
    )
    level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description=("The least severe log lines written.")
    )


class MetricsConfig(Model):
    enabled: bool = Field(
        True,
        description=(
            "Serve Prometheus /metrics and the health endpoints /healthz and /readyz on listen; "
            "false switches off all three, health checks included (the daemon's own health tick "
            "and systemd's watchdog run either way)."
        ),
    )
    listen: str = Field(
        "127.0.0.1:9464",
        description=(
            "host:port of the metrics and health endpoints. Loopback by default: expose "
            "deliberately."
        ),
    )


class SchedulerConfig(Model):
    max_inflight_pages: Annotated[int, Field(ge=1, le=4096)] | Auto = Field(
        "auto",
        description=(
            'Pages inside the engine at once; "auto" = the engine\'s own figure (Tesseract: cores;'
            " vLLM: max_num_seqs x DP)."
        ),
    )
    render_ahead: Annotated[int, Field(ge=1, le=4096)] | Auto = Field(
        "auto",
        description=(
            "Pages rendered ahead of the engine: bounds memory whatever arrives (one page image "
            "each,"
            ' ~6 MB at 144 dpi); "auto" = half of the pages in flight, at least 16 (vLLM at 256'
            " sequences: 128; Tesseract: 16). 0, its old spelling, is refused."
        ),
    )
    render_workers: Annotated[int, Field(ge=1, le=256)] | Auto = Field(
        "auto",
        description=(
            'Threads driving pdftoppm / Pillow; "auto" = half the CPUs this process may use, at '
            "least"
            " 2, at most 16 (a page takes 0.1-0.3 s of one core: two workers hold a GPU engine "
            "near 6-8"
            " pages/s). 0, its old spelling, is refused."
        ),
    )
    ageing_seconds: Annotated[float, Field(gt=0)] = Field(
        30.0,
        description=(
            "Ageing: a document's deadline is arrival + ageing_seconds * log2(1 + pages); small"
            " documents go first, none starve."
        ),
    )
    max_active_documents: Annotated[int, Field(ge=1, le=4096)] | Auto = Field(
        "auto",
        description=(
            'Documents open at once (each holds a temp folder and a ledger slot); "auto" = as '
            "many as"
            " pages in flight, at least 64, so one-page documents can fill a GPU engine (vLLM at "
            "256"
            " sequences: 256). 0, its old spelling, is refused."
        ),
    )

    _old_auto = field_validator(
        "render_ahead", "render_workers", "max_active_documents", mode="before"
    )(no_zero_for_auto)


class RetryConfig(Model):
    attempts: Annotated[int, Field(ge=1, le=100)] = Field(
        5,
        description=(
            "Two limits of one number. Attempts for a transiently failing document (engine died, "
            "S3 down) before it is marked failed; a fault of the place (disk full, a sidecar "
            "folder or state_dir/tmp that cannot be written) uses none of them: it is retried for "
            "as long as it lasts, at most backoff_max_seconds apart. And the crash limit: a "
            "document in whose middle the daemon ended uncleanly (kill -9, OOM, power loss) more "
            "than this many times fails as crash_loop; a clean stop never counts."
        ),
    )
    backoff_initial_seconds: Annotated[float, Field(ge=0)] = Field(
        2.0, description=("Exponential backoff with jitter between attempts: the first wait.")
    )
    backoff_max_seconds: Annotated[float, Field(ge=0)] = Field(
        300.0, description=("The longest wait between two attempts.")
    )


class EngineConfig(Model):
    model_config = ConfigDict(extra="allow", frozen=True)

    kind: str = Field(
        "auto",
        description=(
            '"auto" = vLLM when vllm imports and a CUDA device is visible, else Tesseract (logged'
            ' loudly); or an engine\'s name: "vllm", "tesseract", or one another package registers'
            ' in the "ocrwatch.engines" entry-point group. Checked at load against the built-in'
            " engines and the installed entry points. Its table [engine.<name>] is validated by the"
            " options model the engine brings."
        ),
    )
    plugin: str | None = Field(
        None,
        examples=["mypackage.engines:MyEngine"],
        description=(
            'kind = "plugin": an Engine class of your own, as "module:attribute", built with'
            " plugin_args as keywords."
        ),
    )
    plugin_args: dict[str, Any] = Field(
        default_factory=dict, description=("Keyword arguments of the plugin's Engine class.")
    )
    page_timeout_seconds: Annotated[float, Field(gt=0)] = Field(
        600.0,
        description=(
            "A page the engine has not answered after this long is aborted and retried on the next "
            "rung."
        ),
    )
    page_attempts: Annotated[int, Field(ge=1, le=20)] = Field(
        3,
        description=(
            "Attempts at a page before it is marked failed (the document becomes partial): the "
            "first attempt, then the rungs of [engine.vllm] ladder. At most 1 + the ladder's rungs "
            "are made, whatever this says (3 with the default ladder). An engine whose spec brings "
            "no rungs of its own (Tesseract, a third engine's by default) reads a page once and "
            "ignores this key."
        ),
    )

    @field_validator("kind")
    @classmethod
    def _kind_is_known(cls, value: str) -> str:
        """``auto`` or a known engine (built in, or of the entry-point group), so a typo stops the
        start, not the first page."""
        if value != "auto" and config_engines.value(value) is None:
            known = {"auto", *config_engines.names()}
            raise ValueError(f"unknown engine {value!r} (installed: {', '.join(sorted(known))})")
        return value

    @model_validator(mode="after")
    def _engine_tables(self) -> EngineConfig:
        """Each ``[engine.<name>]`` table becomes the options model of engine ``name``'s spec,
        validated as strictly as the file; the built-in engines' and the chosen one's default where
        the file has none."""
        extra = self.__pydantic_extra__ if self.__pydantic_extra__ is not None else {}
        for name, value in extra.items():
            options = config_engines.options(name)
            if options is None:
                raise KeyProblem((name,), config_env.unknown_key(EngineConfig, (name,)))
            if not isinstance(value, options):
                extra[name] = _table(name, options, value)
        for name in (*config_engines.built_in(), self.kind):
            if name not in extra and (options := config_engines.options(name)) is not None:
                extra[name] = options()
        return self

    @classmethod
    def tables(cls) -> dict[str, FieldInfo]:
        """The engines' tables as fields, for what walks the keys (variables, the documentation)."""
        found = ((name, config_engines.options(name)) for name in config_engines.names())
        return {
            name: FieldInfo(
                annotation=options, default_factory=options, description=options.__doc__
            )
            for name, options in found
            if options is not None
        }

    if TYPE_CHECKING:  # an engine's table, by its name: cfg.engine.vllm

        def __getattr__(self, name: str) -> Any: ...


def _table(name: str, options: type[BaseModel], value: Any) -> BaseModel:
    """``value``, the table as parsed, validated by ``options`` as strictly as the file is."""
    if not isinstance(value, dict):
        raise KeyProblem((name,), "Input should be a valid dictionary (a table)")
    try:
        return options.model_validate_json(json.dumps(value), strict=True)
    except ValidationError as exc:
        raise TableProblem((name,), exc.errors()) from None


class DaemonConfig(Model):
    reconcile_seconds: Annotated[float, Field(gt=0)] = Field(
        300.0,
        description=(
            "Full rescan of the inboxes, to catch missed events and files that arrived while down."
        ),
    )
    shutdown_timeout: Annotated[float, Field(gt=0)] = Field(
        30.0,
        description=(
            "SIGTERM waits this long for in-flight documents, then requeues them in the ledger."
        ),
    )
    health_interval_seconds: Annotated[float, Field(gt=0)] = Field(
        5.0, description=("Health tick: event-loop lag, metrics gauges, systemd WATCHDOG=1.")
    )
    admission_stall_seconds: Annotated[float, Field(gt=0)] = Field(
        120.0,
        description=(
            "/readyz says not ready once new files have waited this long to be fingerprinted"
            " (hashed, each within its max_bytes) with none finished: a filesystem that hangs."
            " A 512 MiB file takes about a second from a local disk, under a minute at 10 MB/s."
        ),
    )
