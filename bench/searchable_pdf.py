"""The searchable PDF through the daemon: the time it adds per page (the JSON's
``timing.stages.searchable_pdf``) and how well ``pdftotext`` gives the text back (similarity of each
page's layer to its Markdown).

Runs ``ocrwatch run`` with ``[output] searchable_pdf = true`` and the Tesseract engine at its
default 300 dpi over corpus documents up to ``--pages`` pages, waits for every JSON sidecar, then
reads the stage timings and runs ``pdftotext`` on each ``NAME.ocr.pdf``. A PDF with a text layer of
its own is given to the daemon as a scan of itself (its pages rendered at 300 dpi into an image-only
PDF, ``scan-NAME``): ``pdftotext`` would return its own text besides the layer's, so only a scan
measures the layer. Prints one line per document and ends with the medians and totals.

    python bench/searchable_pdf.py [--pages 40]
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import tempfile
import time
from pathlib import Path

import structlog
from common import (
    Daemon,
    Doc,
    corpus_dir,
    corpus_documents,
    drop,
    emit,
    machine,
    median,
    sidecar,
    wait_for,
)
from rapidfuzz import fuzz

from ocrwatch.config import LimitsConfig, RenderConfig
from ocrwatch.pages import render
from ocrwatch.pages.render import Geometry
from tests.support import docs


def similarity(got: str, want: str) -> float:
    return fuzz.ratio(" ".join(got.split()), " ".join(want.split())) / 100


def scanned(documents: list[Doc], scratch: Path) -> list[Doc]:
    """Each PDF the manifest says has a text layer, as an image-only PDF of its pages rendered at
    300 dpi."""
    root = corpus_dir()
    manifest = json.loads((root / "manifest.json").read_text()) if root is not None else []
    layered = {entry["file"] for entry in manifest if entry.get("has_text_layer")}
    scratch.mkdir(parents=True, exist_ok=True)
    spec = render.render_spec(RenderConfig(), Geometry(dpi=300))
    out = []
    for doc in documents:
        if doc.path.name not in layered:
            out.append(doc)
            continue
        info = render.probe(doc.path, render.Limits.from_config(LimitsConfig()))
        images = [
            render.render_page(doc.path, info, index, spec).image for index in range(info.pages)
        ]
        out.append(
            Doc(docs.write_pdf(scratch / f"scan-{doc.path.name}", images, dpi=300), doc.pages)
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=40)
    args = parser.parse_args()
    # the renderer's lines
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    with tempfile.TemporaryDirectory(prefix="ocrwatch-bench-") as folder:
        root = Path(folder)
        documents, origin = corpus_documents(args.pages, root / "generated")
        documents = scanned(documents, root / "scans")
        with Daemon(root, output={"searchable_pdf": True}) as daemon:
            started = time.monotonic()
            dropped = [drop(doc.path, daemon.inbox) for doc in documents]
            for path in dropped:
                wait_for(
                    lambda p=path: (
                        sidecar(p).exists() or p.with_name(p.name + ".error.json").exists()
                    ),
                    1800,
                    f"{path.name} done",
                    interval=0.2,
                )
            wall = time.monotonic() - started
        per_page, shares, scores, rows = [], [], [], []
        for path in dropped:
            if not sidecar(path).exists():
                continue
            document = json.loads(sidecar(path).read_text())
            stages, pages = document["timing"]["stages"], len(document["pages"])
            layer = path.with_name(path.name + ".ocr.pdf")
            if "path" not in document.get("searchable_pdf", {}):
                rows.append({"file": path.name, "error": document.get("searchable_pdf")})
                continue
            text = subprocess.run(
                ["pdftotext", str(layer), "-"], capture_output=True, text=True, check=True
            ).stdout
            found = [
                similarity(got, page["markdown"])
                for got, page in zip(text.split("\f"), document["pages"], strict=False)
                if page["status"] == "ok" and page["markdown"].strip()
            ]
            seconds = stages["searchable_pdf"]
            per_page.append(seconds / pages)
            shares.append(
                seconds / max(sum(value for key, value in stages.items() if key != "waiting"), 1e-9)
            )
            scores.extend(found)
            row = {
                "file": path.name,
                "pages": pages,
                "searchable_pdf_ms_per_page": round(1000 * seconds / pages, 2),
                "share_of_processing": round(shares[-1], 4),
                "similarity_min": round(min(found), 3) if found else None,
                "similarity_mean": round(sum(found) / len(found), 3) if found else None,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    emit(
        {
            "benchmark": "searchable_pdf",
            "corpus": origin,
            "documents": len(rows),
            "wall_seconds": round(wall, 1),
            "ms_per_page_median": round(1000 * median(per_page), 2) if per_page else None,
            "ms_per_page_max": round(1000 * max(per_page), 2) if per_page else None,
            "share_of_processing_median": round(median(shares), 4) if shares else None,
            "similarity_median": round(median(scores), 3) if scores else None,
            "pages_at_or_above_0_9": f"{sum(score >= 0.9 for score in scores)}/{len(scores)}",
            "failed_layers": [row for row in rows if "error" in row],
            "machine": machine(),
        }
    )


if __name__ == "__main__":
    main()
