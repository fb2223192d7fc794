"""Configuration by environment: ``OCRWATCH_<SECTION>_<KEY>`` sets a key over the file's value.

Containers are configured this way (OCRmyPDF's and paperless-ngx's images are), so every key has a
name: the key's dotted path upper-cased and joined with ``_`` (``OCRWATCH_STATE_DIR``,
``OCRWATCH_ENGINE_KIND``, ``OCRWATCH_ENGINE_TESSERACT_LANG``); an array of tables is addressed by
index (``OCRWATCH_INBOX_0_PATH``, ``OCRWATCH_ENGINE_VLLM_LADDER_1_TEMPERATURE``). Names are found by
walking the model, so there is no second list of keys to keep in step. A name that is neither a key
nor one of ``OTHER_USES`` is refused: a variable that does nothing is a bug.
"""

from __future__ import annotations

import difflib
import sys
import types
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from ocrwatch.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before it joined the standard library
    import tomli as tomllib

PREFIX = "OCRWATCH_"

OTHER_USES = frozenset(
    {
        "OCRWATCH_CONFIG",  # the configuration file (config.load)
        "OCRWATCH_STATUS",
        "OCRWATCH_SOURCE",
        "OCRWATCH_ORIGINAL",
        "OCRWATCH_JSON",
        "OCRWATCH_MD",
        # set for hook programs (hooks), so a daemon or command a hook starts finds them
        "OCRWATCH_FAST_ENCODER",
        "OCRWATCH_ENCODER_GRAPHS",
        "OCRWATCH_NGRAM_GPU",
        "OCRWATCH_LANES",
        # set for vLLM's processes (engines.deepseek.plugin), so a reload in the daemon finds them
        "OCRWATCH_CORPUS",
        "OCRWATCH_TEST_WORKERS",
        "OCRWATCH_VLLM_LANE",
        "OCRWATCH_CRASH_SEED",  # the test suite's own
    }
)
"""``OCRWATCH_`` variables that are not keys: read or set by ocrwatch for another purpose."""

Loc = tuple[str | int, ...]
"""A key's place in the configuration: ``("inbox", 0, "path")``."""


def overlay(
    data: dict[str, Any], model: type[BaseModel], environ: Mapping[str, str]
) -> dict[Loc, str]:
    """Set each key that ``environ`` names in ``data`` (the file's parsed TOML, changed in place);
    return which variable set each place, so errors there name the variable. Applied in key order,
    so ``OCRWATCH_INBOX_1_PATH`` follows ``OCRWATCH_INBOX_0_PATH`` whichever came first."""
    found: list[tuple[Loc, str, FieldInfo]] = []
    unknown: list[str] = []
    for name in sorted(environ):
        if name.startswith(PREFIX) and name not in OTHER_USES:
            try:
                loc, field = _resolve(model, name)
            except ConfigError as exc:  # each one said, not only the first
                unknown.append(exc.message)
                continue
            found.append((loc, name, field))
    if unknown:
        raise ConfigError("\n".join(unknown))
    found.sort(key=lambda item: [(isinstance(part, int), part) for part in item[0]])
    origins: dict[Loc, str] = {}
    for loc, name, field in found:
        _place(data, model, loc, name, _value(environ[name], field))
        origins[loc] = name
    return origins


def names(model: type[BaseModel]) -> Iterator[tuple[str, Loc]]:
    """Every key's variable less ``PREFIX``, arrays of tables at index 0: what ``_resolve`` accepts,
    and the list an unknown name's suggestion is taken from."""
    for key, field in _fields(model):
        if (inner := _table(field.annotation)) is not None:
            for name, loc in names(inner):
                yield f"{key.upper()}_{name}", (key, *loc)
        elif (inner := tables(field.annotation)) is not None:
            for name, loc in names(inner):
                yield f"{key.upper()}_0_{name}", (key, 0, *loc)
        else:
            yield key.upper(), (key,)


def fields(model: type[BaseModel]) -> dict[str, FieldInfo]:
    """The keys a user writes: fields the configuration itself fills (excluded ones) are none; a
    model's tables that are no fields of it (``EngineConfig.tables``, each engine's own) are."""
    found = {key: field for key, field in model.model_fields.items() if not field.exclude}
    more = getattr(model, "tables", None)
    return found | more() if callable(more) else found


def _fields(model: type[BaseModel]) -> Iterator[tuple[str, FieldInfo]]:
    return iter(fields(model).items())


def unknown_key(model: type[BaseModel], loc: Loc) -> str:
    """What a key written at ``loc`` below ``model`` that its table lacks is told: the nearest key
    of that table (difflib, as a variable's nearest name), so a typo reads as one."""
    table: type[BaseModel] | None = model
    for part in loc[:-1]:
        if isinstance(part, int):  # an array of tables: each of its tables has the same keys
            continue
        field = fields(table).get(part) if table is not None else None
        table = None if field is None else _table(field.annotation) or tables(field.annotation)
    known = list(fields(table)) if table is not None else []
    close = difflib.get_close_matches(str(loc[-1]), known, n=1)
    return f"no such key (did you mean `{close[0]}`?)" if close else "no such key"


def _resolve(model: type[BaseModel], name: str) -> tuple[Loc, FieldInfo]:
    found = _walk(model, name[len(PREFIX) :], ())
    if found is None:
        known = [PREFIX + variable for variable, _ in names(model)]
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(
            f"environment: {name}: no such key{hint}; [section] key is OCRWATCH_<SECTION>_<KEY>,"
            " an array of tables is numbered from 0 (OCRWATCH_INBOX_0_PATH)"
        )
    loc, field = found
    if _table(field.annotation) or tables(field.annotation):
        example = next(PREFIX + key for key, place in names(model) if place[: len(loc)] == loc)
        raise ConfigError(
            f"environment: {name}: names a table, not a key: set each key, e.g. {example}"
        )
    return found


def _walk(model: type[BaseModel], rest: str, loc: Loc) -> tuple[Loc, FieldInfo] | None:
    """The key ``rest`` names below ``model``: a key's own name whole, or a table's name and
    ``_`` and a key below it (an array of tables: its name, ``_``, an index, ``_``)."""
    for key, field in _fields(model):
        upper = key.upper()
        if rest == upper:
            return (*loc, key), field
        if not rest.startswith(upper + "_"):
            continue
        tail = rest[len(upper) + 1 :]
        if (inner := _table(field.annotation)) is not None:
            if (found := _walk(inner, tail, (*loc, key))) is not None:
                return found
        elif (inner := tables(field.annotation)) is not None:
            index, _, below = tail.partition("_")
            if not (index.isdigit() and index == str(int(index)) and below):
                continue
            if (found := _walk(inner, below, (*loc, key, int(index)))) is not None:
                return found
    return None


def _place(data: dict[str, Any], model: type[BaseModel], loc: Loc, name: str, value: Any) -> None:
    """Set ``value`` at ``loc``, making the tables on the way; an array of tables the file left out
    starts as its default, so ``OCRWATCH_ENGINE_VLLM_LADDER_0_TEMPERATURE`` changes one rung of the
    default ladder rather than replacing it. Where the file's own value has the wrong shape (a
    ``[inbox]`` table for an array) nothing is set: validation reports the file's key."""
    node: Any = data
    for depth, part in enumerate(loc[:-1]):
        following = loc[depth + 1]
        if isinstance(part, int):
            if part > len(node):
                raise ConfigError(
                    f"environment: {name}: {shown(loc[:depth])} has {len(node)} table(s) (the"
                    f" file's, or the default), so [{part}] would leave [{len(node)}] unset: number"
                    " them from 0 without gaps"
                )
            if part == len(node):
                node.append({})
            node = node[part]
        else:
            if part not in node:
                node[part] = _default(model, loc[: depth + 1]) if isinstance(following, int) else {}
            node = node[part]
        if not isinstance(node, list if isinstance(following, int) else dict):
            return
    node[loc[-1]] = value


def _default(model: type[BaseModel], loc: Loc) -> list[Any]:
    """The default of the array of tables at ``loc``, as the file would write it."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, str):
            field = fields(current)[part]
            current = _table(field.annotation) or tables(field.annotation)
    default = fields(current)[str(loc[-1])].get_default(call_default_factory=True)
    return [table.model_dump(mode="json") for table in default]


def _value(raw: str, field: FieldInfo) -> Any:
    """A text key's value is the variable as written; any other's is a TOML value (``300``,
    ``true``, ``["*.pdf"]``, ``{a = 1}``), else the text itself, which only a key that also takes
    text accepts (``polling = auto``): validated as strictly as the file's values."""
    if _is_text(field.annotation):
        return raw
    try:
        parsed = tomllib.loads(f"value = {raw}")
    except tomllib.TOMLDecodeError:
        return raw
    return parsed["value"] if len(parsed) == 1 else raw  # "1\nx = 2" is not one value


def _is_text(annotation: Any) -> bool:
    origin = get_origin(annotation)
    if origin is Annotated:
        return _is_text(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return all(_is_text(arg) for arg in get_args(annotation) if arg is not type(None))
    if origin is Literal:
        return all(isinstance(arg, str) for arg in get_args(annotation))
    return annotation in (str, Path)


def _table(annotation: Any) -> type[BaseModel] | None:
    """The model of a ``[section]`` key."""
    is_model = isinstance(annotation, type) and issubclass(annotation, BaseModel)
    return annotation if is_model else None


def tables(annotation: Any) -> type[BaseModel] | None:
    """The model of an array of tables (``[[inbox]]``, a tuple of models)."""
    args = get_args(annotation)
    if get_origin(annotation) is tuple and len(args) == 2 and args[1] is Ellipsis:
        return _table(args[0])
    return None


def shown(loc: Loc) -> str:
    """``loc`` as the file writes it: ``inbox[0].path``."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text
