"""The Tesseract engine end to end: the real binary on pages drawn here, and on a corpus PDF.

Children are observed through /proc (parent pid, command name, environment), not through mocks.
"""

from __future__ import annotations

import asyncio
import difflib
import os
import shutil
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from PIL import Image, ImageDraw, ImageFont

from ocrwatch.engines.base import Engine, PageRequest
from ocrwatch.engines.tesseract import TesseractEngine, parse_tsv
from ocrwatch.engines.tesseract_options import TesseractConfig
from ocrwatch.errors import ConfigError, EngineFailed
from ocrwatch.pages import osd

pytestmark = pytest.mark.skipif(
    shutil.which("tesseract") is None, reason="tesseract is not installed"
)

T = TypeVar("T")
PAGE = (1700, 2200)
LINES = [
    "The quick brown fox jumps over the lazy dog.",
    "Invoice 4711 was paid on 12 March 2024.",
    "Sphinx of black quartz, judge my vow.",
]
LINE_TOPS = [200, 500, 800]
LEFT = 150


def draw_page(lines: list[str], tops: list[int], mode: str = "L") -> Image.Image:
    """A white letter-size page at 200 dpi with black text in Pillow's bundled font."""
    image = Image.new(mode, PAGE, "white" if mode != "RGBA" else (0, 0, 0, 0))
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=48)
    for text, top in zip(lines, tops, strict=True):
        draw.text((LEFT, top), text, font=font, fill="black")
    return image


def slow_page() -> Image.Image:
    """A 400 dpi letter page full of text: about six seconds of OCR, so a child killed early is seen
    as killed (its page cannot have finished) rather than as done."""
    image = Image.new("L", (3400, 4400), 255)
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=48)
    for i in range(68):
        text = (
            f"Line {i}: the committee reviewed the budget of the library and the river "
            "station, then met again."
        )
        draw.text((60, 40 + 63 * i), text, font=font, fill="black")
    return image


def run(main: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(main())  # type: ignore[arg-type]


def tesseract_children() -> dict[int, dict[str, str]]:
    """This process's tesseract children: pid -> their environment."""
    children = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            state, parent = stat[stat.rindex(")") + 2 :].split()[:2]
            if int(parent) != os.getpid() or name != "tesseract" or state == "Z":
                continue  # a zombie not yet reaped shows an empty environment
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        children[int(entry.name)] = dict(
            item.decode().partition("=")[::2] for item in environ if item
        )
    return children


async def busy_child(timeout: float = 10.0) -> int:
    """The pid of this process's tesseract child, once it has had its image and is recognising:
    killed earlier, a child dies of its cut-off input anyway, which would hide a missing kill."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        children = tesseract_children()
        if children:
            await asyncio.sleep(0.3)
            return next(iter(children))
        await asyncio.sleep(0.005)
    raise AssertionError("no tesseract child appeared")


def char_error_rate(got: str, want: str) -> float:
    """Levenshtein distance over the expected length."""
    previous = list(range(len(got) + 1))
    for i, w in enumerate(want, 1):
        current = [i]
        for j, g in enumerate(got, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (w != g)))
        previous = current
    return previous[-1] / max(1, len(want))


async def started(**overrides: Any) -> TesseractEngine:
    engine = TesseractEngine(TesseractConfig(**overrides))
    await engine.start()
    return engine


def test_recognizes_drawn_text_with_line_boxes() -> None:
    async def main() -> Any:
        engine = await started()
        assert isinstance(engine, Engine)
        return await engine.recognize(PageRequest("page-1", draw_page(LINES, LINE_TOPS), prompt=""))

    result = run(main)
    assert char_error_rate(result.markdown, "\n\n".join(LINES)) < 0.03, result.markdown
    assert "\n\n" in result.markdown and "\n\n\n" not in result.markdown
    assert (
        result.finish_reason == "stop"
        and result.prompt_tokens is None
        and result.completion_tokens is None
    )
    assert result.seconds > 0 and set(result.timings) == {"queue", "encode", "ocr"}
    assert len(result.blocks) == len(LINES)
    for block, text, top in zip(result.blocks, LINES, LINE_TOPS, strict=True):
        left, upper, right, lower = block["bbox"]
        assert block["type"] == "line" and char_error_rate(block["text"], text) < 0.05
        assert 0 <= left < right <= PAGE[0] and 0 <= upper < lower <= PAGE[1]
        assert abs(left - LEFT) < 15 and top <= upper < top + 30 and 30 < lower - upper < 80
        assert 0 <= block["conf"] <= 100
        words = block["words"]
        assert " ".join(word["text"] for word in words) == block["text"] and len(words) == len(
            text.split()
        )
        for word, following in zip(words, words[1:] + [None], strict=True):
            assert (
                left <= word["bbox"][0] < word["bbox"][2] <= right
                and upper <= word["bbox"][1] < lower
            )
            assert following is None or word["bbox"][2] < following["bbox"][0]
    assert [block["paragraph"] for block in result.blocks] == [1, 2, 3]


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "1"])
def test_image_modes(mode: str) -> None:
    async def main() -> Any:
        engine = await started(workers=1)
        return await engine.recognize(
            PageRequest("page-1", draw_page(LINES[:1], LINE_TOPS[:1], mode), prompt="")
        )

    assert char_error_rate(run(main).markdown, LINES[0]) < 0.05


def test_blank_page_gives_empty_markdown() -> None:
    async def main() -> Any:
        engine = await started()
        return await engine.recognize(PageRequest("blank", Image.new("L", PAGE, 255), prompt=""))

    result = run(main)
    assert result.markdown == "" and result.blocks == []


def test_describe_and_hints() -> None:
    async def main() -> TesseractEngine:
        return await started(workers=3, dpi=250, psm=6)

    engine = run(main)
    description = engine.describe()
    assert description["name"] == "tesseract" and description["version"][0].isdigit()
    assert description | {"version": None} == {
        "name": "tesseract",
        "version": None,
        "lang": "auto",
        "psm": 6,
        "dpi": 250,
        "workers": 3,
    }
    assert engine.geometry.dpi == 250 and engine.max_concurrency == 3
    assert TesseractEngine(TesseractConfig()).max_concurrency == os.cpu_count()
    engine.release()


def test_concurrency_is_bounded_by_workers_and_threads_by_omp_limit() -> None:
    seen: dict[int, dict[str, str]] = {}
    most = 0

    async def sample(stop: asyncio.Event) -> None:
        nonlocal most
        while not stop.is_set():
            children = tesseract_children()
            seen.update(children)
            most = max(most, len(children))
            await asyncio.sleep(0.002)

    async def main() -> list[Any]:
        engine = await started(workers=2)
        stop = asyncio.Event()
        sampler = asyncio.create_task(sample(stop))
        pages = [
            engine.recognize(PageRequest(f"p{i}", draw_page(LINES, LINE_TOPS), prompt=""))
            for i in range(6)
        ]
        results = await asyncio.gather(*pages)
        stop.set()
        await sampler
        return results

    results = run(main)
    assert all("quick brown fox" in result.markdown for result in results)
    assert most == 2, f"at most {most} children at once"
    assert len(seen) == 6
    assert all(environ.get("OMP_THREAD_LIMIT") == "1" for environ in seen.values())


def test_abort_kills_the_child_and_frees_its_slot() -> None:
    async def main() -> Any:
        engine = await started(workers=1)
        task = asyncio.create_task(engine.recognize(PageRequest("slow", slow_page(), prompt="")))
        pid = await busy_child()
        await engine.abort("slow")
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=1)
        assert not Path(f"/proc/{pid}").exists(), "the aborted child is still there (or a zombie)"
        await engine.abort("slow")  # finished by now: a no-op
        await engine.abort("never-seen")
        # the single slot is free again
        return await engine.recognize(
            PageRequest("next", draw_page(LINES[:1], LINE_TOPS[:1]), prompt="")
        )

    assert "quick brown fox" in run(main).markdown
    assert tesseract_children() == {}


def test_abort_of_a_queued_page_never_starts_it() -> None:
    async def main() -> set[int]:
        engine = await started(workers=1)
        first = asyncio.create_task(engine.recognize(PageRequest("first", slow_page(), prompt="")))
        pid = await busy_child()
        queued = asyncio.create_task(
            engine.recognize(PageRequest("queued", slow_page(), prompt=""))
        )
        await asyncio.sleep(0.05)
        await engine.abort("queued")
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(queued, timeout=1)
        children = set(tesseract_children())
        assert not first.done()
        await engine.abort("first")
        with pytest.raises(asyncio.CancelledError):
            await first
        assert children == {pid}
        return set(tesseract_children())

    assert run(main) == set()


def test_cancelled_recognize_leaves_no_tesseract_process() -> None:
    async def main() -> None:
        engine = await started(workers=2)
        pages = [PageRequest(f"p{i}", slow_page(), prompt="") for i in range(3)]
        tasks = [asyncio.create_task(engine.recognize(page)) for page in pages]
        await busy_child()
        for task in tasks:
            task.cancel()
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=2)
        assert all(isinstance(result, asyncio.CancelledError) for result in results)
        assert tesseract_children() == {}

    run(main)


def test_close_kills_pages_in_flight() -> None:
    async def main() -> None:
        engine = await started(workers=1)
        task = asyncio.create_task(engine.recognize(PageRequest("slow", slow_page(), prompt="")))
        await busy_child()
        await asyncio.wait_for(engine.close(), timeout=2)
        assert tesseract_children() == {}
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main)


def test_tesseract_failure_raises_engine_failed_with_its_stderr() -> None:
    async def main() -> None:
        # not started: start() would refuse the language
        engine = TesseractEngine(TesseractConfig(lang="xyz"))
        await engine.recognize(PageRequest("p", draw_page(LINES[:1], LINE_TOPS[:1]), prompt=""))

    with pytest.raises(EngineFailed) as failure:
        run(main)
    assert (
        "status 1" in failure.value.message
        and "Failed loading language 'xyz'" in failure.value.message
    )
    assert failure.value.retryable


# Pillow's bundled font has no umlauts
DEJAVU = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")


def german_page() -> Image.Image:
    image = Image.new("L", (1240, 400), 255)
    font = ImageFont.truetype(str(DEJAVU), 48)
    ImageDraw.Draw(image).text((60, 60), "Die Größe der Straße", font=font, fill=0)
    return image


def test_a_request_s_lang_is_the_language_tesseract_reads() -> None:
    """Each page is read in its request's languages (an inbox's ``lang``), else the engine's own."""

    async def main() -> None:
        engine = await started(lang="eng")
        page = draw_page(LINES[:1], LINE_TOPS[:1])
        try:
            assert (
                "quick brown fox"
                in (await engine.recognize(PageRequest("own", page, prompt=""))).markdown
            )
            # it reached tesseract's -l
            with pytest.raises(EngineFailed, match="Failed loading language 'zzz'"):
                await engine.recognize(PageRequest("other", page, prompt="", lang="zzz"))
            if (
                DEJAVU.exists()
                and "deu"
                in subprocess.run(
                    ["tesseract", "--list-langs"], capture_output=True, text=True
                ).stdout.split()
            ):
                german = german_page()
                read = await engine.recognize(PageRequest("de", german, prompt="", lang="deu"))
                assert "Größe der Straße" in read.markdown
                assert (
                    "Größe"
                    not in (await engine.recognize(PageRequest("en", german, prompt=""))).markdown
                )
        finally:
            await engine.close()

    run(main)


def test_auto_reads_each_page_in_its_script_s_language(monkeypatch: pytest.MonkeyPatch) -> None:
    """``lang = "auto"``: a page is read in the installed language of the script OSD found on it,
    recorded on its recognition; eng where that script has none installed, or no script is known.
    (Only Latin languages are installed here: Greek is mapped to deu for the test.)"""
    monkeypatch.setitem(osd.LANGUAGES, "Greek", ("deu",))

    async def main() -> None:
        engine = await started(lang="auto")
        german = german_page()
        try:
            read = await engine.recognize(PageRequest("gr", german, prompt="", script="Greek"))
            assert (read.lang, "Größe der Straße" in read.markdown) == ("deu+eng", True)
            for script in (None, "Hebrew", "Latin"):
                read = await engine.recognize(PageRequest("x", german, prompt="", script=script))
                assert (read.lang, "Größe" in read.markdown) == ("eng", False)
        finally:
            await engine.close()

    if "deu" not in installed_languages():
        pytest.skip("tesseract-ocr-deu is not installed")
    run(main)


def installed_languages() -> set[str]:
    listed = subprocess.run(["tesseract", "--list-langs"], capture_output=True, text=True)
    return set(listed.stdout.split())


def test_start_names_a_missing_binary_and_its_package(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as failure:
        run(lambda: started(binary=str(tmp_path / "tesseract")))
    assert str(tmp_path / "tesseract") in failure.value.message
    assert "tesseract-ocr" in failure.value.hint


def test_start_names_missing_language_data_and_its_package() -> None:
    with pytest.raises(ConfigError) as failure:
        run(lambda: started(lang="eng+chi_sim"))
    assert "chi_sim" in failure.value.message and "eng" in failure.value.message
    assert "tesseract-ocr-chi-sim" in failure.value.hint


def test_parse_tsv_groups_words_into_lines_and_paragraphs() -> None:
    header = (
        "level\tpage_num\tblock_num\tpar_num\tline_num\tword_num"
        "\tleft\ttop\twidth\theight\tconf\ttext"
    )
    rows = [
        "1\t1\t0\t0\t0\t0\t0\t0\t1700\t2200\t-1\t",
        "4\t1\t1\t1\t1\t0\t150\t200\t400\t40\t-1\t",
        "5\t1\t1\t1\t1\t1\t150\t200\t100\t40\t96.5\tHello",
        "5\t1\t1\t1\t1\t2\t260\t205\t290\t30\t93.5\tworld,",
        "5\t1\t1\t1\t2\t1\t150\t250\t120\t40\t90\tagain",
        "5\t1\t1\t1\t2\t2\t280\t250\t10\t40\t10\t ",
        "5\t1\t2\t1\t1\t1\t150\t900\t200\t40\t80\tAnother",
        "5\t1\t2\t1\t1\t2\t360\t900\t200\t45\t70\tparagraph.",
    ]
    markdown, blocks = parse_tsv("\n".join([header, *rows]) + "\n")
    assert markdown == "Hello world,\nagain\n\nAnother paragraph."
    assert blocks == [
        {
            "type": "line",
            "text": "Hello world,",
            "bbox": [150, 200, 550, 240],
            "conf": 95.0,
            "paragraph": 1,
            "words": [
                {"text": "Hello", "bbox": [150, 200, 250, 240], "conf": 96.5},
                {"text": "world,", "bbox": [260, 205, 550, 235], "conf": 93.5},
            ],
        },
        {
            "type": "line",
            "text": "again",
            "bbox": [150, 250, 270, 290],
            "conf": 90.0,
            "paragraph": 1,
            "words": [{"text": "again", "bbox": [150, 250, 270, 290], "conf": 90.0}],
        },
        {
            "type": "line",
            "text": "Another paragraph.",
            "bbox": [150, 900, 560, 945],
            "conf": 75.0,
            "paragraph": 2,
            "words": [
                {"text": "Another", "bbox": [150, 900, 350, 940], "conf": 80.0},
                {"text": "paragraph.", "bbox": [360, 900, 560, 945], "conf": 70.0},
            ],
        },
    ]
    assert parse_tsv("") == ("", [])


def test_corpus_linn_first_page(corpus_dir: Path, tmp_path: Path) -> None:
    if shutil.which("pdftoppm") is None:
        pytest.skip("pdftoppm (poppler-utils) is not installed")
    pdf, prefix = str(corpus_dir / "linn.pdf"), str(tmp_path / "page")
    subprocess.run(
        ["pdftoppm", "-r", "300", "-f", "1", "-l", "1", "-png", pdf, prefix],
        check=True,
        timeout=120,
    )
    (rendered,) = tmp_path.glob("page*.png")

    async def main() -> Any:
        engine = await started()
        with Image.open(rendered) as image:
            return await engine.recognize(PageRequest("linn-1", image, prompt=""))

    words = run(main).markdown.split()
    reference = (corpus_dir / "linn.pdf.ref.txt").read_text().split()
    similarity = difflib.SequenceMatcher(None, words, reference, autojunk=False).ratio()
    assert similarity >= 0.9, similarity
