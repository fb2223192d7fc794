"""What turning pages upright costs a page, and what it gains on the corpus's turned pages.

Cost: every page of the corpus's documents (``--max-per-doc`` each, GeoTopo left out) is rendered as
the daemon renders it for the Tesseract engine, then ``orientation.upright`` is timed with
``rotate_pages`` alone two ways, the default rule (the text-line test first, then OSD's glance at
the densest text, OSD on the whole page only where both are unsure or the glance says turned) and
the old rule (OSD on the whole page, every page: the text-line test and the glance left out), and
``deskew.skew_angle`` alone, one page at a time on one thread: wall milliseconds, and CPU
milliseconds (this process plus Tesseract's children), mean and median. Pages are counted by how
they were decided (``decided_by``). The same is done on pages made here (``made``): the suite's
pangram page and a page of prose in a book face, each shown four ways round.

Resolutions: three corpus pages (a framed table, a small page of prose, a paper's first page)
rendered at 150 and 300 dpi, turned 90 degrees, saved as PNGs that record no resolution, the true
one, or 600 dpi, and rendered as the daemon renders an image: how many come out upright.

Gain: the rotated documents (``tests/support/rotated.py``) read through the Tesseract engine with
``rotate_pages`` off and on (and ``deskew`` on for ``rotated_skew.pdf``); each page's word
similarity to its reference, order-sensitive and order-free.

    python bench/orientation.py [--max-per-doc 3]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from common import BIG_DOCUMENTS, corpus_dir, emit, machine, median

from ocrwatch.config import RenderConfig
from ocrwatch.engines.base import PageRequest
from ocrwatch.engines.tesseract import TesseractEngine
from ocrwatch.engines.tesseract_options import TesseractConfig
from ocrwatch.pages import deskew, orientation, render
from tests.support import docs, rotated
from tests.test_orientation import prose_page


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def spec_for(**render_keys: Any) -> render.RenderSpec:
    geometry = render.Geometry(dpi=TesseractConfig().dpi)
    return render.render_spec(RenderConfig(**render_keys), geometry)


def old_rule(image: Any, dpi: float, settings: orientation.Settings) -> orientation.Orientation:
    """The rule before the text lines and the glance (up to 2b5c2b0): OSD on the whole page, every
    page, an unsure turn read both ways on the whole page."""
    page, page_dpi = orientation._grey(image, dpi)
    with tempfile.TemporaryDirectory(prefix="bench-osd-") as folder:
        path = os.path.join(folder, "page.pgm")
        page.save(path)
        answer = orientation.detect(path, page_dpi, settings.timeout)
        if answer is None:
            return orientation.Orientation(decided_by="too_little_text")
        detected, confidence = answer[:2]
        if detected == 0 or confidence >= settings.threshold:
            return orientation.Orientation(detected, detected, confidence, "osd")
        if confidence < orientation.READ_FLOOR:
            return orientation.Orientation(0, detected, confidence, "low_confidence")
        unturned = orientation.readable_characters(path, page_dpi, settings.timeout)
        turned_path = os.path.join(folder, "turned.pgm")
        orientation.turn(page, detected).save(turned_path)
        turned = orientation.readable_characters(turned_path, page_dpi, settings.timeout)
        least = max(orientation.READ_MIN_CHARACTERS, orientation.READ_RATIO * unturned)
        rotation = detected if turned >= least else 0
        return orientation.Orientation(rotation, detected, confidence, "reading")


def timed(images: list[tuple[str, Any, float]]) -> dict[str, Any]:
    """``upright`` on each (label, image, dpi) by the default rule and by OSD on every page."""
    settings = dataclasses.replace(spec_for(rotate_pages=False).upright, rotate=True)
    rules = {"default": orientation._decide, "osd_every_page": old_rule}
    figures: dict[str, Any] = {}
    for rule, decide in rules.items():
        orientation._decide = decide
        wall_s, cpu_s, decided = [], [], {}
        try:
            for label, image, dpi in images:
                wall, cpu = time.perf_counter(), own_cpu() + children_cpu()
                _, turned = orientation.upright(image, dpi, settings)
                wall_s.append(time.perf_counter() - wall)
                cpu_s.append(own_cpu() + children_cpu() - cpu)
                key = f"{turned.decided_by}:{turned.rotation}"
                decided[key] = decided.get(key, 0) + 1
                print(
                    f"{rule} {label}: {turned.decided_by} rotation {turned.rotation} "
                    f"(OSD {turned.detected} at {turned.confidence}, script {turned.script}) "
                    f"{wall_s[-1] * 1000:.0f} ms, "
                    f"CPU {cpu_s[-1] * 1000:.0f} ms",
                    flush=True,
                )
        finally:
            orientation._decide = rules["default"]
        figures[rule] = {
            "cpu_ms_mean": round(sum(cpu_s) / len(cpu_s) * 1000),
            "cpu_ms_median": round(median(cpu_s) * 1000),
            "wall_ms_mean": round(sum(wall_s) / len(wall_s) * 1000),
            "wall_ms_max": round(max(wall_s) * 1000),
            "decided": decided,
        }
    old, new = figures["osd_every_page"]["cpu_ms_mean"], figures["default"]["cpu_ms_mean"]
    figures["default_cpu_share_of_old"] = round(new / max(old, 1), 3)
    return {"pages": len(images), **figures}


def cost(root: Path, max_per_doc: int) -> dict[str, Any]:
    manifest = json.loads((root / "manifest.json").read_text())
    plain = spec_for(rotate_pages=False)
    images, skew_wall, skew_cpu = [], [], []
    for entry in manifest:
        if entry["expected"] != "ok" or entry["file"] in BIG_DOCUMENTS:
            continue
        path = root / entry["file"]
        info = render.probe(path, render.Limits(1 << 30, 10_000))
        for index in range(min(info.pages, max_per_doc)):
            page = render.render_page(path, info, index, plain)
            images.append((f"{entry['file']} p{index + 1}", page.image, page.dpi))
            wall, cpu = time.perf_counter(), own_cpu()
            deskew.skew_angle(page.image)
            skew_wall.append(time.perf_counter() - wall)
            skew_cpu.append(own_cpu() - cpu)
    return {
        **timed(images),
        "deskew_ms_median": round(median(skew_wall) * 1000),
        "deskew_cpu_ms_median": round(median(skew_cpu) * 1000),
    }


def made() -> dict[str, Any]:
    """The suite's pages (``tests/test_orientation.py``), each turned 0, 90, 180 and 270 degrees."""
    pages = {"pangrams": docs.text_image(list(rotated.PANGRAMS)), "prose": prose_page()}
    return timed(
        [
            (f"{name} turned {turn}", orientation.turn(image, turn), 150.0)
            for name, image in pages.items()
            for turn in (0, 90, 180, 270)
        ]
    )


RESOLUTION_PAGES = ("small-table.pdf", "multipage.pdf", "tracemonkey.pdf")


def resolutions(root: Path) -> dict[str, Any]:
    """Each of ``RESOLUTION_PAGES``' first page at each true and claimed resolution (module
    docstring): the turn found, how, and its CPU milliseconds."""
    plain, spec = spec_for(rotate_pages=False), spec_for()
    cases: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-dpi-") as folder:
        for name in RESOLUTION_PAGES:
            info = render.probe(root / name, render.Limits(1 << 30, 10_000))
            for true in (150, 300):
                at = dataclasses.replace(plain, dpi=float(true))
                shown = orientation.turn(render.render_page(root / name, info, 0, at).image, 90)
                shown.info.clear()
                for claimed in (None, true, 600):
                    path = Path(folder) / f"{true}-{claimed}.png"
                    shown.save(path, **({"dpi": (claimed, claimed)} if claimed else {}))
                    probed = render.probe(path, render.Limits(1 << 30, 10))
                    cpu = own_cpu() + children_cpu()
                    turned = render.render_page(path, probed, 0, spec).orientation
                    cpu = own_cpu() + children_cpu() - cpu
                    key = f"{name} at {true} dpi saying {claimed or 'none'}"
                    cases[key] = {
                        "right": turned.rotation == 270,
                        "decided_by": turned.decided_by,
                        "cpu_ms": round(cpu * 1000),
                    }
                    print(f"{key}: {turned.rotation} by {turned.decided_by}", flush=True)
    right = sum(case["right"] for case in cases.values())
    return {"right": right, "cases": len(cases), "each": cases}


async def read(engine: TesseractEngine, path: Path, spec: render.RenderSpec) -> list[str]:
    info = render.probe(path, render.Limits(1 << 30, 10_000))
    texts = []
    for index in range(info.pages):
        page = await asyncio.to_thread(render.render_page, path, info, index, spec)
        request = PageRequest(request_id=f"{path.name}/{index}", image=page.image, prompt="")
        texts.append((await engine.recognize(request)).markdown)
    return texts


async def gain(root: Path) -> dict[str, Any]:
    engine = TesseractEngine(TesseractConfig(workers=1))
    await engine.start()
    ways = {"off": spec_for(rotate_pages=False), "on": spec_for()}
    figures: dict[str, Any] = {}
    try:
        for name in rotated.LEGIBLE + ("test Orient.pdf",):
            want = rotated.reference(root, name)
            chosen = dict(ways)
            if name == "rotated_skew.pdf":
                chosen["on+deskew"] = spec_for(deskew=True)
            for way, spec in chosen.items():
                for number, got in enumerate(await read(engine, root / name, spec), 1):
                    order = rotated.word_similarity(got, want)
                    bag = rotated.bag_similarity(got, want)
                    key = f"{name} p{number} {way}"
                    figures[key] = {"words": round(order, 3), "bag": round(bag, 3)}
                    print(f"{key}: words {order:.3f}, bag {bag:.3f}", flush=True)
    finally:
        await engine.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-per-doc", type=int, default=3)
    args = parser.parse_args()
    root = corpus_dir()
    if root is None:
        raise SystemExit("needs the corpus: set OCRWATCH_CORPUS or place it at ../shared/corpus")
    figures = {
        "cost": cost(root, args.max_per_doc),
        "made": made(),
        "resolutions": resolutions(root),
        "similarity": asyncio.run(gain(root)),
    }
    emit(
        {"benchmark": "orientation", "corpus": str(root), "figures": figures, "machine": machine()}
    )


if __name__ == "__main__":
    main()
