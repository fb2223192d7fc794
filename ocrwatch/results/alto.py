"""``NAME.alto.xml``: the document as ALTO 4.4, the Library of Congress's format for OCR text and
its layout, which libraries and archives keep (``[output] formats``).

Written with the standard library alone, from ``results.positions``: one ``Page`` per page, in
pixels (``MeasurementUnit`` ``pixel``) of the page as rendered, ``ROTATION`` the angle its text
stands at there and ``PC`` its words' mean confidence where the engine gives one. Each page points
(``PROCESSING``) at a ``Processing`` step of its own that says what read it and its size: pixels,
DPI and millimetres where the DPI is known (ALTO measures in one unit only). A paragraph or
grounding block is a ``TextBlock`` (its label, where not plain text, a ``LayoutTag``: ``title``,
``table``), a figure an ``Illustration``; each line a ``TextLine`` of ``String``s parted by
``SP``, each with its box and ``WC`` where the engine gives one, and none where it does not
(``positions``).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from typing import Any

from ocrwatch import __version__
from ocrwatch.results.positions import Block, Box, Page, xml_text

NAMESPACE = "http://www.loc.gov/standards/alto/ns-v4#"
SCHEMA_LOCATION = f"{NAMESPACE} http://www.loc.gov/alto/v4/alto-4-4.xsd"
_XSI = "http://www.w3.org/2001/XMLSchema-instance"


def document(pages: Sequence[Page], source: str, engine: Mapping[str, Any], when: str) -> bytes:
    """The ALTO file of a document whose source is named ``source``, read by ``engine`` (its JSON
    description) and finished at ``when`` (ISO 8601)."""
    root = ET.Element(
        "alto",
        {
            "xmlns": NAMESPACE,
            "xmlns:xsi": _XSI,
            "xsi:schemaLocation": SCHEMA_LOCATION,
            "SCHEMAVERSION": "4.4",
        },
    )
    description = ET.SubElement(root, "Description")
    ET.SubElement(description, "MeasurementUnit").text = "pixel"
    image = ET.SubElement(description, "sourceImageInformation")
    ET.SubElement(image, "fileName").text = xml_text(source)
    for page in pages:
        _processing(description, page, engine, when)
    kinds = sorted({block.kind for page in pages for block in page.blocks} - {"text"})
    tags = {kind: f"layout_{number}" for number, kind in enumerate(kinds, 1)}
    if tags:
        listed = ET.SubElement(root, "Tags")
        for kind, ident in tags.items():
            ET.SubElement(listed, "LayoutTag", {"ID": ident, "LABEL": xml_text(kind)})
    layout = ET.SubElement(root, "Layout")
    for page in pages:
        _page(layout, page, tags)
    ET.indent(root, space=" ")
    text = ET.tostring(root, encoding="unicode")
    return f'<?xml version="1.0" encoding="UTF-8"?>\n{text}\n'.encode()


def _processing(description: ET.Element, page: Page, engine: Mapping[str, Any], when: str) -> None:
    step = ET.SubElement(description, "Processing", {"ID": f"processing_{page.number}"})
    ET.SubElement(step, "processingCategory").text = "contentGeneration"
    ET.SubElement(step, "processingDateTime").text = when
    said = f"page {page.number} read by {_engine(engine)}" if page.read else "not read"
    ET.SubElement(step, "processingStepDescription").text = xml_text(said)
    ET.SubElement(step, "processingStepSettings").text = settings(page)
    software = ET.SubElement(step, "processingSoftware")
    ET.SubElement(software, "softwareName").text = "ocrwatch"
    ET.SubElement(software, "softwareVersion").text = __version__


def settings(page: Page) -> str:
    """The page's size and turn in words: ``2480 x 3508 px; 300 dpi; 210.0 x 297.0 mm; text
    rotated 90 degrees``."""
    parts = [f"{page.width} x {page.height} px"]
    if page.dpi and (size := page.millimetres):
        parts += [f"{page.dpi:g} dpi", f"{size[0]:g} x {size[1]:g} mm"]
    if page.rotation:
        parts.append(f"text rotated {page.rotation:g} degrees counter-clockwise")
    return "; ".join(parts)


def _engine(engine: Mapping[str, Any]) -> str:
    """``tesseract 5.3.0 (eng)``, ``vllm deepseek-ai/DeepSeek-OCR-2``."""
    name = str(engine.get("name") or "an engine")
    model = engine.get("model") or engine.get("version")
    lang = engine.get("lang")
    return f"{name}{f' {model}' if model else ''}{f' ({lang})' if lang else ''}"


def _page(layout: ET.Element, page: Page, tags: Mapping[str, str]) -> None:
    attributes = {
        "ID": f"page_{page.number}",
        "PHYSICAL_IMG_NR": str(page.number),
        "WIDTH": str(page.width),
        "HEIGHT": str(page.height),
        "PROCESSING": f"processing_{page.number}",
    }
    if page.rotation:
        attributes["ROTATION"] = f"{page.rotation:g}"
    if (conf := page.conf) is not None:
        attributes["PC"] = f"{conf:g}"
    element = ET.SubElement(layout, "Page", attributes)
    space = ET.SubElement(
        element, "PrintSpace", _position((0, 0, page.width, page.height), f"space_{page.number}")
    )
    for number, block in enumerate(page.blocks, 1):
        _block(space, block, f"p{page.number}_b{number}", tags)


def _block(space: ET.Element, block: Block, ident: str, tags: Mapping[str, str]) -> None:
    """A paragraph or grounding block; its label (``tags``: each label's ``LayoutTag``), where it is
    not plain text."""
    attributes = _position(block.box, ident)
    if block.kind in tags:
        attributes["TAGREFS"] = tags[block.kind]
    if block.figure:
        ET.SubElement(space, "Illustration", {**attributes, "TYPE": block.kind})
        return
    element = ET.SubElement(space, "TextBlock", attributes)
    for number, line in enumerate(block.lines, 1):
        line_id = f"{ident}_l{number}"
        row = ET.SubElement(element, "TextLine", _position(line.box, line_id))
        for index, word in enumerate(line.words, 1):
            if index > 1:
                ET.SubElement(row, "SP")
            string = _position(word.box, f"{line_id}_w{index}")
            string["CONTENT"] = xml_text(word.text)
            if word.conf is not None:
                string["WC"] = f"{word.conf:g}"
            ET.SubElement(row, "String", string)


def _position(box: Box | None, ident: str) -> dict[str, str]:
    """An element's ``ID`` and, where known, its box as ALTO writes one."""
    attributes = {"ID": ident}
    if box is not None:
        left, top, right, bottom = box
        attributes |= {
            "HPOS": str(left),
            "VPOS": str(top),
            "WIDTH": str(right - left),
            "HEIGHT": str(bottom - top),
        }
    return attributes
