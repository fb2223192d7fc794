"""Engines found by name, for the configuration and the registry alike: the ``ocrwatch.engines``
entry points, ocrwatch's own among them (pyproject.toml registers ``vllm``, ``tesseract`` and
``plugin``). A checkout run without being installed has no entry point of its own: its
pyproject.toml's are read instead, the same data, so there is no second list to keep.

A spec is imported only when a name is looked up (validation, a build, the order names are listed
in), never when config is, so config imports no engine and each ``[engine.<name>]`` table is the
model its engine brings.
"""

from __future__ import annotations

import functools
import importlib
import sys
from importlib.metadata import EntryPoints, PackageNotFoundError, distribution, entry_points
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before it joined the standard library
    import tomli as tomllib

ENGINE_ENTRY_POINTS = "ocrwatch.engines"
"""The entry-point group through which engines, the built-in ones too, are found by ``[engine]
kind``."""
DISTRIBUTION = "ocrwatch"
"""The distribution whose entry points are ocrwatch's own engines."""
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
"""A checkout's project file, beside the package: where an uninstalled checkout's entry points are
read."""


class NotFound(LookupError):
    """No engine of that name, or its spec does not load; ``args[0]`` says which and why."""


def _own() -> dict[str, str]:
    """ocrwatch's own engines, each with the ``"module:attribute"`` of its spec: the entry points of
    its installed distribution (looked up alone, not among every package's), else those its
    pyproject.toml declares (a checkout run without being installed)."""
    try:
        found = distribution(DISTRIBUTION).entry_points.select(group=ENGINE_ENTRY_POINTS)
    except PackageNotFoundError:
        found = EntryPoints(())
    return {entry.name: entry.value for entry in found} or _checkout()


def _checkout() -> dict[str, str]:
    """ocrwatch's own engine entry points as its pyproject.toml declares them (none where there is
    no such file beside the package: an installed wheel)."""
    try:
        project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
        return dict(project["entry-points"][ENGINE_ENTRY_POINTS])
    except (OSError, KeyError, TypeError, ValueError):
        return {}


def built_in() -> list[str]:
    """ocrwatch's own engines, in the order ``[engine] kind = "auto"`` tries them (their spec's
    ``auto``), then by name: the order their tables are documented in."""
    return sorted(_own(), key=_auto_order)


def names() -> list[str]:
    """Every engine's name: ocrwatch's own first (``built_in``), then those other packages
    register, by name."""
    own = built_in()
    others = {entry.name for entry in entry_points(group=ENGINE_ENTRY_POINTS)} - set(own)
    return [*own, *sorted(others)]


def _auto_order(name: str) -> tuple[bool, int, str]:
    try:
        place = getattr(spec(name), "auto", None)
    except NotFound:
        place = None
    return place is None, place if isinstance(place, int) else 0, name


def value(name: str) -> str | None:
    """The ``"module:attribute"`` that names the spec of ``name``: ocrwatch's own, else another
    package's entry point (the first of that name)."""
    own = _own().get(name)
    if own is not None:
        return own
    found = entry_points(group=ENGINE_ENTRY_POINTS, name=name)
    return next(iter(found)).value if found else None


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
