"""What turning pages upright costs a page, and what it gains on the corpus's turned pages.

Cost: every page of the corpus's documents (``--max-per-doc`` each, GeoTopo left out) is rendered as
the daemon renders it for the Tesseract engine, then ``orientation.upright`` is timed with
``rotate_pages`` alone and ``deskew.skew_angle`` alone, one page at a time on one thread: wall
milliseconds, and CPU milliseconds (Tesseract's children for OSD, this process for deskew). Pages
that OSD reads turned are counted by how it decided (``decided_by``).

Gain: the rotated documents (``tests/rotated.py``) read through the Tesseract engine with
``rotate_pages`` off and on (and ``deskew`` on for ``rotated_skew.pdf``); each page's word
similarity to its reference, order-sensitive and order-free.

    python bench/orientation.py [--max-per-doc 3]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import resource
import time
from pathlib import Path
from typing import Any

from common import BIG_DOCUMENTS, corpus_dir, emit, machine, median

from ocrwatch import deskew, orientation, render
from ocrwatch.config import RenderConfig
from ocrwatch.engines.base import PageRequest
from ocrwatch.engines.tesseract import TesseractEngine
from ocrwatch.engines.tesseract_options import TesseractConfig
from tests import rotated


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def spec_for(**render_keys: Any) -> render.RenderSpec:
    geometry = render.Geometry(dpi=TesseractConfig().dpi)
    return render.render_spec(RenderConfig(**render_keys), geometry)


def cost(root: Path, max_per_doc: int) -> dict[str, Any]:
    manifest = json.loads((root / "manifest.json").read_text())
    plain = spec_for(rotate_pages=False)
    settings = dataclasses.replace(plain.upright, rotate=True)
    osd_wall, osd_cpu, skew_wall, skew_cpu = [], [], [], []
    decided: dict[str, int] = {}
    for entry in manifest:
        if entry["expected"] != "ok" or entry["file"] in BIG_DOCUMENTS:
            continue
        path = root / entry["file"]
        info = render.probe(path, render.Limits(1 << 30, 10_000))
        for index in range(min(info.pages, max_per_doc)):
            page = render.render_page(path, info, index, plain)
            wall, cpu = time.perf_counter(), children_cpu()
            _, turned = orientation.upright(page.image, page.dpi, settings)
            osd_wall.append(time.perf_counter() - wall)
            osd_cpu.append(children_cpu() - cpu)
            key = f"{turned.decided_by}:{turned.rotation}"
            decided[key] = decided.get(key, 0) + 1
            wall, cpu = time.perf_counter(), own_cpu()
            deskew.skew_angle(page.image)
            skew_wall.append(time.perf_counter() - wall)
            skew_cpu.append(own_cpu() - cpu)
            print(
                f"{entry['file']} p{index + 1}: {turned.decided_by} rotation {turned.rotation} "
                f"(OSD {turned.detected} at {turned.confidence}) {osd_wall[-1] * 1000:.0f} ms, "
                f"deskew {skew_wall[-1] * 1000:.0f} ms",
                flush=True,
            )
    return {
        "pages": len(osd_wall),
        "osd_ms_median": round(median(osd_wall) * 1000),
        "osd_cpu_ms_median": round(median(osd_cpu) * 1000),
        "osd_ms_max": round(max(osd_wall) * 1000),
        "deskew_ms_median": round(median(skew_wall) * 1000),
        "deskew_cpu_ms_median": round(median(skew_cpu) * 1000),
        "decided": decided,
    }


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
    figures = {"cost": cost(root, args.max_per_doc), "similarity": asyncio.run(gain(root))}
    emit(
        {"benchmark": "orientation", "corpus": str(root), "figures": figures, "machine": machine()}
    )


if __name__ == "__main__":
    main()
