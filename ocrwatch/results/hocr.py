"""``NAME.hocr``: the document as hOCR 1.2, the XHTML that Tesseract writes and OCRmyPDF reads
(``[output] formats``).

Written with the standard library alone, from ``results.positions``, as Tesseract lays it out: one
``ocr_page`` per page (``bbox`` the page as rendered, in pixels; ``ppageno`` from 0; ``scan_res``
where its DPI is known), an ``ocr_carea`` holding one ``ocr_par`` per paragraph or grounding block
(a figure is an ``ocr_photo``), ``ocr_line``s of ``ocrx_word``s. Each has its ``bbox`` where the
engine gives one and none where it does not (``positions``); a word its ``x_wconf`` (0..100) where
the engine gives one; a line on a page whose text stands turned its ``textangle`` (counter-clockwise
degrees, a quarter turn) and, where the text stands skewed, its ``baseline`` slope, as Tesseract
writes a skewed line (tests/test_hocr.py feeds each to OCRmyPDF's hOCR reader).
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from typing import Any

from ocrwatch import __version__
from ocrwatch.results.positions import Block, Box, Line, Page, xml_text

NAMESPACE = "http://www.w3.org/1999/xhtml"
CAPABILITIES = "ocr_page ocr_carea ocr_par ocr_line ocrx_word ocr_photo ocrp_wconf"
_DESCENDERS = 0.2
"""The share of a line's height below its baseline in print, about Tesseract's ``x_descenders``."""
_HEAD = (
    '<?xml version="1.0" encoding="UTF-8"?>\n'
    '<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0 Transitional//EN"\n'
    '    "http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd">\n'
)


def document(pages: Sequence[Page], source: str, engine: Mapping[str, Any]) -> bytes:
    """The hOCR file of a document whose source is named ``source``, read by ``engine`` (its JSON
    description)."""
    root = ET.Element("html", {"xmlns": NAMESPACE})
    head = ET.SubElement(root, "head")
    ET.SubElement(head, "title").text = xml_text(source)
    ET.SubElement(
        head, "meta", {"http-equiv": "Content-Type", "content": "text/html;charset=utf-8"}
    )
    system = f"ocrwatch {__version__} ({engine.get('name') or 'engine'})"
    ET.SubElement(head, "meta", {"name": "ocr-system", "content": xml_text(system)})
    ET.SubElement(head, "meta", {"name": "ocr-capabilities", "content": CAPABILITIES})
    body = ET.SubElement(root, "body")
    for page in pages:
        _page(body, page)
    ET.indent(root, space=" ")
    return (_HEAD + ET.tostring(root, encoding="unicode") + "\n").encode("utf-8")


def _page(body: ET.Element, page: Page) -> None:
    title = [f"bbox 0 0 {page.width} {page.height}", f"ppageno {page.number - 1}"]
    if page.dpi:
        title.append(f"scan_res {round(page.dpi)} {round(page.dpi)}")
    element = ET.SubElement(
        body, "div", {"class": "ocr_page", "id": f"page_{page.number}", "title": "; ".join(title)}
    )
    for number, block in enumerate(page.blocks, 1):
        _block(element, block, page, f"{page.number}_{number}")


def _block(page_element: ET.Element, block: Block, page: Page, ident: str) -> None:
    if block.figure:
        ET.SubElement(page_element, "div", _said("ocr_photo", f"photo_{ident}", block.box))
        return
    area = ET.SubElement(page_element, "div", _said("ocr_carea", f"block_{ident}", block.box))
    paragraph = ET.SubElement(area, "p", _said("ocr_par", f"par_{ident}", block.box))
    for number, line in enumerate(block.lines, 1):
        line_id = f"{ident}_{number}"
        row = ET.SubElement(
            paragraph, "span", _said("ocr_line", f"line_{line_id}", line.box, _stands(page, line))
        )
        for index, word in enumerate(line.words, 1):  # ``ET.indent`` parts them by whitespace
            conf = [f"x_wconf {round(word.conf * 100)}"] if word.conf is not None else []
            span = _said("ocrx_word", f"word_{line_id}_{index}", word.box, conf)
            ET.SubElement(row, "span", span).text = xml_text(word.text)


def _stands(page: Page, line: Line) -> list[str]:
    """How a line's text stands on the page, as Tesseract says it and OCRmyPDF reads it: a quarter
    turn as its ``textangle``; a skew as its ``baseline``, from the box's lowest corner raised by
    the line's descenders (given a ``textangle`` of a few degrees, OCRmyPDF sizes the line by its
    box turned again: its words' boxes up to two thirds taller than with the baseline)."""
    quarter = round(page.rotation / 90) % 4 * 90
    skew = (page.rotation - quarter + 180) % 360 - 180
    said = [f"textangle {quarter}"] if quarter else []
    if skew and line.box is not None:
        slope = -math.tan(math.radians(skew))  # the page's y runs down: text rising has slope < 0
        left, top, right, bottom = line.box
        length, thickness = right - left, bottom - top
        if quarter in (90, 270):  # OCRmyPDF measures the line turned back by its textangle
            length, thickness = thickness, length
        descent = _DESCENDERS * (thickness - length * abs(slope))
        said.append(f"baseline {slope:.3f} {round(-max(slope, 0.0) * length - descent)}")
    return said


def _said(kind: str, ident: str, box: Box | None, more: Sequence[str] = ()) -> dict[str, str]:
    """An element's class, id and title: its ``bbox`` where known, then ``more``."""
    properties = [f"bbox {' '.join(map(str, box))}"] if box is not None else []
    properties += more
    attributes = {"class": kind, "id": ident}
    if properties:
        attributes["title"] = "; ".join(properties)
    return attributes
