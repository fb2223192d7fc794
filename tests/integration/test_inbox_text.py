"""``[[inbox]] text``: each inbox takes a PDF page's text where its mode says, with the daemon,
poppler and Tesseract real: ``ocr`` reads the page, Tesseract's default (``auto``) takes its good
layer, ``layer`` takes even a broken one."""

from __future__ import annotations

from pathlib import Path

import pikepdf
import pytest

from tests.integration.conftest import DaemonProcess, sidecars_done, wait_until
from tests.support import docs

pytestmark = pytest.mark.integration

LINES = [
    "The committee met on Tuesday",
    "to review the annual report.",
    "Members agreed that the",
    "budget for the coming year",
    "should be approved without",
    "further changes at all.",
]


def broken(path: Path, lines: list[str]) -> Path:
    """The layer's font mapped onto private-use codes: a layer no reader can use. Made beside the
    inbox and renamed in, so the daemon never sees the good PDF it starts as."""
    staged = path.parent.parent / f"{path.parent.name}-{path.name}"
    docs.write_pdf(staged, [lines], text_layer=True)
    cmap = (
        b"/CIDInit /ProcSet findresource begin 12 dict begin begincmap\n"
        b"1 begincodespacerange <00> <FF> endcodespacerange\n"
        b"1 beginbfrange <20> <7E> <E020> endbfrange\n"
        b"endcmap CMapName currentdict /CMap defineresource pop end end\n"
    )
    with pikepdf.open(staged, allow_overwriting_input=True) as pdf:
        pdf.pages[0].obj.Resources.Font.F1.ToUnicode = pdf.make_stream(cmap)
        pdf.save(staged)
    staged.replace(path)
    return path


def test_each_inbox_takes_the_text_its_mode_says(
    tmp_path: Path, spawned: list[DaemonProcess]
) -> None:
    modes = {"ocr": "ocr", "auto": None, "layer": "layer"}
    inboxes = [
        {"path": str(tmp_path / name), "settle_seconds": 0.2} | ({"text": mode} if mode else {})
        for name, mode in modes.items()
    ]
    daemon = DaemonProcess(tmp_path, inboxes)
    spawned.append(daemon)
    daemon.start()
    done = {}
    try:
        for name in modes:
            (tmp_path / name).mkdir(exist_ok=True)
            for kind in ("good", "broken"):
                path = tmp_path / name / f"{kind}.pdf"
                lines = [*LINES, f"Filed in the {name} inbox."]  # no two alike: none is reused
                if kind == "good":
                    docs.write_pdf(path, [lines], text_layer=True)
                else:
                    broken(path, lines)
                done[name, kind] = wait_until(
                    lambda path=path: sidecars_done(path), 90, f"{path}'s sidecar"
                )
    finally:
        assert daemon.stop() == 0
    sources = {key: data["pages"][0]["text_source"] for key, data in done.items()}
    assert sources == {
        ("ocr", "good"): "ocr",
        ("ocr", "broken"): "ocr",
        ("auto", "good"): "layer",
        ("auto", "broken"): "ocr",
        ("layer", "good"): "layer",
        ("layer", "broken"): "layer",
    }
    assert done["auto", "broken"]["pages"][0]["text_check"]["reason"] == "unreadable_codes"
    for key in (("ocr", "broken"), ("auto", "broken"), ("auto", "good")):
        assert "annual report" in done[key]["pages"][0]["markdown"], key
    assert done["ocr", "good"]["pages"][0]["text_check"] is None
