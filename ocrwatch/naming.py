"""Sidecar names, in one place: sinks write them, and sources must know them to never take one for a
document."""

from __future__ import annotations

import re

SEARCHABLE_SUFFIX = ".ocr.pdf"
"""``NAME.ocr.pdf``: the searchable PDF (``[output] searchable_pdf``)."""
ALTO_SUFFIX = ".alto.xml"
"""``NAME.alto.xml``: the ALTO 4.4 file (``[output] formats``)."""
HOCR_SUFFIX = ".hocr"
"""``NAME.hocr``: the hOCR file (``[output] formats``)."""
LAYOUTS = {"alto": ALTO_SUFFIX, "hocr": HOCR_SUFFIX}
"""The formats of ``[output] formats`` beyond the two sidecars, each file's suffix."""
ASSETS_SUFFIX = ".assets"
"""``NAME.assets/``: the figures cut out of the pages (``[output] images = "extract"``)."""
FIGURE_FILE = re.compile(r"page-[1-9][0-9]*-figure-[1-9][0-9]*\.png")
"""The only names ocrwatch writes inside ``NAME.assets/``, and the only ones it removes there."""


def sidecar_names(name: str, template: str) -> dict[str, str]:
    """File names of the three sidecars for a source called ``name`` (template validated in
    config)."""
    base = _base(name, template)
    return {"md": f"{base}.md", "json": f"{base}.json", "error": f"{base}.error.json"}


def output_names(name: str, template: str) -> dict[str, str]:
    """Names of the further outputs beside the sidecars: the searchable PDF (``pdf``), the ALTO and
    hOCR files (``alto``, ``hocr``) and the figures' folder (``assets``)."""
    base = _base(name, template)
    return {
        "pdf": f"{base}{SEARCHABLE_SUFFIX}",
        **{kind: f"{base}{suffix}" for kind, suffix in LAYOUTS.items()},
        "assets": f"{base}{ASSETS_SUFFIX}",
    }


def is_output(path: str) -> bool:
    """Whether a path or key (``/``-separated) names a searchable PDF, an ALTO or hOCR file or a
    figure ocrwatch writes, whatever the template: such a file is never taken for a document, even
    with those outputs turned off since."""
    folder, _, name = path.rpartition("/")
    if name.lower().endswith((SEARCHABLE_SUFFIX, *LAYOUTS.values())):
        return True
    return folder.endswith(ASSETS_SUFFIX) and FIGURE_FILE.fullmatch(name) is not None


def _base(name: str, template: str) -> str:
    stem, dot, suffix = name.rpartition(".")
    return template.format(
        name=name, stem=stem if dot else name, suffix=f".{suffix}" if dot else ""
    )
