"""What every configuration section shares: the strict model base, the finding that names a key, the
shared value types.

Each key is declared once, as ``Field(default, description=...)``; ``configdoc`` writes
``config.example.toml`` and the key table of ``docs/configuration.md`` from these declarations.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from ocrwatch.config.env import Loc

DEFAULT_PRIORITY = 50
"""A source's lane when its configuration names none: the middle of 0..100."""

MiB = 1024 * 1024

Auto = Literal["auto"]
"""The one spelling of "ocrwatch chooses" for a key it can choose: ``"auto"``."""

OnSuccess = Literal["keep", "move", "delete"]
"""What becomes of a source once its document is ``ok`` (``[output] on_success``, per inbox and
per bucket)."""

Duplicates = Literal["reuse", "ocr"]

Format = Literal["md", "json", "alto", "hocr"]
"""A file written for each document (``[output] formats``, per inbox and per bucket)."""
SIDECARS: tuple[Format, ...] = ("md", "json")
"""The two written always: the Markdown, and the JSON, which records the others and marks the
document done."""


def _with_sidecars(value: tuple[Format, ...]) -> tuple[Format, ...]:
    """A list that names the two sidecars, each format once."""
    if not set(SIDECARS) <= set(value):
        raise ValueError(
            'must hold "md" and "json": ocrwatch always writes both (the JSON records the other '
            "files and marks the document done), e.g. ['md', 'json', 'alto']"
        )
    if len(set(value)) != len(value):
        raise ValueError("names a format twice")
    return value


Formats = Annotated[tuple[Format, ...], AfterValidator(_with_sidecars)]
"""``[output] formats``: the sidecars and, where named, ``alto`` and ``hocr``."""

TextMode = Literal["ocr", "auto", "layer"]
"""Where a PDF page's text comes from (``[[inbox]] text``, ``ocrwatch ocr --text``): always OCR, its
own text layer where that passes ``pagetext``'s test, or its layer wherever it has one."""


LANG_PATTERN = r"^[A-Za-z0-9_]+(/[A-Za-z0-9_]+)?(\+[A-Za-z0-9_]+(/[A-Za-z0-9_]+)?)*$"
Lang = Annotated[str, Field(pattern=LANG_PATTERN)]
"""Tesseract language data joined with ``+`` (``eng``, ``deu+eng``, ``script/Latin``): names
only, so a value can never read as one of Tesseract's options."""


def _not_empty(value: object) -> object:
    """An empty path would be the working folder (``Path("")`` is ``.``), whatever was meant: an
    unset variable expanded in a unit file, a key left blank. ``"."`` says that, if it is meant."""
    if value == "":
        raise ValueError('an empty path; write "." for the working folder, or remove the key')
    return value


NonEmptyPath = Annotated[Path, BeforeValidator(_not_empty)]
"""A path key: refused when empty, in the file and in the environment alike."""


class KeyProblem(ValueError):
    """A validator's finding, reported against the key the user wrote (``loc``, below the model that
    raised it), which need not be the key the validator reads. ``text`` is the message after the
    key, or a function of a namer that writes the whole line, naming other keys as the user set
    them."""

    def __init__(self, loc: Loc, text: str | Callable[[Callable[[Loc], str]], str]) -> None:
        super().__init__(text if isinstance(text, str) else "")
        self.loc = loc
        self.text = text

    def render(self, name: Callable[[Loc], str]) -> str:
        return f"{name(self.loc)}: {self.text}" if isinstance(self.text, str) else self.text(name)


class TableProblem(ValueError):
    """The faults of a table validated by a model its section does not declare (an engine's own),
    each reported below ``loc``."""

    def __init__(self, loc: Loc, errors: list[Any]) -> None:
        super().__init__(f"{len(errors)} fault(s)")
        self.loc = loc
        self.errors = errors


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def no_zero_for_auto(value: object) -> object:
    """``0``, the old spelling of "automatic", stops the load naming its key, so a file written for
    that meaning never silently gets another."""
    if value == 0 and type(value) is int:
        raise ValueError('0 no longer means automatic: write "auto"')
    return value
