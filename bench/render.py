"""PDF pages/s per core: pdftoppm through pdf2image, as the daemon calls pdftoppm, and pypdfium2.

Every page is rendered at the DPI the daemon would use for the Tesseract engine (its geometry,
lowered per page by the caps exactly as ``render.page_dpi`` does), one page at a time on one thread,
so wall-clock pages/s is pages/s per core; CPU seconds (this process plus its pdftoppm children) are
reported too. Methods:

- ``pdf2image``: ``pdf2image.convert_from_path`` for one page (it runs pdfinfo and ``pdftoppm -v``
  first).
- ``pdftoppm``: ``render.render_page`` as configured by default: one ``pdftoppm`` per page, PPM in a
  file.
- ``pdfium``: ``render.render_page`` with ``[render] renderer = "pdfium"``: pypdfium2 in-process,
  the document opened for each page.
- ``pdfium_open``: pypdfium2 with each document kept open across its pages (the best case for
  pdfium).

Runs rotate the method order each round. Then the daemon's way, ``render_workers`` threads (auto: 2
here), for the two renderers the daemon can use: pdftoppm runs in parallel subprocesses, PDFium is
serialised by a lock because it is not thread-safe. Each is timed idle and beside ``--busy-threads``
pure-Python threads, the GIL load of a vLLM front end (its processor and output threads) in the
daemon's process. A check pass compares each page's geometry and pixels between the two renderers.
pdf2image and pypdfium2 come with the bench extra: ``pip install -e '.[bench]'`` to run this.

    python bench/render.py [--rounds 3] [--max-per-doc 14] [--dpi N] [--busy-threads 4]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pypdfium2 as pdfium
from common import corpus_documents, emit, machine, median
from pdf2image import convert_from_path
from PIL import Image, ImageChops, ImageStat

from ocrwatch.config import Config, LogConfig, TesseractConfig
from ocrwatch.infra import logging
from ocrwatch.pages import render
from ocrwatch.pages.scheduler import auto_render_workers

Page = tuple[Path, render.DocumentInfo, int]
Method = Callable[[Page, render.RenderSpec, dict[Path, Any]], Image.Image]


def method_pdf2image(page: Page, spec: render.RenderSpec, cache: dict[Path, Any]) -> Image.Image:
    path, info, index = page
    dpi = render.page_dpi(*info.page_sizes[index], spec)
    (image,) = convert_from_path(
        path,
        dpi=dpi,
        first_page=index + 1,
        last_page=index + 1,
        fmt="ppm",
        use_cropbox=True,
        timeout=spec.timeout_seconds,
    )
    return image


def method_pdftoppm(page: Page, spec: render.RenderSpec, cache: dict[Path, Any]) -> Image.Image:
    path, info, index = page
    return render.render_page(
        path, info, index, dataclasses.replace(spec, renderer="pdftoppm")
    ).image


def method_pdfium(page: Page, spec: render.RenderSpec, cache: dict[Path, Any]) -> Image.Image:
    path, info, index = page
    return render.render_page(path, info, index, dataclasses.replace(spec, renderer="pdfium")).image


def method_pdfium_open(page: Page, spec: render.RenderSpec, cache: dict[Path, Any]) -> Image.Image:
    path, info, index = page
    if path not in cache:
        cache[path] = pdfium.PdfDocument(path)
    pdf_page = cache[path][index]
    try:
        return pdf_page.render(scale=render.page_dpi(*info.page_sizes[index], spec) / 72).to_pil()
    finally:
        pdf_page.close()


METHODS: dict[str, Method] = {
    "pdf2image": method_pdf2image,
    "pdftoppm": method_pdftoppm,
    "pdfium": method_pdfium,
    "pdfium_open": method_pdfium_open,
}


def cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def timed(method: str, pages: list[Page], spec: render.RenderSpec) -> dict[str, float]:
    cache: dict[Path, Any] = {}
    wall, cpu = time.perf_counter(), cpu_seconds()
    pixels = 0
    for page in pages:
        image = METHODS[method](page, spec, cache)
        pixels += image.width * image.height
        image.close()
    wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
    for document in cache.values():
        document.close()
    return {"seconds": wall, "cpu_seconds": cpu, "megapixels": pixels / 1e6}


def compare(pages: list[Page], spec: render.RenderSpec) -> dict[str, Any]:
    """Same size? And how far apart are the pixels (mean absolute grey difference, 0-255)?"""
    size_mismatch, differences = [], []
    for page in pages:
        a = method_pdftoppm(page, spec, {})
        b = method_pdfium(page, spec, {})
        if a.size != b.size:
            size_mismatch.append(f"{page[0].name} p{page[2] + 1}: {a.size} vs {b.size}")
            b = b.resize(a.size)
        differences.append(
            ImageStat.Stat(ImageChops.difference(a.convert("L"), b.convert("L"))).mean[0]
        )
    return {
        "size_mismatches": size_mismatch,
        "mean_abs_grey_difference_median": round(median(differences), 2),
        "mean_abs_grey_difference_max": round(max(differences), 2),
    }


def threaded(
    method: str, pages: list[Page], spec: render.RenderSpec, workers: int, busy: int = 0
) -> float:
    """Wall-clock pages/s with ``workers`` threads, as the scheduler's render pool runs them, while
    ``busy`` threads run Python bytecode without pause."""
    done = threading.Event()

    def spin() -> None:
        while not done.is_set():
            sum(range(1000))

    spinners = [threading.Thread(target=spin) for _ in range(busy)]
    for spinner in spinners:
        spinner.start()
    try:
        started = time.perf_counter()
        with ThreadPoolExecutor(workers) as pool:
            for image in pool.map(lambda page: METHODS[method](page, spec, {}), pages):
                image.close()
        return len(pages) / (time.perf_counter() - started)
    finally:
        done.set()
        for spinner in spinners:
            spinner.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-per-doc", type=int, default=14, help="pages taken from each PDF")
    parser.add_argument(
        "--dpi", type=int, default=TesseractConfig().dpi, help="default: the Tesseract engine's"
    )
    parser.add_argument(
        "--busy-threads", type=int, default=4, help="GIL-bound threads beside the render workers"
    )
    args = parser.parse_args()
    logging.configure(LogConfig(level="warning"))  # the renderer logs every page at debug level
    spec = render.render_spec(Config().render, render.Geometry(dpi=args.dpi))
    limits = render.Limits.from_config(Config().limits)
    workers = auto_render_workers(len(os.sched_getaffinity(0)))  # the default, "auto"
    with tempfile.TemporaryDirectory(prefix="ocrwatch-bench-") as tmp:
        docs, origin = corpus_documents(10_000, Path(tmp) / "generated")
        pages: list[Page] = []
        for doc in docs:
            if doc.path.suffix.lower() != ".pdf":
                continue
            info = render.probe(doc.path, limits)
            pages += [(doc.path, info, index) for index in range(min(info.pages, args.max_per_doc))]
        print(
            f"{len(pages)} PDF pages from {origin} at {spec.dpi:g} dpi (caps {spec.max_side}, "
            f"{spec.max_pixels} px)"
        )
        check = compare(pages, spec)
        print(f"check: {check}", flush=True)
        runs: dict[str, list[dict[str, float]]] = {method: [] for method in METHODS}
        parallel: dict[tuple[str, int], list[float]] = {
            (method, busy): []
            for method in ("pdftoppm", "pdfium")
            for busy in (0, args.busy_threads)
        }
        names = list(METHODS)
        for number in range(args.rounds):
            for method in names[number % len(names) :] + names[: number % len(names)]:
                runs[method].append(timed(method, pages, spec))
                run = runs[method][-1]
                print(
                    f"round {number} {method:12} {len(pages) / run['seconds']:6.2f} pages/s, "
                    f"{len(pages) / run['cpu_seconds']:6.2f} pages/CPU-s",
                    flush=True,
                )
            for (method, busy), rates in parallel.items():
                rates.append(threaded(method, pages, spec, workers, busy))
                print(
                    f"round {number} {method:15} {rates[-1]:6.2f} pages/s with {workers} render "
                    f"workers, {busy} busy",
                    flush=True,
                )
    figures: dict[str, Any] = {}
    for method, method_runs in runs.items():
        figures[method] = {
            "pages_per_s": round(median(len(pages) / run["seconds"] for run in method_runs), 2),
            "pages_per_cpu_s": round(
                median(len(pages) / run["cpu_seconds"] for run in method_runs), 2
            ),
            "megapixels": round(method_runs[0]["megapixels"], 1),
        }
    for (method, busy), rates in parallel.items():
        figures[method][f"pages_per_s_{workers}_workers_{busy}_busy"] = round(median(rates), 2)
    speedup = figures["pdfium"]["pages_per_s"] / figures["pdftoppm"]["pages_per_s"]
    print(
        f"per core: pdf2image {figures['pdf2image']['pages_per_s']}, pdftoppm "
        f"{figures['pdftoppm']['pages_per_s']}, "
        f"pdfium {figures['pdfium']['pages_per_s']} pages/s (pdfium/pdftoppm x{speedup:.2f})"
    )
    emit(
        {
            "bench": "render",
            "corpus": origin,
            "pages": len(pages),
            "dpi": spec.dpi,
            "pypdfium2": f"{pdfium.PYPDFIUM_INFO} (pdfium {pdfium.PDFIUM_INFO})",
            "pdfium_over_pdftoppm": round(speedup, 3),
            "pdfium_over_pdf2image": round(
                figures["pdfium"]["pages_per_s"] / figures["pdf2image"]["pages_per_s"], 3
            ),
            **figures,
            "check": check,
            "machine": machine(),
        }
    )


if __name__ == "__main__":
    main()
