"""One frozen configuration, loaded from TOML and validated once at start.

Every key has a default that works on a fresh machine, so ``ocrwatch run`` with no file at all
watches ``./inbox`` and keeps state in ``./.ocrwatch``. Any key can also be set by an environment
variable (``config_env``), over the file's value. Values are taken as strictly as TOML types them
(``"yes"`` is no boolean). Errors name the file and the key as the user wrote it, or the variable.
The sections are declared in ``config_sections`` and ``config_sources``, each engine's own table in
its package; this module composes them, checks what spans sections, and loads.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, ValidationError, model_validator

import ocrwatch.config.env as config_env
from ocrwatch.config.base import (
    DEFAULT_PRIORITY,
    SIDECARS,
    Duplicates,
    Format,
    KeyProblem,
    MiB,
    Model,
    NonEmptyPath,
    OnSuccess,
    TableProblem,
    TextMode,
)
from ocrwatch.config.engines import ENGINE_ENTRY_POINTS
from ocrwatch.config.env import Loc
from ocrwatch.config.roots import Root, RootKind, read_file, trusted_file
from ocrwatch.config.sections import (
    DaemonConfig,
    EngineConfig,
    LimitsConfig,
    LogConfig,
    MetricsConfig,
    OutputConfig,
    RenderConfig,
    RetryConfig,
    SchedulerConfig,
)
from ocrwatch.config.sources import HookConfig, HookStatus, InboxConfig, S3Config
from ocrwatch.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before it joined the standard library
    import tomli as tomllib

__all__ = [
    "DEFAULT_PRIORITY",
    "ENGINE_ENTRY_POINTS",
    "SIDECARS",
    "MiB",
    "Config",
    "DaemonConfig",
    "Duplicates",
    "EngineConfig",
    "Format",
    "HookConfig",
    "HookStatus",
    "InboxConfig",
    "KeyProblem",
    "LimitsConfig",
    "LogConfig",
    "MetricsConfig",
    "OnSuccess",
    "OutputConfig",
    "RenderConfig",
    "RetryConfig",
    "S3Config",
    "SchedulerConfig",
    "TextMode",
    "from_mapping",
    "load",
]

DEFAULT_CONFIG_PATHS = (Path("ocrwatch.toml"), Path("/etc/ocrwatch/config.toml"))


class Config(Model):
    state_dir: NonEmptyPath = Field(
        Path(".ocrwatch"),
        description=(
            "Where the ledger (SQLite) and temporary files live. Under systemd/ocrwatch.service: "
            "its"
            ' StateDirectory=, "/var/lib/ocrwatch" (as systemd/config.toml sets it).'
        ),
    )
    engine: EngineConfig = Field(
        default_factory=EngineConfig, description="The engine that reads the pages."
    )
    render: RenderConfig = Field(RenderConfig(), description="How pages become images.")
    limits: LimitsConfig = Field(LimitsConfig(), description="What a document may be at most.")
    output: OutputConfig = Field(OutputConfig(), description="Sidecars, outputs, the source after.")
    log: LogConfig = Field(LogConfig(), description="Log lines.")
    metrics: MetricsConfig = Field(MetricsConfig(), description="Metrics and health endpoints.")
    scheduler: SchedulerConfig = Field(
        SchedulerConfig(), description="Pages and documents at once."
    )
    retry: RetryConfig = Field(RetryConfig(), description="A document's attempts.")
    daemon: DaemonConfig = Field(DaemonConfig(), description="The daemon's own clocks.")
    inbox: tuple[InboxConfig, ...] = Field(
        (InboxConfig(),),
        description=("Any number of inboxes. With none configured, ./inbox is watched."),
    )
    s3: tuple[S3Config, ...] = Field(
        (), description=("S3 sources (none by default): one [[s3]] per event stream.")
    )
    hook: tuple[HookConfig, ...] = Field(
        (),
        description=(
            "Completion hooks (none by default): one [[hook]] per program to run, or URL to POST "
            "to, once a document's final status is known. Each gets the document's result JSON "
            "(the JSON sidecar for ok and partial, the error document for failed). Delivery is at "
            "least once: recorded in the ledger before the sidecars are written, retried with "
            "backoff, resumed after a restart or a crash. A failing hook never fails the document."
        ),
    )
    source_file: Path | None = Field(default=None, exclude=True)
    set_by: tuple[tuple[str, str], ...] = Field(default=(), exclude=True)
    """Each key an environment variable set (``inbox[0].path``), with the variable, or a flag of the
    command line (``ocrwatch ocr --engine``), with the flag: what a message about that key names."""

    @model_validator(mode="after")
    def _inboxes_distinct(self) -> Config:
        seen: dict[Path, int] = {}
        for index, inbox in enumerate(self.inbox):
            resolved = inbox.path.expanduser().resolve()
            if resolved in seen:
                first = ("inbox", seen[resolved], "path")
                # raised at once: no later pass of the loop rebinds what the message reads
                raise KeyProblem(
                    ("inbox", index, "path"),
                    lambda name: (
                        f"{name(('inbox', index, 'path'))}: same folder as {name(first)} "  # noqa: B023
                        f"({resolved})"  # noqa: B023
                    ),
                )
            seen[resolved] = index
        return self

    @model_validator(mode="after")
    def _inboxes_not_nested(self) -> Config:
        """A folder inside a recursive inbox is watched by both inboxes, so each document in it
        would be processed twice; compared resolved, since a link or ``..`` can hide the nesting."""
        roots = [inbox.path.expanduser().resolve() for inbox in self.inbox]
        for outer, (root, inbox) in enumerate(zip(roots, self.inbox, strict=True)):
            if not inbox.recursive:
                continue
            for inner, other in enumerate(roots):
                if other != root and other.is_relative_to(root):
                    raise KeyProblem(("inbox", inner, "path"), _nested(inner, other, outer, root))
        return self

    @model_validator(mode="after")
    def _prompts_exist(self) -> Config:
        """Every source's prompt, an inbox's and a bucket's alike: ``prompt_text`` never misses."""
        known = self.engine.vllm.presets()
        for kind in ("inbox", "s3"):
            for index, source in enumerate(getattr(self, kind)):
                if source.prompt not in known:
                    said = f"unknown preset {source.prompt!r} (known: {sorted(known)})"
                    raise KeyProblem((kind, index, "prompt"), said)
        return self

    @model_validator(mode="after")
    def _archives_apart(self) -> Config:
        """A move needs a place to go that is no document's source: an archive inside an inbox (or a
        prefix a bucket watches) would bring every archived file back as a new document."""
        default = self.output.on_success
        archive = (
            self.output.archive_dir.expanduser().resolve() if self.output.archive_dir else None
        )
        for index, inbox in enumerate(self.inbox):
            root = inbox.path.expanduser().resolve()
            if archive is None:
                if (inbox.on_success or default) == "move":
                    raise KeyProblem(
                        _written("inbox", index, inbox.on_success),
                        "'move' needs [output] archive_dir",
                    )
            elif archive.is_relative_to(root) or root.is_relative_to(archive):
                where = ("inbox", index, "path")
                raise KeyProblem(  # raised at once, as above
                    ("output", "archive_dir"),
                    lambda name: (
                        f"{name(('output', 'archive_dir'))}: {archive} and {name(where)} {root}"  # noqa: B023
                        " must not contain one another"
                    ),
                )
        for index, s3 in enumerate(self.s3):
            if (s3.on_success or default) == "move" and not s3.archive_prefix:
                raise KeyProblem(  # raised at once, as above
                    _written("s3", index, s3.on_success),
                    lambda name: (
                        f"{name(_written('s3', index, s3.on_success))}: 'move' needs"  # noqa: B023
                        f" {name(('s3', index, 'archive_prefix'))}"  # noqa: B023
                    ),
                )
        return self

    @model_validator(mode="after")
    def _hook_names_distinct(self) -> Config:
        names = [hook.name for hook in self.hook]
        for index, name in enumerate(names):
            if name in names[:index]:
                first = names.index(name)
                said = f"{name!r} is taken by hook[{first}]; give each a name"
                raise KeyProblem(("hook", index, "name"), said)
        return self

    def key(self, loc: Loc) -> str:
        """The key at ``loc`` as the user set it: the variable that set it, else as ``check``
        writes a key (``state_dir``, ``[output] dir``, ``inbox[0].path``)."""
        shown = config_env.shown(loc)
        variable = dict(self.set_by).get(shown)
        if variable is not None:
            return variable
        if len(loc) == 2 and isinstance(loc[1], str):
            return f"[{loc[0]}] {loc[1]}"
        return shown

    def roots(self) -> tuple[Root, ...]:
        """Every root of this configuration (``roots``: the trust rule), named as the user set it:
        the configuration file, ``state_dir``, the inboxes with their quarantines, ``[output]``'s
        folders, and the files secrets are read from."""
        found = []
        if self.source_file is not None:
            held = ", ".join(self._inline_secrets())
            found.append(
                Root("config", self.source_file, "file", str(self.source_file), False, held)
            )
        found.append(self._root(("state_dir",), self.state_dir, "state"))
        for index, inbox in enumerate(self.inbox):
            root = self._root(("inbox", index, "path"), inbox.path, "inbox", make=inbox.create)
            found.append(dataclasses.replace(root, inbox=inbox))
            if inbox.quarantine_dir is not None:
                found.append(self._root(("inbox", index, "quarantine_dir"), inbox.quarantine_dir))
        for key in ("dir", "archive_dir"):
            if (path := getattr(self.output, key)) is not None:
                found.append(self._root(("output", key), path))
        for kind, tables in (("s3", self.s3), ("hook", self.hook)):
            for index, table in enumerate(tables):
                for key in _SECRET_KEYS:
                    path = getattr(table, f"{key}_file", None)
                    if path is not None:
                        loc = (kind, index, f"{key}_file")
                        found.append(
                            self._root(loc, path, "file", secrets=self.key(loc[:2] + (key,)))
                        )
        return tuple(found)

    def _root(
        self,
        loc: Loc,
        path: Path,
        kind: RootKind = "folder",
        *,
        make: bool = True,
        secrets: str = "",
    ) -> Root:
        where = "environment" if config_env.shown(loc) in dict(self.set_by) else self._file()
        return Root(self.key(loc), path, kind, where, make and kind != "file", secrets)

    def _file(self) -> str:
        return str(self.source_file) if self.source_file else "<defaults>"

    def _inline_secrets(self) -> Iterator[str]:
        """The secrets the configuration file itself holds (not the environment, not a file)."""
        variables = dict(self.set_by)
        for kind, tables in (("s3", self.s3), ("hook", self.hook)):
            for index, table in enumerate(tables):
                for key in _SECRET_KEYS:
                    value = getattr(table, key, None)
                    if key == "url" and value is not None and urlsplit(value).password is None:
                        continue  # an AMQP URL without a password is no secret
                    shown = config_env.shown((kind, index, key))
                    unset = getattr(table, f"{key}_file", None) is None
                    if value is not None and shown not in variables and unset:
                        yield shown

    def with_secrets(self) -> Config:
        """This configuration with each secret a ``*_file`` key names read into its key (its first
        line), the file trusted as a root first (``roots.read_file``): what ``run`` starts with and
        ``check`` probes with. ``ConfigError`` naming the key when one cannot be read."""
        secrets = {root.key: root for root in self.roots() if root.kind == "file" and root.secrets}
        updated: dict[str, Any] = {}
        for kind in ("s3", "hook"):
            tables = []
            for index, table in enumerate(getattr(self, kind)):
                values = {}
                for key in _SECRET_KEYS:
                    if key != "url" and getattr(table, f"{key}_file", None) is not None:
                        root = secrets[self.key((kind, index, f"{key}_file"))]
                        values[key] = _first_line(root)
                tables.append(table.model_copy(update=values) if values else table)
            updated[kind] = tuple(tables)
        return self.model_copy(update=updated)

    def prompt_text(self, preset: str) -> str:
        """A source's prompt; its preset was checked at load (``_prompts_exist``)."""
        text: str = self.engine.vllm.prompt(preset)
        return text

    def inbox_lang(self, root: Path) -> str | None:
        """The ``lang`` of the inbox whose resolved folder is ``root``; None: ``[engine.tesseract]
        lang``."""
        found = (
            inbox.lang
            for inbox in self.inbox
            if inbox.lang and inbox.path.expanduser().resolve() == root
        )
        return next(found, None)

    def inbox_formats(self, root: Path) -> tuple[Format, ...]:
        """The ``formats`` of the inbox whose resolved folder is ``root``, else ``[output]``'s."""
        found = (
            inbox.formats
            for inbox in self.inbox
            if inbox.formats and inbox.path.expanduser().resolve() == root
        )
        return next(found, self.output.formats)


_SECRET_KEYS = ("secret_access_key", "token", "url")
"""The keys of a ``[[s3]]`` or ``[[hook]]`` that hold a secret, each with its ``*_file`` (``url``:
``url_file``, which ``sources.amqpmessages`` reads itself)."""


def _first_line(root: Root) -> str:
    """The secret in the file ``root``: its first line, without the line's end."""
    try:
        data = read_file(root)
    except OSError as exc:
        said = (exc.strerror or str(exc)).lower()
        raise ConfigError(f"{root.where}: {root.key} {root.path}: cannot be read: {said}") from None
    try:
        line = (data.decode("utf-8").splitlines() or [""])[0]
    except UnicodeDecodeError:
        raise ConfigError(f"{root.where}: {root.key} {root.path}: not UTF-8 text") from None
    if not line.strip():
        raise ConfigError(f"{root.where}: {root.key} {root.path}: its first line is empty")
    return line


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
    for item in _auto_merged(list(_flat(error.errors()))):
        base = tuple(item["loc"])
        problem = item.get("ctx", {}).get("error")

        def name(loc: Loc, base: Loc = base) -> str:
            return _named((*base, *loc), origins)

        if isinstance(problem, KeyProblem):
            loc, text = (*base, *problem.loc), problem.render(name)
        elif item["type"] == "extra_forbidden":  # a typo, said as one: the nearest key named
            loc, text = base, f"{name(())}: {config_env.unknown_key(Config, base)}"
        else:
            message = str(problem) if item["type"] == "value_error" else item["msg"]
            loc, text = base, f"{name(())}: {message}"
        lines.append(f"{_where(path, loc, origins)}: {text}")
    return "\n".join(lines)


def _flat(items: list[Any]) -> Iterator[Any]:
    """Each fault of an engine's table in its own place below the table, as the section's are."""
    for item in items:
        problem = item.get("ctx", {}).get("error")
        if isinstance(problem, TableProblem):
            below = (*item["loc"], *problem.loc)
            yield from ({**inner, "loc": (*below, *inner["loc"])} for inner in problem.errors)
        else:
            yield item


def _auto_merged(items: list[Any]) -> Iterator[Any]:
    """A key that takes a value or ``"auto"`` fails once, not once per member of its union
    (pydantic names each member, ``dpi.constrained-int`` and ``dpi.literal['auto']``)."""
    autos = {
        tuple(item["loc"][:-1])
        for item in items
        if item["loc"] and str(item["loc"][-1]).startswith("literal['auto'")
    }
    for item in items:
        key = tuple(item["loc"][:-1])
        if key not in autos:
            yield item
        elif not str(item["loc"][-1]).startswith("literal["):
            yield {**item, "loc": key, "msg": f'{item["msg"]}, or "auto"'}


def _origin(loc: Loc, origins: Mapping[Loc, str]) -> Loc | None:
    """The place a variable set that holds ``loc``: the key itself, or one whose value holds it."""
    return next((loc[:depth] for depth in range(len(loc), 0, -1) if loc[:depth] in origins), None)


def _named(loc: Loc, origins: Mapping[Loc, str]) -> str:
    origin = _origin(loc, origins)
    if origin is None:
        return config_env.shown(loc) or "(top level)"
    rest = config_env.shown(loc[len(origin) :])
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
    """Relative paths in a config file mean relative to that file, as users expect of /etc
    configs. An empty one stays empty, for validation to refuse (``NonEmptyPath``)."""
    places: list[tuple[Any, tuple[str, ...]]] = [(data, ("state_dir",))]
    places.append((data.get("output"), ("dir", "archive_dir")))
    places += [(inbox, ("path", "quarantine_dir")) for inbox in data.get("inbox", []) or []]
    for table, keys in places:
        for key in keys if isinstance(table, dict) else ():
            if isinstance(table.get(key), str) and table[key]:  # else: validation names the key
                table[key] = str(base / Path(table[key]).expanduser())
    # a program named by a path, not a bare name looked up on PATH
    for hook in data.get("hook", []) or []:
        command = hook.get("command") if isinstance(hook, dict) else None
        if (
            isinstance(command, list)
            and command
            and isinstance(command[0], str)
            and "/" in command[0]
        ):
            hook["command"] = [str(base / Path(command[0]).expanduser()), *command[1:]]


def from_mapping(
    data: dict[str, Any], source: Path | None = None, origins: Mapping[Loc, str] | None = None
) -> Config:
    """Validate parsed TOML strictly: each value must already be of its key's type, as TOML types
    it (``recursive = "yes"`` is text, not true; ``2.0`` is no integer). Read as JSON, whose strict
    mode still takes text for a path and an array for a tuple, as TOML writes them."""
    origins = origins or {}
    if problems := list(_misshapen(data)):
        raise ConfigError(
            "\n".join(
                f"{_where(source, loc, origins)}: {_named(loc, origins)}: {text}"
                for loc, text in problems
            )
        )
    set_by = [[config_env.shown(loc), name] for loc, name in origins.items()]
    text = json.dumps({**data, "source_file": str(source) if source else None, "set_by": set_by})
    try:
        return Config.model_validate_json(text, strict=True)
    except ValidationError as exc:
        raise ConfigError(_format_error(source, exc, origins)) from None


def discover(environ: Mapping[str, str] | None = None) -> tuple[Path | None, list[str]]:
    """The configuration file to read when none is named: ``$OCRWATCH_CONFIG``, else the first of
    ``DEFAULT_CONFIG_PATHS`` that is a file, else none (the defaults); and a line for each file
    passed over. A file in the working folder is one someone else may have left there (a shared
    inbox): it is taken only where it passes the trust rule (``roots``: the user's own or root's,
    writable by no one else), else passed over with its line, and the search goes on, to the
    system's own file where there is one. ``/etc``'s is the system's: a fault there is refused at
    load, never passed over."""
    environ = os.environ if environ is None else environ
    if env := environ.get("OCRWATCH_CONFIG"):
        return Path(env), []
    skipped = []
    for path in DEFAULT_CONFIG_PATHS:
        if not path.is_file():
            continue
        if not path.is_absolute():
            why = trusted_file(_config_root(path.absolute()))
            if why is not None:
                skipped.append(
                    f"ocrwatch: {path.absolute()} passed over, not read: {why}; give it with"
                    " --config once it is yours"
                )
                continue
        return path, skipped
    return None, skipped


def _config_root(path: Path) -> Root:
    return Root("config", path, "file", str(path))


def _read(path: Path) -> dict[str, Any]:
    """The configuration file ``path``, trusted first (``roots.read_file``), parsed."""
    try:
        raw = read_file(_config_root(path))
    except FileNotFoundError:
        raise ConfigError(f"{path}: configuration file not found") from None
    except OSError as exc:
        said = (exc.strerror or str(exc)).lower()
        raise ConfigError(f"{path}: configuration file cannot be read: {said}") from None
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not valid TOML: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None


def load(path: Path | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Load ``path``, once it passes the trust rule (``roots``: a configuration file another user
    may write could make ocrwatch run what they chose); with no path, the one ``discover`` finds,
    else pure defaults; then the keys ``environ`` (the process's environment) sets, over the
    file's (``config_env``)."""
    environ = os.environ if environ is None else environ
    if path is None:
        path, _ = discover(environ)  # the command line says what was passed over
    data: dict[str, Any] = {}
    if path is not None:
        data = _read(path)
        _resolve_relative(data, path.resolve().parent)
    origins = config_env.overlay(data, Config, environ)
    return from_mapping(data, path, origins)
