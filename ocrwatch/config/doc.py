"""``config.example.toml`` and the key table of ``docs/configuration.md``, written from the keys'
own declarations (``Field(default, description=...)``), so neither can drift from the model that
loads them.

``python -m ocrwatch.config.doc --write`` rewrites both; ``--check`` exits 1 when either differs.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

import ocrwatch.config.env as config_env
from ocrwatch.config import Config

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "config.example.toml"
REFERENCE = REPO / "docs" / "configuration.md"
BEGIN, END = "<!-- config-keys:begin -->", "<!-- config-keys:end -->"
WIDTH = 100

HEADER = """\
ocrwatch configuration. Every key is optional: the value shown is the default, which works on a
fresh machine (a local ./inbox, state in ./.ocrwatch, the engine chosen automatically). Validate
with `ocrwatch check --config FILE`. Values are as strict as TOML's types: "yes" is no boolean,
2.0 no integer (an integer is taken for a float).

Environment (containers): every key can also be set by a variable, over this file's value. Its
name is OCRWATCH_ and the key's path in capitals joined by "_": state_dir is OCRWATCH_STATE_DIR,
[engine] kind is OCRWATCH_ENGINE_KIND, [engine.tesseract] lang is OCRWATCH_ENGINE_TESSERACT_LANG.
An array of tables is numbered from 0: the first [[inbox]]'s path is OCRWATCH_INBOX_0_PATH, the
second [[hook]]'s url OCRWATCH_HOOK_1_URL, [engine.vllm] ladder's first rung's temperature
OCRWATCH_ENGINE_VLLM_LADDER_0_TEMPERATURE. A number changes that table of the file (or of the
default: one ./inbox, the ladder below); the number after the last adds one
(OCRWATCH_INBOX_1_PATH beside one [[inbox]]); none is removed, and no gap is allowed.
A key that takes text (a path, a name, a choice such as "info") takes the value as written; any
other a TOML value: 300, 2.5, true, ["*.pdf", "*.png"], { size = 3 } (a table value's own keys,
as in plugin_args or prompts, are set together). An empty variable is the empty text, not unset.
A relative path in a variable is relative to the working directory. A fault names the variable
and stops the start (exit 2), as one in this file does; so does an OCRWATCH_ variable that names
no key, except those ocrwatch uses otherwise: OCRWATCH_CONFIG (this file), OCRWATCH_STATUS,
OCRWATCH_SOURCE, OCRWATCH_ORIGINAL, OCRWATCH_JSON and OCRWATCH_MD (set for hooks),
OCRWATCH_FAST_ENCODER, OCRWATCH_ENCODER_GRAPHS, OCRWATCH_NGRAM_GPU and OCRWATCH_LANES (set for
vLLM's processes), and the test suite's OCRWATCH_CORPUS, OCRWATCH_TEST_WORKERS,
OCRWATCH_VLLM_LANE and OCRWATCH_CRASH_SEED.

Relative paths: one written in this file resolves beside this file; a key left out takes its
default, which resolves against the working directory. So state_dir = ".ocrwatch" and
path = "inbox" below mean FOLDER-OF-THIS-FILE/.ocrwatch and FOLDER-OF-THIS-FILE/inbox, and this
file copied elsewhere (/etc/ocrwatch/config.toml) points them there. Write absolute paths in a
file that moves; for the systemd unit, start from systemd/config.toml instead (its paths are the
unit's own).
"""
"""What the example file says before its first key: how any key is written, not what one means."""


def _fields(model: type[BaseModel]) -> Iterator[tuple[str, FieldInfo]]:
    return iter(config_env.fields(model).items())


def _default(field: FieldInfo) -> Any:
    """The default as JSON would carry it, or the first example for a key with none."""
    if field.is_required():
        return (field.examples or [None])[0]
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, tuple) and value and isinstance(value[0], BaseModel):
        return [item.model_dump(mode="json") for item in value]
    return json.loads(json.dumps(value, default=str))


def toml_value(value: Any) -> str:
    """One TOML value; an array of tables one inline table a line, as the ladder is written."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict):
        inner = ", ".join(f"{key} = {toml_value(item)}" for key, item in value.items())
        return f"{{ {inner} }}" if inner else "{}"
    if value and all(isinstance(item, dict) for item in value):
        return "[\n" + "".join(f"  {toml_value(item)},\n" for item in value) + "]"
    return "[" + ", ".join(toml_value(item) for item in value) + "]"


def _comment(text: str, lead: str = "") -> list[str]:
    return textwrap.wrap(
        text,
        WIDTH - len(lead) - 2,
        break_on_hyphens=False,
        initial_indent=f"{lead}# ",
        subsequent_indent=f"{lead}# ",
    )


def _description(loc: str, field: FieldInfo) -> str:
    if not field.description:
        raise ValueError(f"{loc}: no description")
    return field.description


def _keys(model: type[BaseModel], where: str, off: bool) -> Iterator[str]:
    """A table's keys, each after its description; unset and commented out where it has no
    default (its example shown), or where the whole table is an example (``off``)."""
    lead = "# " if off else ""
    for key, field in _fields(model):
        if _table(field) or (model is Config and config_env.tables(field.annotation)):
            continue
        yield from (
            line.replace("# ", lead + "# ", 1) if off else line
            for line in _comment(_description(f"{where}{key}", field))
        )
        value = _default(field)
        if value is None:
            if not field.examples:
                raise ValueError(f"{where}{key}: unset by default, and no example to show")
            value, lead_key = field.examples[0], "# "
        else:
            lead_key = lead
        written = f"{key} = {toml_value(value)}".replace("\n", "\n" + lead_key)
        yield lead_key + written


def _table(field: FieldInfo) -> type[BaseModel] | None:
    """The model of a ``[section]`` key; None for any other key."""
    annotation = field.annotation
    return (
        annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    )


def _sections(model: type[BaseModel], path: str) -> Iterator[str]:
    for key, field in _fields(model):
        name = f"{path}.{key}" if path else key
        if (table := _table(field)) is not None:
            yield ""
            yield from _comment(_description(name, field))
            yield f"[{name}]"
            yield from _keys(table, f"[{name}] ", off=False)
            yield from _sections(table, name)
        elif (inner := config_env.tables(field.annotation)) and not path:
            off = not field.get_default()
            yield ""
            yield from _comment(_description(name, field))
            yield f"{'# ' if off else ''}[[{name}]]"
            yield from _keys(inner, f"[[{name}]] ", off=off)


def example() -> str:
    """The whole of ``config.example.toml``."""
    lines = [*_comment_block(HEADER), "", *_keys(Config, "", off=False), *_sections(Config, "")]
    return "\n".join(lines) + "\n"


def _comment_block(text: str) -> list[str]:
    return [f"# {line}".rstrip() for line in text.rstrip("\n").split("\n")]


def _rows(model: type[BaseModel], where: str) -> Iterator[str]:
    for key, field in _fields(model):
        name = f"{where}.{key}" if where else key
        if (table := _table(field)) is not None:
            yield from _rows(table, name)
            continue
        if (inner := config_env.tables(field.annotation)) and not where:
            yield from _rows(inner, f"[[{key}]]")
            continue
        section, _, leaf = name.rpartition(".") if where else ("", "", name)
        shown = (
            f"`{where if where.startswith('[[') else '[' + section + ']'} {leaf}`"
            if where
            else f"`{leaf}`"
        )
        value = _default(field)
        default = "unset" if value is None else f"`{toml_value(value)}`".replace("\n", " ")
        text = _description(name, field).replace("|", "\\|")
        yield f"| {shown} | {default} | {text} |"


def table() -> str:
    """The reference's key table, between its markers."""
    rows = "\n".join(_rows(Config, ""))
    return f"{BEGIN}\n| key | default | meaning |\n| --- | --- | --- |\n{rows}\n{END}"


def reference(text: str) -> str:
    """``text`` with its key table replaced by the one the declarations give."""
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[:start] + table() + text[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ocrwatch.config.doc", description=__doc__)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite both files")
    mode.add_argument("--check", action="store_true", help="exit 1 when either differs")
    args = parser.parse_args(argv)
    wanted = {EXAMPLE: example(), REFERENCE: reference(REFERENCE.read_text())}
    stale = [path for path, text in wanted.items() if path.read_text() != text]
    if args.write:
        for path in stale:
            path.write_text(wanted[path])
        return 0
    for path in stale:
        print(f"{path.name} differs from the declarations: python -m ocrwatch.config.doc --write")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
