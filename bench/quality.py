"""How well the Tesseract path reads the corpus: each document with a reference text, through the
real ``ocrwatch ocr`` command with the shipped defaults, its Markdown against the reference, word by
word.

Compared page by page (a reference's pages are split at its form feeds). Two figures a page:
order-sensitive (1 - the word-level edit distance over the longer text) and order-free (the share of
words in common, whatever their order: a two-column page read across). With ``--rev REV`` the same
documents are read again by the code of that commit too (a ``git worktree``), so a change is
measured against what came before it, on the same machine and the same Tesseract.

    python bench/quality.py [--rev REV] [--max-pages 20] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import REPO, corpus_dir, emit, machine

from tests.support import rotated

REFERENCES = {**rotated.REFERENCE, "linn.pdf": "linn.pdf.ref.txt"}
"""Documents whose text a file of the corpus holds, beyond the ``NAME.gt.txt`` beside them."""


def documents(corpus: Path, max_pages: int) -> list[tuple[Path, Path]]:
    """(document, reference) for every expected-ok document with a reference, up to
    ``max_pages``."""
    manifest = json.loads((corpus / "manifest.json").read_text())
    found = []
    for entry in manifest:
        name, pages = entry["file"], entry.get("pages") or 0
        if entry.get("expected") != "ok" or pages > max_pages:
            continue
        reference = corpus / REFERENCES.get(name, f"{name}.gt.txt")
        if reference.is_file():
            found.append((corpus / name, reference))
    return found


def read(code: Path, paths: list[Path], scratch: Path) -> dict[str, tuple[str, float]]:
    """Each document's Markdown as ``ocrwatch ocr`` of the code in ``code`` writes it, and the run's
    seconds (one run for all, as a user would type it)."""
    out, state = scratch / "out", scratch / "state"
    config = scratch / "ocrwatch.toml"
    config.write_text(
        f'state_dir = "{state}"\n[engine]\nkind = "tesseract"\n[output]\ndir = "{out}"\n'
    )
    env = {**os.environ, "PYTHONPATH": str(code)}
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ocrwatch",
            "ocr",
            "--config",
            str(config),
            "--out",
            str(out),
            "--force",
            *map(str, paths),
        ],
        cwd=scratch,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.monotonic() - started
    if done.returncode not in (0, 1):
        raise SystemExit(f"ocrwatch ocr of {code} exited {done.returncode}: {done.stderr[-2000:]}")
    found = {}
    for path in paths:
        markdown = out / f"{path.name}.md"
        found[path.name] = (markdown.read_text() if markdown.is_file() else "", seconds)
    return found


def pages_of(markdown: str) -> list[str]:
    """The Markdown's pages, in order, by the mark that opens each."""
    return [part for part in re.split(r"<!-- page \d+ -->", markdown)[1:]]


def scores(
    read_texts: dict[str, tuple[str, float]], pairs: list[tuple[Path, Path]]
) -> dict[str, Any]:
    """Page by page: a reference with form feeds (``pdftotext``'s, first pages only) against the
    same pages; one without (a single page's transcription) against every page of the document."""
    per_document: dict[str, dict[str, float]] = {}
    per_page: dict[str, dict[str, float]] = {}
    for path, reference in pairs:
        wanted = reference.read_text(encoding="utf-8").split("\f")
        got = pages_of(read_texts[path.name][0])
        if len(wanted) == 1:
            wanted = wanted * len(got)
        compared = [
            (n, g, w)
            for n, (g, w) in enumerate(zip(got, wanted, strict=False), 1)
            if rotated.words(w)
        ]
        for n, g, w in compared:
            per_page[f"{path.name} p{n}"] = {
                "ordered": round(rotated.word_similarity(g, w), 3),
                "unordered": round(rotated.bag_similarity(g, w), 3),
            }
        mine = [per_page[f"{path.name} p{n}"] for n, _, _ in compared] or [
            {"ordered": 0, "unordered": 0}
        ]
        per_document[path.name] = {
            kind: round(sum(page[kind] for page in mine) / len(mine), 3)
            for kind in ("ordered", "unordered")
        }
    pages = list(per_page.values())
    return {
        "documents": per_document,
        "pages": len(pages),
        "mean_ordered": round(sum(v["ordered"] for v in pages) / max(len(pages), 1), 3),
        "mean_unordered": round(sum(v["unordered"] for v in pages) / max(len(pages), 1), 3),
        "worst_pages": {
            name: per_page[name]
            for name in sorted(per_page, key=lambda name: per_page[name]["unordered"])[:5]
        },
        "seconds": round(next(iter(read_texts.values()))[1], 1) if read_texts else 0.0,
    }


def worktree(rev: str, scratch: Path) -> Path:
    where = scratch / f"rev-{rev}"
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(where), rev],
        check=True,
        capture_output=True,
    )
    return where


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", help="a commit to measure against (read by its own code)")
    parser.add_argument("--max-pages", type=int, default=20, help="leave out longer documents")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON too")
    args = parser.parse_args()
    corpus = corpus_dir()
    if corpus is None:
        raise SystemExit("no corpus: set OCRWATCH_CORPUS or put it at ../shared/corpus")
    pairs = documents(corpus, args.max_pages)
    result: dict[str, Any] = {"machine": machine(), "documents": [p.name for p, _ in pairs]}
    with tempfile.TemporaryDirectory(prefix="ocrwatch-quality-") as tmp:
        scratch = Path(tmp)
        runs = {"head": REPO}
        if args.rev:
            runs[args.rev] = worktree(args.rev, scratch)
        try:
            for label, code in runs.items():
                (scratch / label).mkdir()
                result[label] = scores(read(code, [p for p, _ in pairs], scratch / label), pairs)
        finally:
            if args.rev:
                subprocess.run(
                    ["git", "-C", str(REPO), "worktree", "remove", "--force", str(runs[args.rev])],
                    check=False,
                    capture_output=True,
                )
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, sort_keys=True))
    emit(result)


if __name__ == "__main__":
    main()
