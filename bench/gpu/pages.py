"""Render benchmark pages from PDFs: pdftoppm where it exists, else pypdfium2 (carried as a wheel).
Used by the device scripts; also runs here.  python3 bench/gpu/pages.py DIR_OR_PDF... --dpi 144
--out D
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from PIL import Image

Image.MAX_IMAGE_PIXELS = None


def pdf_files(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        out += sorted(p.glob("*.pdf")) if p.is_dir() else [p]
    return out


def _render_one(args: tuple[str, int]) -> list[Image.Image]:
    pdf, dpi = args
    if shutil.which("pdftoppm"):
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(
                ["pdftoppm", "-r", str(dpi), "-png", pdf, f"{tmp}/p"],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            files = sorted(Path(tmp).glob("p-*.png"), key=lambda f: int(f.stem.split("-")[-1]))
            return [Image.open(f).convert("RGB") for f in files]
    import pypdfium2 as pdfium

    doc = pdfium.PdfDocument(pdf)
    try:
        return [doc[i].render(scale=dpi / 72).to_pil().convert("RGB") for i in range(len(doc))]
    finally:
        doc.close()


def renderer_name() -> str:
    return "pdftoppm" if shutil.which("pdftoppm") else "pypdfium2"


def render(pdfs: list[Path], dpi: int = 144, workers: int | None = None) -> list[Image.Image]:
    """Every page of every PDF, in order, as RGB PIL images."""
    workers = workers or min(16, os.cpu_count() or 1)
    with ProcessPoolExecutor(workers) as pool:
        docs = list(pool.map(_render_one, [(str(p), dpi) for p in pdfs]))
    return [page for doc in docs for page in doc]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--dpi", type=int, default=144)
    ap.add_argument("--out")
    a = ap.parse_args()
    pages = render(pdf_files(a.paths), a.dpi)
    print(f"{len(pages)} pages via {renderer_name()}", file=sys.stderr)
    sizes: dict[tuple[int, int], int] = {}
    for p in pages:
        sizes[p.size] = sizes.get(p.size, 0) + 1
    print(sorted(sizes.items(), key=lambda kv: -kv[1])[:10])
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        for i, p in enumerate(pages):
            p.save(f"{a.out}/{i:04d}.png")


if __name__ == "__main__":
    main()
