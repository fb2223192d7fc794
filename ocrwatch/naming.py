"""Sidecar names, in one place: sinks write them, and sources must know them to never take one for a document."""

from __future__ import annotations


def sidecar_names(name: str, template: str) -> dict[str, str]:
    """File names of the three sidecars for a source called ``name`` (template validated in config)."""
    stem, dot, suffix = name.rpartition(".")
    base = template.format(name=name, stem=stem if dot else name, suffix=f".{suffix}" if dot else "")
    return {"md": f"{base}.md", "json": f"{base}.json", "error": f"{base}.error.json"}
