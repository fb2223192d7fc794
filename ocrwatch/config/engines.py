"""Engines found by name, for the configuration and the registry alike: the ``ocrwatch.engines``
entry points, ocrwatch's own among them (pyproject.toml registers ``vllm``, ``tesseract`` and
``plugin``). A checkout run without being installed has no entry point of ocrwatch's own: its
pyproject.toml's are read instead, the same data, so there is no second list to keep.

A spec is imported only when a name is looked up (validation, a build, the order names are listed
in), never when config is, so config imports no engine and each ``[engine.<name>]`` table is the
model its engine brings.
"""

from __future__ import annotations

import functools
import importlib
import sys
from importlib.metadata import EntryPoint, entry_points
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
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
"""A checkout's project file, beside the package: where an uninstalled checkout's entry points are
read."""


class NotFound(LookupError):
    """No engine of that name, or its spec does not load; ``args[0]`` says which and why."""


def _own(entry: EntryPoint) -> bool:
    dist = getattr(entry, "dist", None)
    return dist is not None and dist.name == DISTRIBUTION


def _checkout() -> dict[str, str]:
    """ocrwatch's own engine entry points as its pyproject.toml declares them (none where there is
    no such file beside the package: an installed wheel)."""
    try:
        project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
        return dict(project["entry-points"][ENGINE_ENTRY_POINTS])
    except (OSError, KeyError, TypeError, ValueError):
        return {}


def _registered() -> dict[str, tuple[str, bool]]:
    """Every engine's name: the ``"module:attribute"`` of its spec (an entry point's first), and
    whether it is ocrwatch's own."""
    found: dict[str, tuple[str, bool]] = {}
    for entry in entry_points(group=ENGINE_ENTRY_POINTS):
        found.setdefault(entry.name, (entry.value, _own(entry)))
    if not any(own for _, own in found.values()):
        for name, where in _checkout().items():
            found.setdefault(name, (where, True))
    return found


def built_in() -> list[str]:
    """ocrwatch's own engines, in the order ``names`` lists them."""
    registered = _registered()
    return [name for name in names() if registered[name][1]]


def names() -> list[str]:
    """Every engine's name: ocrwatch's own first, in the order ``[engine] kind = "auto"`` tries them
    (their spec's ``auto``) and then by name, then those other packages register, by name."""
    registered = _registered()
    own = sorted((name for name, (_, ours) in registered.items() if ours), key=_auto_order)
    return [*own, *sorted(name for name, (_, ours) in registered.items() if not ours)]


def _auto_order(name: str) -> tuple[bool, int, str]:
    try:
        place = getattr(spec(name), "auto", None)
    except NotFound:
        place = None
    return place is None, place if isinstance(place, int) else 0, name


def value(name: str) -> str | None:
    """The ``"module:attribute"`` that names the spec of ``name``, an entry point's first."""
    found = _registered().get(name)
    return found[0] if found is not None else None


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
