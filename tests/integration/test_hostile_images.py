"""Hostile documents for the renderer, end to end: huge images that are small on disk, and PDFs
whose header is buried under junk or missing, images of a few bytes that declare gigapixels; and for
the searchable PDF, pages made to exhaust a reader of content.

The PDFs go through ``ocrwatch run`` as a real process with Tesseract. The memory test runs the
render step as the pipeline runs it (the daemon's default render workers and its one decode budget)
in a child process of its own, so that the kernel's peak (``VmHWM``) is that of the render step
alone; ``bench/image_memory.py`` measures the whole daemon.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
from PIL import features

from ocrwatch.sources.sniff import sniff
from tests.integration.conftest import REPO, DaemonProcess, error_sidecar, sidecars_done, wait_until
from tests.support import docs
from tests.support.hostile_pdfs import (
    MiB,
    write_declared_image_pdf,
    write_form_bomb,
    write_nested_forms,
)

pytestmark = pytest.mark.integration

GiB = 1024**3


def _junk(size: int) -> bytes:
    junk = random.Random(18).randbytes(size)
    assert sniff(junk) is None
    return junk


def test_pdfs_with_a_buried_or_missing_header_are_read_and_random_bytes_are_not(
    make_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    """2 KiB of junk before ``%PDF-``, and no header line at all: poppler renders both, so they end
    ``ok`` with the page's text; random bytes named ``.pdf`` still end as ``not_a_document``."""
    pdf = docs.write_pdf(tmp_path / "source.pdf", [["Invoice 42", "Total 17.50"]]).read_bytes()
    contents = {
        "buried.pdf": _junk(2048) + pdf,
        "bare.pdf": pdf[pdf.index(b"\n") + 1 :],
        "random.pdf": _junk(50_000),
    }
    daemon = make_daemon().start()
    try:
        for name, content in contents.items():
            hidden = daemon.inbox / f".{name}.part"
            hidden.write_bytes(content)
            os.replace(hidden, daemon.inbox / name)
        for name in ("buried.pdf", "bare.pdf"):
            path = daemon.inbox / name
            document = wait_until(
                lambda path=path: sidecars_done(path) or error_sidecar(path),
                120,
                f"a sidecar for {name}",
            )
            assert document.get("status") == "ok", document
            markdown = path.with_name(name + ".md").read_text()
            assert "Invoice 42" in markdown and "17.50" in markdown, markdown
            assert document["source"]["mime"] == "application/pdf"
        random_pdf = daemon.inbox / "random.pdf"
        error = wait_until(
            lambda: error_sidecar(random_pdf), 120, "the error sidecar of random.pdf"
        )
        assert error["error"]["kind"] == "not_a_document", error
        assert not random_pdf.with_name("random.pdf.md").exists()
    finally:
        assert daemon.stop() == 0


def _peak_rss(pid: int) -> int:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return next(int(line.split()[1]) for line in lines if line.startswith("VmHWM:")) * 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from Linux /proc")
def test_content_bombs_get_a_searchable_pdf_within_bounds_and_the_daemon_goes_on(
    make_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    """With ``searchable_pdf = true``: a page listing an unused form that decodes to 512 MiB (half a
    megabyte on disk) used to be parsed whole, about twice its size in memory; one that draws such a
    form, and forms nested 5,000 deep (a RecursionError, reported as internal_error). Now each ends
    ``ok`` with its searchable PDF: the first page read at once, the others without a layer of ours
    and the reason in ``text_layer_skipped``. The daemon's peak RSS stays under the one form's
    decoded size, and the document dropped after them is done too."""
    made = {
        "unused.pdf": write_form_bomb(tmp_path / "unused.pdf", 512 * MiB),
        "drawn.pdf": write_form_bomb(tmp_path / "drawn.pdf", 512 * MiB, drawn=True),
        "deep.pdf": write_nested_forms(tmp_path / "deep.pdf", 5000),
        "after.pdf": docs.write_pdf(tmp_path / "after.pdf", [["Invoice 42", "Total 17.50"]]),
    }
    daemon = make_daemon(output={"searchable_pdf": True}).start()
    assert daemon.proc is not None
    try:
        for name, source in made.items():
            os.replace(source, daemon.inbox / name)
        documents = {}
        for name in made:
            path = daemon.inbox / name
            found = wait_until(
                lambda path=path: sidecars_done(path) or error_sidecar(path),
                120,
                f"the sidecars of {name}",
            )
            assert found.get("status") == "ok", found
            documents[name] = found["searchable_pdf"]
        peak = _peak_rss(daemon.proc.pid)
    finally:
        assert daemon.stop() == 0
    assert peak < 512 * MiB, f"peak RSS {peak / MiB:.0f} MiB"
    assert not [event for event in daemon.events() if event.get("kind") == "internal_error"]
    assert documents["unused.pdf"]["text_layer"] == ["none"]  # a blank page: no text of any kind
    assert "text_layer_skipped" not in documents["unused.pdf"]
    for name, reason in (("drawn.pdf", "content_too_large"), ("deep.pdf", "forms_too_deep")):
        assert documents[name]["text_layer"] == ["none"], documents[name]
        skipped = documents[name]["text_layer_skipped"]
        assert [(skip["page"], skip["reason"]) for skip in skipped] == [(1, reason)]
    assert documents["after.pdf"]["text_layer"] == ["ocr"]
    assert "Invoice 42" in (daemon.inbox / "after.pdf.md").read_text()


@pytest.mark.skipif(not features.check("jpg_2000"), reason="Pillow writes no JPEG 2000 here")
def test_images_of_a_few_bytes_declaring_gigapixels_fail_their_kinds_and_the_daemon_goes_on(
    plugin_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    """Before: one pdftoppm took 2.3 GB (and 20 s) for a 928-byte PDF whose JPEG 2000 image
    declares 24,000 x 24,000 pixels, and its page ended ``ok``, blank. Now an image a page lists
    is measured first (``too_many_pixels``, nothing rendered), whether its dictionary or only its
    codestream says so; one inline in the content, which no dictionary lists, meets the render
    child's memory limit (``render_memory_exceeded``, not retried). The document after them is
    done."""
    made = {
        "listed.pdf": write_declared_image_pdf(tmp_path / "listed.pdf", 24_000, 24_000),
        "lying.pdf": write_declared_image_pdf(
            tmp_path / "lying.pdf", 24_000, 24_000, dictionary=(16, 16), where="form"
        ),
        "inline.pdf": write_declared_image_pdf(
            tmp_path / "inline.pdf", 24_000, 24_000, where="inline"
        ),
    }
    daemon = plugin_daemon().start()
    for name, source in made.items():
        os.replace(source, daemon.inbox / name)
    kinds = {}
    for name in made:
        path = daemon.inbox / name
        error = wait_until(partial(error_sidecar, path), 60, f"the error sidecar of {name}")
        kinds[name] = error["error"]["kind"]
        assert not path.with_name(name + ".md").exists()
    assert kinds == {
        "listed.pdf": "too_many_pixels",
        "lying.pdf": "too_many_pixels",
        "inline.pdf": "render_memory_exceeded",
    }
    events = [event["event"] for event in daemon.events()]
    assert "page_rendered" not in events and "job_retry" not in events
    after = docs.write_pdf(daemon.inbox / "after.pdf", [["Invoice 42"]])
    assert wait_until(lambda: sidecars_done(after), 60, "the document after them")["status"] == "ok"
    assert daemon.stop() == 0


_RENDER_FIVE = """
import json, os, sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from ocrwatch.pages import render
from ocrwatch.config import Config
from ocrwatch.engines.tesseract import TesseractEngine
from ocrwatch.infra.memory import DecodeBudget
from ocrwatch.pages.scheduler import auto_render_workers
cfg = Config()
spec = render.render_spec(cfg.render, TesseractEngine(cfg.engine.tesseract).geometry)
budget = DecodeBudget(cfg.render.decode_budget_mb * 1024 * 1024)
def one(name):
    path = Path(name)
    info = render.probe(path, render.Limits.from_config(cfg.limits))
    page = render.render_page(path, info, 0, spec, budget=budget)
    return page.image.size, page.image.mode
with ThreadPoolExecutor(auto_render_workers(len(os.sched_getaffinity(0)))) as pool:
    pages = list(pool.map(one, sys.argv[1:]))
status = open("/proc/self/status").read().splitlines()
peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) * 1024
print(json.dumps({"peak": peak, "pages": pages, "peak_holders": budget.peak_holders}))
"""

_BUILD = """
import sys
from PIL import Image, ImageDraw, ImageFont
side = int(sys.argv[2]) if len(sys.argv) > 2 else 12600
image = Image.new("RGBA", (side, side), (0, 0, 0, 0))
draw = ImageDraw.Draw(image)
font = ImageFont.load_default(size=side // 70)
for line in range(10):
    where = (side // 30, side // 30 + line * side // 10)
    draw.text(where, f"POSTER line {line}", fill="black", font=font)
image.save(sys.argv[1], compress_level=1)
"""

_SEARCHABLE_FIVE = """
import json, sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from ocrwatch.results import textlayer
from ocrwatch.infra.memory import DecodeBudget
budget = DecodeBudget(int(sys.argv[1]))
def one(name):
    out = Path(name + ".ocr.pdf")
    return textlayer.searchable_pdf(Path(name), "image", [None], out, "0" * 64, budget=budget).pages
with ThreadPoolExecutor(5) as pool:  # as five documents' builds run at once in the daemon
    layers = list(pool.map(one, sys.argv[2:]))
status = open("/proc/self/status").read().splitlines()
peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) * 1024
print(json.dumps({"peak": peak, "layers": layers, "peak_holders": budget.peak_holders}))
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from Linux /proc")
@pytest.mark.timeout(900)
def test_five_huge_pngs_at_once_stay_far_below_five_decoded_images(tmp_path: Path) -> None:
    """Five 12,600 x 12,600 RGBA PNGs (a megabyte or two each on disk, 635 MB each decoded) rendered
    at once: every render worker used to decode, flatten and convert its own, 2.5 GB each, and five
    peaked at 5.1 GB. With one budget they are decoded one after another, each a band at a time:
    0.75 GiB on 2 cores. The bound, 2 GiB, leaves room for any allocator and still fails where
    either half is lost (the budget alone: 2.5 GB)."""
    big = tmp_path / "big-0.png"
    subprocess.run([sys.executable, "-c", _BUILD, str(big)], check=True, timeout=300)
    files = [big]
    for number in range(1, 5):
        files.append(tmp_path / f"big-{number}.png")
        os.link(big, files[-1])
    child = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _RENDER_FIVE, *map(str, files)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=800,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    figures = json.loads(child.stdout.strip().splitlines()[-1])
    assert figures["pages"] == [[[4096, 4096], "RGB"]] * 5
    assert figures["peak_holders"] == 1
    assert figures["peak"] < 2 * GiB, f"peak RSS {figures['peak'] / GiB:.2f} GiB"


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from Linux /proc")
def test_five_huge_pngs_made_searchable_at_once_are_decoded_within_one_budget(
    tmp_path: Path,
) -> None:
    """The searchable PDF of an image used to decode it outside the budget and convert it whole:
    one 12,600 x 12,600 RGBA PNG took 2.4 GiB alone, and five documents build theirs at once.
    Now each is decoded within the renderer's budget and converted a band at a time. At a quarter
    of the pixels (6,300 x 6,300: 159 MB decoded) and a budget that holds one, five at once stay
    under 512 MiB (0.27 GiB), where the old build of five peaked at 2.9 GiB."""
    big = tmp_path / "big-0.png"
    subprocess.run([sys.executable, "-c", _BUILD, str(big), "6300"], check=True, timeout=300)
    files = [big]
    for number in range(1, 5):
        files.append(tmp_path / f"big-{number}.png")
        os.link(big, files[-1])
    child = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _SEARCHABLE_FIVE, str(256 * MiB), *map(str, files)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    figures = json.loads(child.stdout.strip().splitlines()[-1])
    assert figures["layers"] == [["none"]] * 5
    assert figures["peak_holders"] == 1
    assert figures["peak"] < 512 * MiB, f"peak RSS {figures['peak'] / MiB:.0f} MiB"
