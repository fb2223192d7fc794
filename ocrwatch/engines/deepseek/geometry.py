"""How DeepSeek-OCR and DeepSeek-OCR-2 see a page (the processor's tile grid and image tokens) and
which of the two a model is. Pure; ``engine`` states the geometry to the renderer and sizes the
engine with it."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ocrwatch.pages.render import Geometry

LETTER_LONG_SIDE_INCHES = 11.0


@dataclass(frozen=True)
class VisionGeometry:
    """How a DeepSeek-OCR model sees a page: a square global view plus a grid of up to ``max_tiles``
    tiles.

    vLLM's ``DeepseekOCRProcessor`` picks the grid (2 to ``max_tiles`` tiles) whose aspect ratio is
    closest to the page's and resizes the page onto it, so a portrait A4 or Letter page becomes a
    2×3 grid whose long side is three tiles. Rendering with that long side as the cap gives the
    model every pixel it consumes and no more; ``dpi`` is the lowest at which both A4 and Letter
    reach the cap, so common pages are never upscaled by the processor.
    """

    architecture: str
    base_size: int
    tile_size: int
    max_tiles: int = 6
    min_tiles: int = 2
    newlines: bool = False
    """DeepSeek-OCR ends each row of a view's tokens with a newline token (vLLM's processor,
    strategy v1)."""

    @property
    def max_side(self) -> int:
        return 3 * self.tile_size

    def page_geometry(self) -> Geometry:
        """What the engine states to the renderer: the grid's long side as the cap, at ``dpi`` (see
        above)."""
        return Geometry(
            dpi=math.ceil(self.max_side / LETTER_LONG_SIDE_INCHES), max_side=self.max_side
        )

    def grids(self) -> list[tuple[int, int]]:
        """Every (columns, rows) tile grid the processor may choose, fewest tiles first."""
        return sorted(
            {
                (columns, rows)
                for columns in range(1, self.max_tiles + 1)
                for rows in range(1, self.max_tiles + 1)
                if self.min_tiles <= columns * rows <= self.max_tiles
            },
            key=lambda grid: grid[0] * grid[1],
        )

    def max_image_tokens(self) -> int:
        """Image tokens of the largest page: the global view, the grid with the most tokens, the
        separator (as vLLM's ``get_num_image_tokens``: 1,121 for DeepSeek-OCR-2, 933 for
        DeepSeek-OCR)."""
        base, tile = self.base_size // 64, self.tile_size // 64

        def view(rows: int, columns: int) -> int:
            return rows * (columns + 1) if self.newlines else rows * columns

        return (
            view(base, base)
            + max(view(rows * tile, columns * tile) for columns, rows in self.grids())
            + 1
        )

    def tile_grid(self, width: int, height: int) -> tuple[int, int]:
        """(columns, rows) the processor cuts a ``width``×``height`` image into; (1, 1) is the
        global view only."""
        if width <= self.tile_size and height <= self.tile_size:
            return (1, 1)
        ratios = self.grids()
        aspect = width / height
        best, best_diff = (1, 1), float("inf")
        for grid in ratios:
            diff = abs(aspect - grid[0] / grid[1])
            if diff < best_diff:
                best, best_diff = grid, diff
            elif diff == best_diff and width * height > 0.5 * self.tile_size**2 * grid[0] * grid[1]:
                best = grid
        return best


OCR2 = VisionGeometry("DeepseekOCR2ForCausalLM", base_size=1024, tile_size=768)
OCR1 = VisionGeometry("DeepseekOCRForCausalLM", base_size=1024, tile_size=640, newlines=True)
VISIONS = {vision.architecture: vision for vision in (OCR2, OCR1)}


def model_config(model: str) -> dict[str, Any]:
    """A local model's ``config.json``; empty for a hub id or an unreadable file."""
    path = Path(model).expanduser() / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def model_architecture(model: str) -> str:
    """The model class: from a local model's ``config.json``, else from the name (``…OCR-2`` vs
    ``…OCR``)."""
    architectures = model_config(model).get("architectures")
    if isinstance(architectures, list):
        for architecture in architectures:
            if architecture in VISIONS:
                return architecture
    name = model.lower()
    if re.search(r"ocr[-_ .]?2", name) is None and "ocr" in name:
        return OCR1.architecture
    return OCR2.architecture
