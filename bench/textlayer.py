"""The time a searchable PDF adds per page: ``textlayer.searchable_pdf`` on corpus documents OCRed
once.

Every page is rendered and read by the Tesseract engine first (not timed); then, for ``--rounds``
rounds, each document's searchable PDF is written to a file, once with its text (``with_text``) and
once with every page marked failed (``copy_only``: open and save, no text), so the text layer's own
share shows. Prints ms/page per round (wall clock and CPU time: the CPU figure holds on a busy
machine) and ends with the medians, words per page and the bytes the layer adds per page.

    python bench/textlayer.py [--pages 20] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from common import corpus_documents, emit, machine, median

from ocrwatch.config import LimitsConfig, RenderConfig
from ocrwatch.engines.base import PageRequest
from ocrwatch.engines.tesseract import TesseractEngine
from ocrwatch.engines.tesseract_options import TesseractConfig
from ocrwatch.pages import render
from ocrwatch.results import textlayer

Prepared = tuple[Path, str, list[textlayer.PageText | None]]


async def prepare(paths: list[Path]) -> list[Prepared]:
    engine = TesseractEngine(TesseractConfig())
    await engine.start()
    spec = render.render_spec(RenderConfig(), engine.geometry)
    prepared = []
    for path in paths:
        info = render.probe(path, render.Limits.from_config(LimitsConfig()))
        pages: list[textlayer.PageText | None] = []
        for index in range(info.pages):
            page = await asyncio.to_thread(render.render_page, path, info, index, spec)
            recognition = await engine.recognize(
                PageRequest(f"{path.name}-{index}", page.image, prompt="")
            )
            pages.append(textlayer.page_text(page.width, page.height, recognition.blocks))
        prepared.append((path, info.kind, pages))
        print(f"read {path.name}: {info.pages} pages", flush=True)
    await engine.close()
    return prepared


def write_all(prepared: list[Prepared], scratch: Path, with_text: bool) -> tuple[float, float, int]:
    """Wall and CPU seconds to write every document's searchable PDF, and the bytes written."""
    started, cpu, size = time.perf_counter(), time.process_time(), 0
    for number, (path, kind, pages) in enumerate(prepared):
        out = scratch / f"{number}.ocr.pdf"
        texts = pages if with_text else [None] * len(pages)
        textlayer.searchable_pdf(path, kind, texts, out, "0" * 64)  # type: ignore[arg-type]
        size += out.stat().st_size
    return time.perf_counter() - started, time.process_time() - cpu, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ocrwatch-bench-textlayer-") as tmp:
        scratch = Path(tmp)
        documents, corpus = corpus_documents(args.pages, scratch / "generated")
        prepared = asyncio.run(prepare([document.path for document in documents]))
        pages = sum(len(entry[2]) for entry in prepared)
        words = sum(
            len(line.words)
            for _, _, texts in prepared
            for text in texts
            if text
            for line in text.lines
        )
        rounds: dict[str, list[float]] = {"with_text": [], "copy_only": []}
        cpu: dict[str, list[float]] = {"with_text": [], "copy_only": []}
        sizes: dict[str, int] = {}
        for number in range(args.rounds):
            for name in rounds if number % 2 == 0 else reversed(list(rounds)):
                seconds, cpu_seconds, sizes[name] = write_all(
                    prepared, scratch, with_text=name == "with_text"
                )
                rounds[name].append(seconds * 1000 / pages)
                cpu[name].append(cpu_seconds * 1000 / pages)
            figures = ", ".join(
                f"{name} {rounds[name][-1]:.2f} ms/page ({cpu[name][-1]:.2f} CPU)"
                for name in rounds
            )
            print(f"round {number + 1}: {figures}", flush=True)
        emit(
            {
                "bench": "textlayer",
                "corpus": corpus,
                "documents": len(prepared),
                "pages": pages,
                "words_per_page": round(words / pages, 1),
                "ms_per_page": {name: round(median(values), 2) for name, values in rounds.items()},
                "cpu_ms_per_page": {name: round(median(values), 2) for name, values in cpu.items()},
                "layer_ms_per_page": round(
                    median(rounds["with_text"]) - median(rounds["copy_only"]), 2
                ),
                "layer_cpu_ms_per_page": round(
                    median(cpu["with_text"]) - median(cpu["copy_only"]), 2
                ),
                "layer_bytes_per_page": round((sizes["with_text"] - sizes["copy_only"]) / pages),
                "machine": machine(),
            }
        )


if __name__ == "__main__":
    main()
