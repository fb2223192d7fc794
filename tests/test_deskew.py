"""The skew angle found by the projection profile, and the page levelled by it."""

from __future__ import annotations

import pytest
from PIL import Image

from ocrwatch.pages import deskew
from tests.support import docs

LINES = [f"Line {n}: the quick brown fox jumps over the lazy dog" for n in range(1, 15)]


@pytest.mark.parametrize("lean", [-4.0, -1.5, 0.7, 3.2])
def test_a_leaning_page_is_measured(lean: float) -> None:
    """A page turned ``lean`` degrees clockwise needs ``-lean`` to be levelled, to a tenth."""
    page = deskew.straighten(docs.text_image(LINES), lean)
    assert deskew.skew_angle(page) == pytest.approx(-lean, abs=0.15)


def test_a_level_page_is_left_alone() -> None:
    assert deskew.skew_angle(docs.text_image(LINES)) == 0.0


def test_pages_without_lines_are_left_alone() -> None:
    assert deskew.skew_angle(Image.new("L", (800, 1000), 255)) == 0.0
    noise = Image.effect_noise((800, 1000), 64).convert("L")
    assert deskew.skew_angle(noise) == 0.0


def test_straighten_keeps_size_mode_and_white_corners() -> None:
    for mode in ("L", "RGB"):
        page = docs.text_image(LINES).convert(mode)
        levelled = deskew.straighten(page, 3.0)
        assert (levelled.size, levelled.mode) == (page.size, mode)
        corner = levelled.getpixel((0, 0))
        assert corner == (255 if mode == "L" else (255, 255, 255))
