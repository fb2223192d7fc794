"""Drop-to-sidecar time of a one-page document while a 100-page document is in progress, against it
alone.

One daemon: the small document is dropped ``--trials`` times alone (after one unmeasured warm-up
drop), then the 100-page document is dropped and, once its pages are in the engine, the small one
``--trials`` times again. Each drop is a rename into the inbox; the clock stops when the JSON
sidecar (written last) appears. A loaded trial counts only if the large document was still
unfinished when it ended. Target: loaded/alone ≤ 2 (medians).

The 100-page document is pages 1-100 of the corpus's GeoTopo-komprimiert.pdf (born-digital, about
1.2 s of Tesseract per page here); the small one is linn.pdf (a scanned two-column page, about 3 s).
Without the corpus, generated text pages stand in for both.

    python bench/latency.py [--trials 7]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from common import Daemon, corpus_dir, drop, emit, machine, median, sidecar, wait_for


def documents(scratch: Path) -> tuple[Path, Path, str]:
    """(the 100-page document, the one-page document, where they came from)."""
    from pypdf import PdfReader, PdfWriter

    scratch.mkdir(parents=True, exist_ok=True)
    root = corpus_dir()
    big = scratch / "big-100.pdf"
    if root is None:
        from tests import docs

        lines = [
            [f"Large document page {n}", "Quarterly report invoice", "number forty two"]
            for n in range(100)
        ]
        docs.write_pdf(big, lines)
        return (
            big,
            docs.write_pdf(scratch / "small.pdf", [["Small document", "one page only"]]),
            "generated",
        )
    reader = PdfReader(root / "GeoTopo-komprimiert.pdf")
    writer = PdfWriter()
    for page in reader.pages[:100]:
        writer.add_page(page)
    with open(big, "wb") as handle:
        writer.write(handle)
    return big, root / "linn.pdf", str(root)


def trial(daemon: Daemon, small: Path, name: str) -> dict[str, Any]:
    started = time.monotonic()
    target = drop(small, daemon.inbox, name)
    wait_for(lambda: sidecar(target).exists(), 600, f"sidecar of {name}", interval=0.01)
    seconds = time.monotonic() - started
    data = json.loads(sidecar(target).read_text())
    page = data["pages"][0]["seconds"]
    pages_stage = data["timing"]["stages"]["pages"]
    return {
        "seconds": round(seconds, 3),
        "render": page["render"],
        "recognize": page["recognize"],
        "scheduled": round(
            pages_stage - page["render"] - page["recognize"], 3
        ),  # waiting for a render or engine slot
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ocrwatch-bench-") as tmp:
        scratch = Path(tmp)
        big, small, origin = documents(scratch / "docs")
        alone: list[dict[str, Any]] = []
        loaded: list[dict[str, Any]] = []
        with Daemon(scratch / "run") as daemon:
            trial(daemon, small, "warmup.pdf")
            for number in range(args.trials):
                alone.append(trial(daemon, small, f"alone-{number}.pdf"))
                print(f"alone  {number}: {alone[-1]}", flush=True)
            big_target = drop(big, daemon.inbox)
            wait_for(
                lambda: daemon.metrics()['ocrwatch_pages_total{status="ok"}'] >= 4,
                300,
                "the large document under way",
            )
            for number in range(args.trials):
                result = trial(daemon, small, f"loaded-{number}.pdf")
                result["large_unfinished"] = not sidecar(big_target).exists()
                loaded.append(result)
                print(f"loaded {number}: {result}", flush=True)
                time.sleep(1.0)
            big_pages_done = daemon.metrics()['ocrwatch_pages_total{status="ok"}']
    counted = [result["seconds"] for result in loaded if result["large_unfinished"]]
    alone_s = median(result["seconds"] for result in alone)
    loaded_s = median(counted) if counted else float("nan")
    print(
        f"alone {alone_s:.2f} s, beside a 100-page document {loaded_s:.2f} s, ratio "
        f"{loaded_s / alone_s:.2f}"
    )
    emit(
        {
            "bench": "latency",
            "corpus": origin,
            "small": small.name,
            "alone_s": alone_s,
            "loaded_s": loaded_s,
            "ratio": round(loaded_s / alone_s, 3),
            "target_ratio": 2.0,
            "alone": alone,
            "loaded": loaded,
            "large_pages_done_at_end": big_pages_done,
            "machine": machine(),
        }
    )


if __name__ == "__main__":
    main()
