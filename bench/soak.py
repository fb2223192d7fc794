"""Thousands of small documents through one daemon: does its memory or its descriptor count grow?

Each document is a tiny one-line PNG (Tesseract takes a fraction of a second on it), so the run
stresses the per-document machinery (watcher, ledger, session, scheduler, sinks) rather than OCR. A
window of documents is kept in the inbox; as each one's JSON sidecar appears, the document and its
sidecars are deleted (as a consumer that collects results would) and the next is dropped. RSS and
open descriptors of the daemon process (not its Tesseract children) are read at start, after the
warm-up documents, every ``--every`` documents, and at the end after a short idle. Target: RSS
growth ≤ 5 % from warm-up to end, no descriptor growth. The default 6000 documents take about 5
minutes on 2 cores; the second half's growth is printed too, since the ledger's SQLite page cache
(512 KiB) keeps filling for the first thousand documents or so.

    python bench/soak.py [--count 6000] [--warmup 1000] [--window 16] [--every 500]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from common import Daemon, emit, machine, remove_with_sidecars, sidecar
from PIL import Image, ImageDraw, ImageFont


def make_documents(folder: Path, count: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    font = ImageFont.load_default(size=36)
    paths = []
    for number in range(count):
        image = Image.new("L", (420, 80), 255)
        ImageDraw.Draw(image).text((12, 18), f"soak document {number:05d}", fill=0, font=font)
        path = folder / f"soak-{number:05d}.png"
        image.save(path, dpi=(150, 150))
        paths.append(path)
    return paths


def sample(daemon: Daemon, done: int, started: float) -> dict[str, Any]:
    return {
        "documents": done,
        "seconds": round(time.monotonic() - started, 1),
        "rss_mib": round(daemon.rss_bytes() / 2**20, 2),
        "fds": daemon.open_fds(),
        "threads": daemon.threads(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=6000)
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--window", type=int, default=16, help="documents in the inbox at once")
    parser.add_argument("--every", type=int, default=500, help="sample every this many documents")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ocrwatch-bench-") as tmp:
        scratch = Path(tmp)
        staged = make_documents(scratch / "staged", args.count)
        with Daemon(scratch / "run") as daemon:
            started = time.monotonic()
            samples = [sample(daemon, 0, started)]
            print(f"start: {samples[-1]}", flush=True)
            pending = list(reversed(staged))
            outstanding: list[Path] = []
            done = 0
            warm: dict[str, Any] | None = None
            while pending or outstanding:
                while pending and len(outstanding) < args.window:
                    source = pending.pop()
                    target = daemon.inbox / source.name
                    # same filesystem: a rename, seen as a whole file moved in
                    source.replace(target)
                    outstanding.append(target)
                finished = [path for path in outstanding if sidecar(path).exists()]
                for path in finished:
                    outstanding.remove(path)
                    remove_with_sidecars(path)
                    done += 1
                    if done == args.warmup or done % args.every == 0:
                        samples.append(sample(daemon, done, started))
                        print(f"{done}: {samples[-1]}", flush=True)
                        if done == args.warmup:
                            warm = samples[-1]
                if not finished:
                    time.sleep(0.01)
            seconds = time.monotonic() - started
            time.sleep(3.0)  # let the last sessions close and the loop go idle
            end = sample(daemon, done, started)
            metrics = daemon.metrics()
            ledger_bytes = sum(
                path.stat().st_size for path in (daemon.root / "state").glob("ledger.sqlite3*")
            )
    assert warm is not None
    growth = (end["rss_mib"] - warm["rss_mib"]) / warm["rss_mib"]
    half = next(s for s in samples if s["documents"] >= done // 2)
    second_half = (end["rss_mib"] - half["rss_mib"]) / half["rss_mib"]
    print(
        f"{done} documents in {seconds:.0f} s ({done / seconds:.1f}/s); RSS "
        f"{samples[0]['rss_mib']} MiB at start, "
        f"{warm['rss_mib']} after {args.warmup}, {end['rss_mib']} at the end ({growth:+.1%}); "
        f"fds {samples[0]['fds']} / {warm['fds']} / {end['fds']}; second half {second_half:+.1%}"
    )
    emit(
        {
            "bench": "soak",
            "documents": done,
            "seconds": round(seconds, 1),
            "documents_per_s": round(done / seconds, 2),
            "rss_start_mib": samples[0]["rss_mib"],
            "rss_warm_mib": warm["rss_mib"],
            "rss_end_mib": end["rss_mib"],
            "rss_growth_after_warmup": round(growth, 4),
            "rss_growth_second_half": round(second_half, 4),
            "target_rss_growth": 0.05,
            "fds_start": samples[0]["fds"],
            "fds_warm": warm["fds"],
            "fds_end": end["fds"],
            "documents_ok": metrics['ocrwatch_documents_total{status="ok"}'],
            "documents_failed": metrics['ocrwatch_documents_total{status="failed"}'],
            "max_loop_lag_s": round(metrics["ocrwatch_event_loop_max_lag_seconds"], 4),
            "ledger_bytes_end": ledger_bytes,
            "samples": samples + [end],
            "machine": machine(),
        }
    )


if __name__ == "__main__":
    main()
