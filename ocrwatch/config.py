"""One frozen configuration, loaded from TOML and validated once at start.

Every key has a default that works on a fresh machine, so ``ocrwatch run`` with no file at all watches
``./inbox`` and keeps state in ``./.ocrwatch``. Any key can also be set by an environment variable
(``config_env``), over the file's value. Values are taken as strictly as TOML types them
(``"yes"`` is no boolean). Errors name the file and the key as the user wrote it, or the variable.
Each engine owns the model of its own ``[engine.NAME]`` table (``engines.deepseek.options``,
``engines.tesseract_options``); this module composes them.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import shutil
import string
import sys
from collections.abc import Callable, Iterator, Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator,
)  # fmt: skip

from ocrwatch import config_env
from ocrwatch.config_env import Loc
from ocrwatch.engines.deepseek.options import PROMPT_PRESETS, VllmConfig
from ocrwatch.engines.tesseract_options import Lang, TesseractConfig
from ocrwatch.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before it joined the standard library
    import tomli as tomllib

DEFAULT_CONFIG_PATHS = (Path("ocrwatch.toml"), Path("/etc/ocrwatch/config.toml"))

ENGINE_ENTRY_POINTS = "ocrwatch.engines"
"""The entry-point group through which engines, the built-in ones too, are found by ``[engine] kind``."""

DEFAULT_PRIORITY = 50
"""A source's lane when its configuration names none: the middle of 0..100."""

MiB = 1024 * 1024


class KeyProblem(ValueError):
    """A validator's finding, reported against the key the user wrote (``loc``, below the model that
    raised it), which need not be the key the validator reads: ``move`` in ``[output]`` is
    ``output.on_success``'s fault, not an inbox's. ``text`` is the message after the key, or a
    function of a namer that writes the whole line, naming other keys as the user set them."""

    def __init__(self, loc: Loc, text: str | Callable[[Callable[[Loc], str]], str]) -> None:
        super().__init__(text if isinstance(text, str) else "")
        self.loc = loc
        self.text = text

    def render(self, name: Callable[[Loc], str]) -> str:
        return f"{name(self.loc)}: {self.text}" if isinstance(self.text, str) else self.text(name)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RenderConfig(_Model):
    dpi: Annotated[int, Field(ge=50, le=1200)] | None = None
    max_side: Annotated[int, Field(ge=256, le=20000)] = 4096
    max_pixels: Annotated[int, Field(ge=65536, le=400_000_000)] = 40_000_000
    min_dpi: Annotated[int, Field(ge=10, le=600)] = 20
    timeout_seconds: Annotated[float, Field(gt=0, le=3600)] = 120.0
    renderer: Literal["pdftoppm", "pdfium"] = "pdftoppm"
    decode_budget_mb: Annotated[int, Field(ge=64, le=1_048_576)] = 1024
    image_dpi: Annotated[int, Field(ge=50, le=2400)] | None = None  # unset: imagepages' size rule
    rotate_pages: bool = True  # ocrwatch.orientation
    rotate_pages_threshold: Annotated[float, Field(ge=0, le=100)] = 14.0
    deskew: bool = False  # ocrwatch.deskew


class LimitsConfig(_Model):
    max_bytes: Annotated[int, Field(ge=1)] = 512 * MiB
    max_pages: Annotated[int, Field(ge=1)] = 2000


OnSuccess = Literal["keep", "move", "delete"]
Duplicates = Literal["reuse", "ocr"]

TextMode = Literal["ocr", "auto", "layer"]
"""Where a PDF page's text comes from (``[[inbox]] text``, ``ocrwatch ocr --text``): always OCR, its own
text layer where that passes ``pagetext``'s test, or its layer wherever it has one."""
"""What becomes of a source once its document is ``ok`` (``[output] on_success``, per inbox and per bucket)."""


class OutputConfig(_Model):
    name_template: str = "{name}"
    dir: Path | None = None
    images: Literal["placeholder", "drop", "extract"] = "placeholder"
    searchable_pdf: bool = False
    on_success: OnSuccess = "keep"
    archive_dir: Path | None = None

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


class LogConfig(_Model):
    format: Literal["auto", "json", "console"] = "auto"
    level: Literal["debug", "info", "warning", "error"] = "info"


class MetricsConfig(_Model):
    enabled: bool = True
    listen: str = "127.0.0.1:9464"


class SchedulerConfig(_Model):
    max_inflight_pages: Annotated[int, Field(ge=1, le=4096)] | None = None
    render_ahead: Annotated[int, Field(ge=0, le=4096)] = 0
    render_workers: Annotated[int, Field(ge=0, le=256)] = 0
    ageing_seconds: Annotated[float, Field(gt=0)] = 30.0
    max_active_documents: Annotated[int, Field(ge=0, le=4096)] = 0


class RetryConfig(_Model):
    attempts: Annotated[int, Field(ge=1, le=100)] = 5
    backoff_initial_seconds: Annotated[float, Field(ge=0)] = 2.0
    backoff_max_seconds: Annotated[float, Field(ge=0)] = 300.0


class EngineConfig(_Model):
    kind: str = "auto"
    plugin: str | None = None
    plugin_args: dict[str, Any] = Field(default_factory=dict)
    page_timeout_seconds: Annotated[float, Field(gt=0)] = 600.0
    page_attempts: Annotated[int, Field(ge=1, le=20)] = 3
    vllm: VllmConfig = VllmConfig()
    tesseract: TesseractConfig = TesseractConfig()

    @field_validator("kind")
    @classmethod
    def _kind_is_installed(cls, value: str) -> str:
        """``auto`` or an engine of the entry-point group, so a typo stops the start, not the first page."""
        known = {"auto", *entry_points(group=ENGINE_ENTRY_POINTS).names}
        if value not in known:
            raise ValueError(f"unknown engine {value!r} (installed: {', '.join(sorted(known))})")
        return value


class InboxConfig(_Model):
    path: Path = Path("inbox")
    recursive: bool = True
    # Levels of subfolders watched and scanned; a deeper folder is refused (watchdog's poller recurses a level
    # each, hence the bound).
    max_depth: Annotated[int, Field(ge=1, le=256)] = 32
    patterns: tuple[str, ...] = ("*.pdf", "*.png", "*.jpg", "*.jpeg", "*.tif", "*.tiff", "*.webp")
    priority: Annotated[int, Field(ge=0, le=100)] = DEFAULT_PRIORITY
    prompt: str = "markdown"
    polling: Literal["auto"] | bool = "auto"
    poll_seconds: Annotated[float, Field(ge=0.1, le=3600)] = 1.0  # how often a polled inbox is looked at
    # Globs matched against one name, case aside; a trailing / names a folder (sources/ignore.py).
    ignore: tuple[Annotated[str, Field(pattern=r"^[^/\x00]+/?$")], ...] = ()
    settle_seconds: Annotated[float, Field(ge=0, le=3600)] = 2.0
    max_bytes: Annotated[int, Field(ge=1)] | None = None
    max_pages: Annotated[int, Field(ge=1)] | None = None
    quarantine_dir: Path | None = None
    create: bool = True
    lang: Lang | None = None  # Tesseract's languages for this inbox; None = [engine.tesseract] lang
    on_success: OnSuccess | None = None  # None: [output] on_success
    duplicates: Duplicates = "reuse"
    text: TextMode | None = None  # None: the engine's own default (EngineSpec.text)


class S3Config(_Model):
    transport: Literal["sqs", "webhook", "amqp"] = "sqs"
    queue_url: str | None = None
    url: str | None = Field(default=None, repr=False)  # amqp: may carry a password, so never shown
    url_file: Path | None = None
    queue: str | None = None
    exchange: str = ""
    routing_key: str = "#"
    dead_letter_exchange: str = ""
    prefetch: Annotated[int, Field(ge=1, le=65535)] | None = None  # None: [scheduler] max_active_documents
    endpoint_url: str | None = None
    region: str | None = None
    bucket: str | None = None
    prefix: str = ""
    suffixes: tuple[str, ...] = (".pdf", ".png", ".jpg", ".jpeg", ".tif", ".tiff", ".webp")
    output_bucket: str | None = None
    output_prefix: str = ""
    listen: str = "127.0.0.1:8787"
    path: str = "/s3/events"
    token: str | None = None
    max_body_bytes: Annotated[int, Field(ge=1024)] = 1 * MiB
    visibility_timeout_seconds: Annotated[int, Field(ge=10, le=43200)] = 300
    wait_time_seconds: Annotated[int, Field(ge=0, le=20)] = 20
    max_receives: Annotated[int, Field(ge=1)] = 5
    on_max_receives: Literal["error_sidecar", "dead_letter"] = "error_sidecar"
    priority: Annotated[int, Field(ge=0, le=100)] = DEFAULT_PRIORITY
    prompt: str = "markdown"
    access_key_id: str | None = None
    secret_access_key: str | None = Field(default=None, repr=False)
    addressing_style: Literal["auto", "path", "virtual"] = "auto"
    on_success: OnSuccess | None = None  # None: [output] on_success
    archive_prefix: str = ""
    duplicates: Duplicates = "reuse"

    @model_validator(mode="after")
    def _transport_needs(self) -> "S3Config":
        if self.transport == "sqs" and not self.queue_url:
            raise KeyProblem(("queue_url",), "required with transport 'sqs'")
        if self.transport == "webhook" and not self.token:
            raise KeyProblem(("token",), "required with transport 'webhook': a shared secret")
        if self.transport == "amqp":
            if (self.url is None) == (self.url_file is None):
                raise KeyProblem(("url",), "transport 'amqp' needs exactly one of url and url_file")
            if not self.queue:
                raise KeyProblem(("queue",), "required with transport 'amqp'")
            if self.url_file is not None and not self.url_file.is_absolute():
                raise KeyProblem(("url_file",), "an absolute path (the working folder is no anchor)")
            if importlib.util.find_spec("aio_pika") is None:
                raise KeyProblem(("transport",), "'amqp' needs aio-pika, which is not installed: "
                                 "pip install 'ocrwatch[amqp]'")
        return self


HookStatus = Literal["ok", "partial", "failed"]


class HookConfig(_Model):
    """One ``[[hook]]``: a program run, or a URL posted to, once a document's final status is known."""

    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]
    on: tuple[HookStatus, ...] = ("ok", "partial", "failed")
    command: tuple[str, ...] | None = None
    url: str | None = None
    token: str | None = Field(default=None, repr=False)
    timeout_seconds: Annotated[float, Field(gt=0, le=86400)] = 60.0
    max_attempts: Annotated[int, Field(ge=1, le=100)] = 5
    backoff_initial_seconds: Annotated[float, Field(ge=0, le=3600)] = 2.0
    backoff_max_seconds: Annotated[float, Field(ge=0, le=86400)] = 300.0
    concurrency: Annotated[int, Field(ge=1, le=64)] = 4

    @model_validator(mode="before")
    @classmethod
    def _default_name(cls, data: Any) -> Any:
        """A hook's name keys its deliveries in the ledger and its metrics: by default the program's file name
        or the URL's host, so reordering the hooks never hands one hook's pending deliveries to another."""
        if not isinstance(data, dict):
            return data
        # Validation after a "before" validator reads Python, not JSON, whose strict mode takes no
        # list for a tuple: TOML's arrays become the tuples they stand for.
        data = {key: tuple(val) if isinstance(val, list) else val for key, val in data.items()}
        if "name" not in data:
            command, url, name = data.get("command"), data.get("url"), ""
            if isinstance(command, tuple) and command and isinstance(command[0], str):
                name = Path(command[0]).name
            elif isinstance(url, str):
                name = urlsplit(url).netloc.rpartition("@")[2]
            data = {**data, "name": name or "hook"}  # "hook": the checks below say what is missing
        return data

    @model_validator(mode="after")
    def _one_target(self) -> "HookConfig":
        if (self.command is None) == (self.url is None):
            raise KeyProblem(("command",), "give exactly one of command (argv) and url")
        if not self.on or len(set(self.on)) != len(self.on):
            raise KeyProblem(("on",), "name each of ok, partial, failed at most once, at least one")
        if self.command is not None:
            if not self.command or not self.command[0] or any("\0" in arg for arg in self.command):
                raise KeyProblem(("command",), "a non-empty argv list, the program first")
            if shutil.which(self.command[0]) is None:
                raise KeyProblem(("command",), f"{self.command[0]!r} is not an executable file"
                                 " (nor one on PATH)")  # fmt: skip
            if self.token is not None:
                raise KeyProblem(("token",), "only for a url hook (sent as Authorization: Bearer)")
        if self.url is not None:
            parts = urlsplit(self.url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise KeyProblem(("url",), "an http:// or https:// URL with a host")
        return self


class DaemonConfig(_Model):
    reconcile_seconds: Annotated[float, Field(gt=0)] = 300.0
    shutdown_timeout: Annotated[float, Field(gt=0)] = 30.0
    health_interval_seconds: Annotated[float, Field(gt=0)] = 5.0


class Config(_Model):
    state_dir: Path = Path(".ocrwatch")
    engine: EngineConfig = EngineConfig()
    render: RenderConfig = RenderConfig()
    limits: LimitsConfig = LimitsConfig()
    output: OutputConfig = OutputConfig()
    log: LogConfig = LogConfig()
    metrics: MetricsConfig = MetricsConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    retry: RetryConfig = RetryConfig()
    daemon: DaemonConfig = DaemonConfig()
    inbox: tuple[InboxConfig, ...] = (InboxConfig(),)
    s3: tuple[S3Config, ...] = ()
    hook: tuple[HookConfig, ...] = ()
    source_file: Path | None = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _inboxes_distinct(self) -> "Config":
        seen: dict[Path, int] = {}
        for index, inbox in enumerate(self.inbox):
            resolved = inbox.path.expanduser().resolve()
            if resolved in seen:
                first = ("inbox", seen[resolved], "path")
                raise KeyProblem(("inbox", index, "path"), lambda name: (
                    f"{name(('inbox', index, 'path'))}: same folder as {name(first)} ({resolved})"
                ))  # fmt: skip
            seen[resolved] = index
        return self

    @model_validator(mode="after")
    def _inboxes_not_nested(self) -> "Config":
        """A folder inside a recursive inbox is watched by both inboxes, so each document in it
        would be processed twice; compared resolved, since a link or ``..`` can hide the nesting."""
        roots = [inbox.path.expanduser().resolve() for inbox in self.inbox]
        for outer, (root, inbox) in enumerate(zip(roots, self.inbox)):
            if not inbox.recursive:
                continue
            for inner, other in enumerate(roots):
                if other != root and other.is_relative_to(root):
                    raise KeyProblem(("inbox", inner, "path"), _nested(inner, other, outer, root))
        return self

    @model_validator(mode="after")
    def _prompts_exist(self) -> "Config":
        """Every source's prompt, an inbox's and a bucket's alike: ``prompt_text`` never misses."""
        known = set(PROMPT_PRESETS) | set(self.engine.vllm.prompts)
        for kind in ("inbox", "s3"):
            for index, source in enumerate(getattr(self, kind)):
                if source.prompt not in known:
                    said = f"unknown preset {source.prompt!r} (known: {sorted(known)})"
                    raise KeyProblem((kind, index, "prompt"), said)
        return self

    @model_validator(mode="after")
    def _archives_apart(self) -> "Config":
        """A move needs a place to go that is no document's source: an archive inside an inbox (or a prefix a
        bucket watches) would bring every archived file back as a new document."""
        default = self.output.on_success
        archive = self.output.archive_dir.expanduser().resolve() if self.output.archive_dir else None
        for index, inbox in enumerate(self.inbox):
            root = inbox.path.expanduser().resolve()
            if archive is None:
                if (inbox.on_success or default) == "move":
                    raise KeyProblem(_written("inbox", index, inbox.on_success),
                                     "'move' needs [output] archive_dir")  # fmt: skip
            elif archive.is_relative_to(root) or root.is_relative_to(archive):
                where = ("inbox", index, "path")
                raise KeyProblem(("output", "archive_dir"), lambda name: (
                    f"{name(('output', 'archive_dir'))}: {archive} and {name(where)} {root}"
                    " must not contain one another"
                ))  # fmt: skip
        for index, s3 in enumerate(self.s3):
            if (s3.on_success or default) == "move" and not s3.archive_prefix:
                raise KeyProblem(_written("s3", index, s3.on_success), lambda name: (
                    f"{name(_written('s3', index, s3.on_success))}: 'move' needs"
                    f" {name(('s3', index, 'archive_prefix'))}"
                ))  # fmt: skip
        return self

    @model_validator(mode="after")
    def _hook_names_distinct(self) -> "Config":
        names = [hook.name for hook in self.hook]
        for index, name in enumerate(names):
            if name in names[:index]:
                first = names.index(name)
                said = f"{name!r} is taken by hook[{first}]; give each a name"
                raise KeyProblem(("hook", index, "name"), said)
        return self

    def prompt_text(self, preset: str) -> str:
        """A source's prompt; its preset was checked at load (``_prompts_exist``)."""
        return self.engine.vllm.prompts.get(preset) or PROMPT_PRESETS[preset]

    def inbox_lang(self, root: Path) -> str | None:
        """The ``lang`` of the inbox whose resolved folder is ``root``; None: ``[engine.tesseract] lang``."""
        found = (inbox.lang for inbox in self.inbox if inbox.lang and inbox.path.expanduser().resolve() == root)
        return next(found, None)


def _nested(
    inner: int, other: Path, outer: int, root: Path
) -> Callable[[Callable[[Loc], str]], str]:
    """A folder inside a recursive inbox, said naming both keys."""
    return lambda name: (
        f"{name(('inbox', inner, 'path'))} ({other}) lies inside {name(('inbox', outer, 'path'))}"
        f" ({root}), which watches its subfolders: each document there would be processed twice;"
        f" remove one, or set {name(('inbox', outer, 'recursive'))} = false"
    )


def _written(kind: str, index: int, own: OnSuccess | None) -> Loc:
    """Where a source's ``on_success`` was written: its own key, else ``[output]``'s, inherited."""
    return (kind, index, "on_success") if own is not None else ("output", "on_success")


def _format_error(path: Path | None, error: ValidationError, origins: Mapping[Loc, str]) -> str:
    """One line per fault: where it was set (the file, or the environment) and the key as the user
    wrote it (``inbox[0].recursive``) or the variable that set it."""
    lines = []
    for item in error.errors():
        base = tuple(item["loc"])
        problem = item.get("ctx", {}).get("error")

        def name(loc: Loc, base: Loc = base) -> str:
            return _named((*base, *loc), origins)

        if isinstance(problem, KeyProblem):
            loc, text = (*base, *problem.loc), problem.render(name)
        else:
            message = str(problem) if item["type"] == "value_error" else item["msg"]
            loc, text = base, f"{name(())}: {message}"
        lines.append(f"{_where(path, loc, origins)}: {text}")
    return "\n".join(lines)


def _origin(loc: Loc, origins: Mapping[Loc, str]) -> Loc | None:
    """The place a variable set that holds ``loc``: the key itself, or one whose value holds it."""
    return next((loc[:depth] for depth in range(len(loc), 0, -1) if loc[:depth] in origins), None)


def _named(loc: Loc, origins: Mapping[Loc, str]) -> str:
    origin = _origin(loc, origins)
    if origin is None:
        return config_env.shown(loc) or "(top level)"
    rest = config_env.shown(loc[len(origin):])
    return origins[origin] + (rest if rest.startswith("[") or not rest else f".{rest}")


def _where(path: Path | None, loc: Loc, origins: Mapping[Loc, str]) -> str:
    if _origin(loc, origins) is not None:
        return "environment"
    return str(path) if path else "<defaults>"


def _misshapen(data: dict[str, Any]) -> Iterator[tuple[Loc, str]]:
    """What validation would misreport: ``[inbox]`` for ``[[inbox]]`` (the likeliest slip, which
    pydantic calls "not a valid array"), and dates or times, which no key takes and JSON, which
    validation reads, cannot carry."""
    for key, field in Config.model_fields.items():
        if config_env.tables(field.annotation) and isinstance(data.get(key), dict):
            yield (key,), f"use [[{key}]], not [{key}]: an array of tables, one [[{key}]] each"
    yield from ((loc, "a date or time, which no key takes") for loc in _dates(data, ()))


def _dates(value: Any, loc: Loc) -> Iterator[Loc]:
    if isinstance(value, (datetime.date, datetime.time)):  # a datetime is a date too
        yield loc
    elif isinstance(value, dict):
        for key, inner in value.items():
            yield from _dates(inner, (*loc, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from _dates(inner, (*loc, index))


def _resolve_relative(data: dict[str, Any], base: Path) -> None:
    """Relative paths in a config file mean relative to that file, as users expect of /etc configs."""
    if isinstance(data.get("state_dir"), str):  # anything else: validation names the key
        data["state_dir"] = str(base / Path(data["state_dir"]).expanduser())
    output = data.get("output")
    for key in ("dir", "archive_dir"):
        if isinstance(output, dict) and isinstance(output.get(key), str):
            output[key] = str(base / Path(output[key]).expanduser())
    for inbox in data.get("inbox", []) or []:
        if isinstance(inbox, dict):
            for key in ("path", "quarantine_dir"):
                if isinstance(inbox.get(key), str):
                    inbox[key] = str(base / Path(inbox[key]).expanduser())
    for hook in data.get("hook", []) or []:  # a program named by a path, not a bare name looked up on PATH
        command = hook.get("command") if isinstance(hook, dict) else None
        if isinstance(command, list) and command and isinstance(command[0], str) and "/" in command[0]:
            hook["command"] = [str(base / Path(command[0]).expanduser()), *command[1:]]


def from_mapping(
    data: dict[str, Any], source: Path | None = None, origins: Mapping[Loc, str] | None = None
) -> Config:
    """Validate parsed TOML strictly: each value must already be of its key's type, as TOML types
    it (``recursive = "yes"`` is text, not true; ``2.0`` is no integer). Read as JSON, whose strict
    mode still takes text for a path and an array for a tuple, as TOML writes them."""
    origins = origins or {}
    if problems := list(_misshapen(data)):
        raise ConfigError("\n".join(
            f"{_where(source, loc, origins)}: {_named(loc, origins)}: {text}"
            for loc, text in problems
        ))  # fmt: skip
    text = json.dumps({**data, "source_file": str(source) if source else None})
    try:
        return Config.model_validate_json(text, strict=True)
    except ValidationError as exc:
        raise ConfigError(_format_error(source, exc, origins)) from None


def load(path: Path | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Load ``path``; with no path, the first default file that exists, else pure defaults; then the
    keys ``environ`` (the process's environment) sets, over the file's (``config_env``)."""
    environ = os.environ if environ is None else environ
    if path is None:
        env = environ.get("OCRWATCH_CONFIG")
        path = Path(env) if env else next((p for p in DEFAULT_CONFIG_PATHS if p.is_file()), None)
    data: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as handle:
                data = tomllib.load(handle)
        except FileNotFoundError:
            raise ConfigError(f"{path}: configuration file not found") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
        _resolve_relative(data, path.resolve().parent)
    origins = config_env.overlay(data, Config, environ)
    return from_mapping(data, path, origins)
