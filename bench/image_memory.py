"""Memory of huge images: five 12,600 x 12,600 RGBA PNGs at once, the daemon's peak and settled RSS.
With ``--searchable-pdf`` the daemon makes each one's searchable PDF too, and ``--form-bomb-mib``
drops beside them a PDF whose page lists an unused form XObject that decodes to that many MiB (a
Flate stream of zeros: 2048 MiB take 2 MB on disk).

Such a PNG is about a megabyte on disk (mostly transparent, a few lines of text) and 635 MB once
decoded; the daemon must not hold several of them, nor the copies that flattening the alpha makes.
Two sides, each in a process of its own so that its peak (``VmHWM``) is its own:

- ``daemon``: ``ocrwatch run`` with the default configuration except ``[engine] kind =
  "tesseract"``; the files are dropped at once, and the figures are the daemon's peak RSS, its RSS
  once every sidecar is written and the heap trimmer has run, and each sidecar's status and whether
  its text was read.
- ``render``: the render step alone, in-process, as the pipeline runs it: ``render_workers`` threads
  (the daemon's default for this machine) and the pipeline's one decode budget, no engine.

    python3 bench/image_memory.py [--count 5] [--side 12600] [--sides daemon,render]
        [--searchable-pdf] [--form-bomb-mib 2048]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from common import Daemon, drop, emit, machine, sidecar, wait_for

MiB = 1024 * 1024
WORD = "POSTER"


def build_png(path: Path, side: int) -> Path:
    """Transparent RGBA with a few lines of black text, large enough to be read after the
    downscale."""
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("RGBA", (side, side), (0, 0, 0, 0))
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=max(40, side // 70))
    for line in range(12):
        where = (side // 30, side // 30 + line * side // 14)
        draw.text(where, f"{WORD} line {line} number 42", fill="black", font=font)
    image.save(path, compress_level=9)
    return path


def build_form_bomb(path: Path, mib: int) -> Path:
    """One page that draws nothing, its resources listing a form of ``mib`` MiB of zeros."""
    import zlib

    import pikepdf

    pdf = pikepdf.new()
    page = pdf.add_blank_page(page_size=(612, 792))
    compressor, zeros = zlib.compressobj(9), bytes(MiB)
    data = b"".join(compressor.compress(zeros) for _ in range(mib)) + compressor.flush()
    form = pdf.make_stream(
        b"", Type=pikepdf.Name.XObject, Subtype=pikepdf.Name.Form, BBox=[0, 0, 612, 792]
    )
    form.write(data, filter=pikepdf.Name.FlateDecode)
    page.obj.Resources = pikepdf.Dictionary(XObject=pikepdf.Dictionary(Fx=form))
    pdf.save(path, compress_streams=False)
    return path


def status_kib(pid: int | str, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


class Sampler(threading.Thread):
    """The process's RSS every ``interval`` seconds: a curve to go with the kernel's own peak
    (VmHWM)."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval, self.peak_kib = pid, interval, 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.interval):
            try:
                self.peak_kib = max(self.peak_kib, status_kib(self.pid, "VmRSS"))
            except (OSError, RuntimeError):
                return

    def stop(self) -> None:
        self._done.set()
        self.join()


def run_daemon(files: list[Path], root: Path, searchable_pdf: bool) -> dict[str, Any]:
    with Daemon(root, output={"searchable_pdf": searchable_pdf}) as daemon:
        ready_kib = status_kib(daemon.pid, "VmRSS")
        sampler = Sampler(daemon.pid)
        sampler.start()
        started = time.monotonic()
        named = [(path, f"big-{number}{path.suffix}") for number, path in enumerate(files)]
        dropped = [drop(path, daemon.inbox, name) for path, name in named]
        for path in dropped:
            error = path.with_name(path.name + ".error.json")
            wait_for(
                lambda path=path, error=error: sidecar(path).exists() or error.exists(),
                1800,
                f"a sidecar for {path.name}",
                0.2,
            )
        seconds = time.monotonic() - started
        sampler.stop()
        peak_kib = status_kib(daemon.pid, "VmHWM")
        time.sleep(12)  # the session's heap trimmer runs at most every 10 s
        settled_kib = status_kib(daemon.pid, "VmRSS")
        statuses = []
        for path in dropped:
            document = (
                json.loads(sidecar(path).read_text())
                if sidecar(path).exists()
                else {"status": "error"}
            )
            markdown = path.with_name(path.name + ".md")
            layer = document.get("searchable_pdf", {})
            statuses.append(
                {
                    "name": path.name,
                    "status": document["status"],
                    "text_read": markdown.exists() and WORD in markdown.read_text().upper(),
                    **(
                        {"text_layer": layer.get("text_layer") or layer.get("error")}
                        if layer
                        else {}
                    ),
                }
            )
    return {
        "daemon_ready_mib": round(ready_kib / 1024),
        "daemon_peak_rss_mib": round(peak_kib / 1024),
        "daemon_sampled_peak_rss_mib": round(sampler.peak_kib / 1024),
        "daemon_settled_rss_mib": round(settled_kib / 1024),
        "daemon_seconds": round(seconds, 1),
        "daemon_documents": statuses,
    }


def render_child(files: list[str]) -> None:
    """The render step alone, as the pipeline runs it; prints its figures as JSON."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    from ocrwatch.config import Config
    from ocrwatch.engines.tesseract import TesseractEngine
    from ocrwatch.infra.memory import DecodeBudget
    from ocrwatch.pages import render
    from ocrwatch.pages.scheduler import auto_render_workers

    cfg = Config()
    spec = render.render_spec(cfg.render, TesseractEngine(cfg.engine.tesseract).geometry)
    limits = render.Limits.from_config(cfg.limits)
    budget = DecodeBudget(cfg.render.decode_budget_mb * MiB)  # as the pipeline makes it
    workers = auto_render_workers(len(os.sched_getaffinity(0)))

    def one(name: str) -> tuple[int, int]:
        path = Path(name)
        page = render.render_page(path, render.probe(path, limits), 0, spec, budget=budget)
        return page.image.size

    started = time.monotonic()
    with ThreadPoolExecutor(workers) as pool:
        sizes = list(pool.map(one, files))
    print(
        json.dumps(
            {
                "render_workers": workers,
                "render_peak_rss_mib": round(status_kib("self", "VmHWM") / 1024),
                "render_rss_after_mib": round(status_kib("self", "VmRSS") / 1024),
                "render_seconds": round(time.monotonic() - started, 1),
                "render_budget_peak_mib": round(budget.peak / MiB),
                "render_budget_waits": budget.waits,
                "render_page_sizes": sizes,
            }
        )
    )


def run_render(files: list[Path]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--render-child", *map(str, files)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=5)
    parser.add_argument("--side", type=int, default=12600)
    parser.add_argument("--sides", default="daemon,render")
    parser.add_argument("--searchable-pdf", action="store_true", help="searchable_pdf = true")
    parser.add_argument("--form-bomb-mib", type=int, default=0, help="an unused form this big")
    parser.add_argument("--render-child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.render_child:
        render_child(args.render_child)
        return
    figures: dict[str, Any] = {"count": args.count, "side": args.side}
    figures |= {"searchable_pdf": args.searchable_pdf, "form_bomb_mib": args.form_bomb_mib}
    with tempfile.TemporaryDirectory(prefix="ocrwatch-bench-") as scratch:
        root = Path(scratch)
        png = build_png(root / "big.png", args.side)
        figures["png_bytes"] = png.stat().st_size
        files = [png] * args.count
        print(f"built {png.stat().st_size} bytes", flush=True)
        mib = args.form_bomb_mib
        bomb = [build_form_bomb(root / "bomb.pdf", mib)] if mib else []
        for side in args.sides.split(","):
            if side == "daemon":
                result = run_daemon(files + bomb, root / "daemon", args.searchable_pdf)
            else:
                result = run_render(files)
            print(side, result, flush=True)
            figures |= result
    emit(figures | {"machine": machine()})


if __name__ == "__main__":
    main()
