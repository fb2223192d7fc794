"""Sidecar names: the one rule that sinks write by and sources ignore by."""

from __future__ import annotations

from ocrwatch.naming import sidecar_names


def test_the_template_fields() -> None:
    assert sidecar_names("scan.2024.pdf", "{stem}-ocr") == {
        "md": "scan.2024-ocr.md",
        "json": "scan.2024-ocr.json",
        "error": "scan.2024-ocr.error.json",
    }
    assert sidecar_names("README", "{stem}{suffix}")["md"] == "README.md"
    assert sidecar_names("a.tif", "{stem}{suffix}.ocr")["json"] == "a.tif.ocr.json"
