"""``[[inbox]] lang``: each inbox's documents are read by Tesseract in its own languages, with the
daemon and Tesseract real (the German data comes from tesseract-ocr-deu, which tests/run.sh
installs)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from PIL import Image, ImageDraw, ImageFont

from tests.integration.conftest import DaemonProcess, sidecars_done, wait_until

pytestmark = pytest.mark.integration

# Pillow's bundled font has no umlauts
DEJAVU = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")
GERMAN = "Die Größe der Straße"


def german_page(path: Path) -> Path:
    image = Image.new("L", (1240, 400), 255)
    ImageDraw.Draw(image).text((60, 60), GERMAN, font=ImageFont.truetype(str(DEJAVU), 48), fill=0)
    image.save(path, dpi=(150, 150))
    return path


def test_each_inbox_is_read_in_its_own_language(
    tmp_path: Path, spawned: list[DaemonProcess]
) -> None:
    listed = subprocess.run(
        ["tesseract", "--list-langs"], capture_output=True, text=True
    ).stdout.split()
    if "deu" not in listed or not DEJAVU.exists():
        pytest.skip(
            "needs tesseract-ocr-deu and fonts-dejavu-core (tests/run.sh installs the first)"
        )
    german, english, auto = tmp_path / "german", tmp_path / "english", tmp_path / "auto"
    inboxes = [
        {"path": str(german), "lang": "deu", "settle_seconds": 0.2},
        {"path": str(english), "lang": "eng", "settle_seconds": 0.2},
        {"path": str(auto), "settle_seconds": 0.2},  # the default: auto
    ]
    daemon = DaemonProcess(tmp_path, inboxes, render={"rotate_pages": True})  # auto's script
    spawned.append(daemon)
    daemon.start()
    try:
        done = {}
        for inbox in (german, english, auto):
            inbox.mkdir(exist_ok=True)
            page = german_page(inbox / "brief.png")
            done[inbox] = wait_until(lambda page=page: sidecars_done(page), 60, f"{page}'s sidecar")
    finally:
        assert daemon.stop() == 0
    assert (
        done[german]["engine"]["lang"] == "deu" and GERMAN in done[german]["pages"][0]["markdown"]
    )
    assert (
        done[english]["engine"]["lang"] == "eng"
        and "Größe" not in done[english]["pages"][0]["markdown"]
    )
    # each page's own: auto reads a Latin page (as OSD finds it) in eng
    assert [done[inbox]["pages"][0]["lang"] for inbox in (german, english)] == ["deu", "eng"]
    assert done[auto]["engine"]["lang"] == "auto"
    page = done[auto]["pages"][0]
    assert (page["lang"], page["orientation"]["script"], done[auto]["status"]) == (
        "eng",
        "Latin",
        "ok",
    )
