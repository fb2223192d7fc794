"""The text-layer test (``pagetext``): its cost a page, and the word similarity of ``text = "auto"``
against ``text = "ocr"`` on the corpus's born-digital pages (Tesseract, its default 300 dpi).

For each corpus PDF with a text layer (its first ``--pages`` pages; German documents in
``deu+eng``), and each ``--extra`` PDF: the check's milliseconds a page (the word lists read
before, their one-time cost printed apart), what it decided, and the similarity to the ground
truth (``NAME.gt.txt``, ``pdftotext -layout``) of the OCR and of what ``auto`` gives (the layer
where taken, else the same OCR): order-sensitive (difflib over the words) and order-free (the
words' multiset overlap). Scanned PDFs give the cost of a page that shows no text. An ``--extra``
document has no ground truth: its decisions and costs are printed.

    python bench/text_layer.py [--pages 5] [--extra /path/TAMReview.pdf]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import difflib
import json
import logging
import statistics
import time
from pathlib import Path

import structlog
from common import corpus_dir, emit, machine

from ocrwatch.config import RenderConfig, TesseractConfig
from ocrwatch.engines.base import PageRequest
from ocrwatch.engines.tesseract import TesseractEngine
from ocrwatch.infra.memory import DecodeBudget
from ocrwatch.pages import render
from ocrwatch.recognize import pagetext, tessdata

BUDGET = DecodeBudget(1024 * 1024 * 1024)


def similarity(got: str, want: str, ordered: bool) -> float:
    a, b = got.split(), want.split()
    if ordered:
        return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()
    common = sum((collections.Counter(a) & collections.Counter(b)).values())
    return 2 * common / max(len(a) + len(b), 1)


async def measure(args: argparse.Namespace) -> None:
    root = corpus_dir()
    manifest = json.loads((root / "manifest.json").read_text()) if root is not None else []
    knowledge = tessdata.shared("tesseract")
    started = time.perf_counter()
    knowledge.letters("deu+eng"), knowledge.words("eng"), knowledge.words("deu")
    load = time.perf_counter() - started
    engine = TesseractEngine(TesseractConfig())
    await engine.start()
    spec = render.render_spec(RenderConfig(), engine.geometry)
    layered = (
        [
            (root / e["file"], "deu+eng" if "german" in e["tags"] else "eng", True)
            for e in manifest
            if e.get("has_text_layer") and e["kind"] == "pdf"
        ]
        if root
        else []
    )
    scans = (
        [
            (root / e["file"], "eng", False)
            for e in manifest
            if e["kind"] == "pdf" and not e.get("has_text_layer") and e["expected"] == "ok"
        ]
        if root
        else []
    )
    extra = [(Path(path), "eng", False) for path in args.extra]
    costs: dict[str, list[float]] = collections.defaultdict(list)
    scores: dict[str, list[float]] = collections.defaultdict(list)
    try:
        for path, lang, judged in layered + extra + scans:
            info = render.probe(path, render.Limits(10**10, 10**5))
            truth_file = path.with_name(path.name + ".gt.txt")
            truth = truth_file.read_text().split("\f") if judged and truth_file.exists() else None
            for index in range(min(info.pages, args.pages)):
                found = pagetext.check(
                    path, index, "auto", lang, knowledge, budget=BUDGET, timeout=120
                )
                costs["no_text" if found.reason == "no_text" else "text"].append(found.seconds)
                row = {
                    "file": path.name,
                    "page": index + 1,
                    "reason": found.reason,
                    "known_words": found.known_words and round(found.known_words, 3),
                    "check_ms": round(1000 * found.seconds, 1),
                }
                if truth is not None and index < len(truth) and truth[index].strip():
                    page = await asyncio.to_thread(render.render_page, path, info, index, spec)
                    ocr = await engine.recognize(
                        PageRequest(f"{path.name}/{index}", page.image, "", lang=lang)
                    )
                    auto = pagetext.markdown(found.text) if found.text is not None else ocr.markdown
                    for ordered, name in ((True, "ordered"), (False, "free")):
                        for mode, text in (("ocr", ocr.markdown), ("auto", auto)):
                            value = similarity(text, truth[index], ordered)
                            row[f"{mode}_{name}"] = round(value, 3)
                            scores[f"{mode}_{name}"].append(value)
                print(json.dumps(row), flush=True)
    finally:
        await engine.close()
    emit(
        {
            "benchmark": "text_layer",
            "pages_judged": len(costs["text"]),
            "word_lists_load_s": round(load, 3),
            "check_ms_per_page_median": round(1000 * statistics.median(costs["text"]), 1),
            "check_ms_per_page_max": round(1000 * max(costs["text"]), 1),
            "no_text_ms_per_page_median": round(1000 * statistics.median(costs["no_text"]), 2)
            if costs["no_text"]
            else None,
            **{
                f"{key}_mean": round(statistics.mean(values), 3)
                for key, values in sorted(scores.items())
            },
            "machine": machine(),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=5)
    parser.add_argument("--extra", action="append", default=[], help="a PDF without ground truth")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    asyncio.run(measure(args))


if __name__ == "__main__":
    main()
