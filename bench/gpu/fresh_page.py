"""A one-page PDF no run has seen: an A4 page of prose at 300 dpi, its words drawn from a seed.

The urgent page of e2e.py must be new to the daemon: a copy of a page it already did is answered
by duplicate reuse from the ledger (the bytes' sha256), in a fraction of a second, and vLLM's
prefix cache would spare its prefill. The page is a scan-like raster PDF of about 45 lines of text,
upright, so it costs what a corpus page costs: rendering, orientation detection, one page of
decoding. Equal seeds give equal pages; ``solo`` and ``urgent`` use different seeds.

    python3 bench/gpu/fresh_page.py OUT.pdf [SEED]
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

VOCABULARY = """
the of and to in is that for it as was with be by on not he this are or his from at which but
have an they you were her she there been one all we their has would when if so no will more can
out other what up into time only new some could these two may first then do any like my now over
such our man me even most made after also did many before must through years where much your way
well down should because each just those people how too little state good very make world still
own see men work long get here between both life being under never day same another know while
last might us great old year off come since against go came right used take three report measure
document archive invoice council section table figure average process engine result page number
value total order record system market
"""
WORDS = VOCABULARY.split()
DPI = 300
SIZE = (2480, 3508)  # A4 at 300 dpi


def font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    """Pillow's own scalable font (Pillow 10.1+), else any DejaVu the machine has, else the
    bitmap default."""
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, OSError, ImportError):
        pass
    for path in ("/usr/share/fonts/truetype/dejavu/DejaVuSerif.ttf", "DejaVuSans.ttf"):
        try:
            return ImageFont.truetype(path, size)
        except OSError:
            continue
    return ImageFont.load_default()


def page(seed: str) -> Image.Image:
    """The page: a heading that names the seed, then paragraphs of words chosen by it."""
    pick = random.Random(seed)
    image = Image.new("L", SIZE, 255)
    draw = ImageDraw.Draw(image)
    draw.text((200, 220), f"Report {seed}", font=font(64), fill=0)
    body, y = font(40), 380
    while y < SIZE[1] - 260:
        if pick.random() < 0.12:  # a paragraph break
            y += 40
        words = [pick.choice(WORDS) for _ in range(pick.randint(9, 12))]
        draw.text((200, y), " ".join(words).capitalize(), font=body, fill=0)
        y += 62
    return image


def write(path: Path, seed: str) -> Path:
    """The page as a one-page PDF at ``path``."""
    page(seed).save(path, "PDF", resolution=DPI)
    return path


if __name__ == "__main__":
    write(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "fresh")
