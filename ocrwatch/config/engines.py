"""Engines found by name, for the configuration and the registry alike: the ``ocrwatch.engines``
entry points, and the built-in ones named here for a checkout whose entry points are not installed.

A spec is imported only when a name is looked up (validation, a build), never when config is, so
config imports no engine and each ``[engine.<name>]`` table is the model its engine brings.
"""

from __future__ import annotations

import functools
import importlib
from importlib.metadata import entry_points
from typing import Any

ENGINE_ENTRY_POINTS = "ocrwatch.engines"
"""The entry-point group through which engines, the built-in ones too, are found by ``[engine]
kind``."""

BUILT_IN: dict[str, str] = {
    "vllm": "ocrwatch.engines.deepseek.spec:SPEC",
    "tesseract": "ocrwatch.engines.tesseract:SPEC",
    "plugin": "ocrwatch.engines.registry:PLUGIN",
}
"""The built-in engines' specs, as pyproject.toml registers them; in the order their tables are
documented."""


class NotFound(LookupError):
    """No engine of that name, or its spec does not load; ``args[0]`` says which and why."""


def names() -> list[str]:
    """Every engine's name: the built-in ones first, then those other packages register."""
    registered = {entry.name for entry in entry_points(group=ENGINE_ENTRY_POINTS)}
    return [*BUILT_IN, *sorted(registered - set(BUILT_IN))]


def value(name: str) -> str | None:
    """The ``"module:attribute"`` that names the spec of ``name``, an entry point's first."""
    found = entry_points(group=ENGINE_ENTRY_POINTS, name=name)
    return next(iter(found)).value if found else BUILT_IN.get(name)


@functools.cache
def spec(name: str) -> Any:
    """The spec ``name`` names (an ``engines.base.EngineSpec``, checked by the registry)."""
    where = value(name)
    if where is None:
        raise NotFound(f"unknown engine {name!r} (installed: {', '.join(sorted(names()))})")
    module, _, attribute = where.partition(":")
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        raise NotFound(f"cannot load engine {name!r} ({where}): {exc}") from None


def options(name: str) -> Any:
    """The options model of engine ``name``'s table; None where the engine takes none or is
    unknown."""
    try:
        return getattr(spec(name), "options", None)
    except NotFound:
        return None
