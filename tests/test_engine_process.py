"""An engine in a child process: the real Tesseract engine served by ``python -m
ocrwatch.engines.process``, observed through its replies and /proc; the replica router
(``EngineSet``) over those children and on its own, and the vLLM replica processes' arguments."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageDraw, ImageFont

from ocrwatch.config import EngineConfig
from ocrwatch.engines import registry
from ocrwatch.engines.base import PageRequest, Recognition
from ocrwatch.engines.deepseek.options import VllmConfig
from ocrwatch.engines.process import ProcessEngine
from ocrwatch.engines.replicas import EngineSet
from ocrwatch.engines.tesseract_options import TesseractConfig
from ocrwatch.errors import ConfigError, EngineDead
from tests.support.engines_base import StubEngine

needs_tesseract = pytest.mark.skipif(
    shutil.which("tesseract") is None, reason="tesseract is not installed"
)


def text_page(lines: list[str], size: tuple[int, int] = (1400, 400)) -> Image.Image:
    image = Image.new("L", size, 255)
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=48)
    for number, line in enumerate(lines):
        draw.text((60, 60 + 80 * number), line, font=font, fill=0)
    return image


def slow_page() -> Image.Image:
    return text_page(
        [f"Line {i}: the committee reviewed the budget of the library again." for i in range(60)],
        size=(3400, 5000),
    )


def tesseract(workers: int = 2, binary: str = "tesseract") -> ProcessEngine:
    cfg = EngineConfig(
        kind="tesseract", tesseract=TesseractConfig(dpi=150, workers=workers, binary=binary)
    )
    return ProcessEngine("tesseract", cfg)


def children(of: int | None = None) -> list[int]:
    """The children of ``of`` (this process), from /proc."""
    parent = of or os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(entry))
    return found


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie may wait for a reaper that a container lacks)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


SLEEP = ["sleep", "600"]
"""The engine's own process in ``DAEMON``: what vLLM's engine core is to its engine."""


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    except OSError:
        return []


DAEMON = """
import asyncio
from ocrwatch.config import EngineConfig
from ocrwatch.engines.process import ProcessEngine

cfg = EngineConfig(kind="plugin", plugin="tests.support.fault_engines:EchoEngine",
                   plugin_args={"start_delay": 600, "start_command": ["sleep", "600"]})
asyncio.run(ProcessEngine("plugin", cfg).start())
"""


@needs_tesseract
async def test_a_page_is_read_by_tesseract_in_a_child_process() -> None:
    before = set(children())
    engine = tesseract()
    await engine.start()
    try:
        (child,) = set(children()) - before
        assert (
            engine.name == "tesseract"
            and engine.max_concurrency == 2
            and engine.geometry.dpi == 150
        )
        pages = [
            PageRequest(f"p{i}", text_page([f"Invoice {4711 + i} paid"]), "markdown")
            for i in range(3)
        ]
        results = await asyncio.gather(*(engine.recognize(page) for page in pages))
        for index, result in enumerate(results):
            assert isinstance(result, Recognition)
            assert f"Invoice {4711 + index} paid" in result.markdown
        # Ctrl-C reaches the process group; the daemon alone acts on it
        os.kill(child, signal.SIGINT)
        rgb = await engine.recognize(
            PageRequest("rgb", text_page(["Colour page"]).convert("RGB"), "markdown")
        )
        assert "Colour page" in rgb.markdown
        assert engine.describe()["name"] == "tesseract"
    finally:
        await engine.close()
    assert child not in children()
    assert engine._scratch is not None and not engine._scratch.exists()


@needs_tesseract
async def test_abort_and_cancel_stop_a_page_and_the_child_serves_on() -> None:
    engine = tesseract()
    await engine.start()
    try:
        slow = asyncio.create_task(engine.recognize(PageRequest("slow", slow_page(), "markdown")))
        await asyncio.sleep(1.0)
        await engine.abort("slow")
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(slow, 10)
        caller = asyncio.create_task(
            engine.recognize(PageRequest("slow2", slow_page(), "markdown"))
        )
        await asyncio.sleep(1.0)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        after = await engine.recognize(
            PageRequest("after", text_page(["Still serving"]), "markdown")
        )
        assert "Still serving" in after.markdown
    finally:
        await engine.close()


@needs_tesseract
async def test_a_killed_child_fails_its_pages_as_engine_dead() -> None:
    before = set(children())
    engine = tesseract()
    await engine.start()
    (child,) = set(children()) - before
    try:
        slow = asyncio.create_task(engine.recognize(PageRequest("slow", slow_page(), "markdown")))
        await asyncio.sleep(1.0)
        os.kill(child, signal.SIGKILL)
        with pytest.raises(EngineDead, match="exited with status -9"):
            await asyncio.wait_for(slow, 10)
        with pytest.raises(EngineDead):
            await engine.recognize(PageRequest("next", text_page(["x"]), "markdown"))
    finally:
        await engine.close()


async def wait_until(condition: Any, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


@needs_tesseract
@pytest.mark.slow
async def test_a_dead_replica_is_restarted_alone_and_its_page_finished_by_another() -> None:
    before = set(children())
    engines = EngineSet([tesseract(workers=1), tesseract(workers=1)])
    await engines.start()
    try:
        first, second = (engine._proc.pid for engine in engines.engines)  # type: ignore[attr-defined]
        assert set(children()) - before == {first, second}
        slow = [
            asyncio.create_task(engines.recognize(PageRequest(f"slow{i}", slow_page(), "markdown")))
            for i in range(2)
        ]
        await asyncio.sleep(1.0)  # one page in each child
        os.kill(first, signal.SIGKILL)
        for page in await asyncio.wait_for(asyncio.gather(*slow), 120):
            # the killed child's page too
            assert "the committee reviewed the budget" in page.markdown
        await wait_until(lambda: not engines._down)
        restarted = engines.engines[0]._proc.pid  # type: ignore[attr-defined]
        assert restarted != first and set(children()) - before == {restarted, second}
        alone = await engines.engines[0].recognize(
            PageRequest("alone", text_page(["Restarted child"]), "markdown")
        )
        assert "Restarted child" in alone.markdown
        pages = [
            PageRequest(f"p{i}", text_page([f"Receipt {100 + i}"]), "markdown") for i in range(4)
        ]
        for index, page in enumerate(await asyncio.gather(*(engines.recognize(p) for p in pages))):
            assert f"Receipt {100 + index}" in page.markdown
    finally:
        await engines.close()
    assert set(children()) - before == set()


@needs_tesseract
async def test_a_set_with_every_replica_down_fails_the_page_as_engine_dead() -> None:
    engines = EngineSet([tesseract(workers=1), tesseract(workers=1)])
    await engines.start()
    try:
        for engine in engines.engines:
            os.kill(engine._proc.pid, signal.SIGKILL)  # type: ignore[attr-defined]
        await wait_until(lambda: all(engine._dead for engine in engines.engines))  # type: ignore[attr-defined]
        with pytest.raises(EngineDead):
            await engines.recognize(
                PageRequest("late", text_page(["Nobody reads this"]), "markdown")
            )
        assert engines._down == {0, 1}
    finally:
        await engines.close()


async def test_a_start_cancelled_while_the_child_starts_leaves_no_child() -> None:
    """The daemon stopping while a replica restarts cancels its start: the child must go at once,
    not wait for an engine start (minutes for vLLM) to finish."""
    before = set(children())
    cfg = EngineConfig(
        kind="plugin",
        plugin="tests.support.fault_engines:EchoEngine",
        plugin_args={"start_delay": 60},
    )
    engine = ProcessEngine("plugin", cfg)
    starting = asyncio.create_task(engine.start())
    await wait_until(lambda: bool(set(children()) - before) and engine._ready is not None, 30)
    started = time.monotonic()
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert time.monotonic() - started < 10
    assert set(children()) - before == set()
    assert engine._scratch is not None and not engine._scratch.exists()


async def test_a_daemon_killed_outright_takes_its_engine_process_and_the_engines_own_along() -> (
    None
):
    """Killed while its engine starts (the child reads no socket then), the daemon must not leave
    the child or the engine's own process (vLLM's engine core, here ``sleep``) holding a GPU."""
    daemon = subprocess.Popen([sys.executable, "-c", DAEMON], cwd=Path(__file__).parents[1])
    try:
        found: list[tuple[int, int]] = []

        def started() -> bool:
            """The child and its ``sleep``, known by its command line: a child's start may run a
            short-lived helper of its own first (a library probing the system), gone a moment
            later."""
            kids = children(daemon.pid)
            sleeping = [pid for pid in children(kids[0]) if cmdline(pid) == SLEEP] if kids else []
            found[:] = [(kids[0], sleeping[0])] if len(kids) == 1 and sleeping else []
            return bool(found)

        await wait_until(started, 30)
        [(child, engine_process)] = found
        assert os.getpgid(child) == os.getpgid(engine_process) == child != os.getpgid(daemon.pid)
    finally:
        daemon.kill()
        daemon.wait()
    await wait_until(lambda: not running(child) and not running(engine_process), 15)


async def test_a_child_that_cannot_start_raises_the_engines_own_error() -> None:
    engine = tesseract(binary="/nonexistent/tesseract")
    with pytest.raises(ConfigError, match="nonexistent"):
        await engine.start()
    assert engine._scratch is not None and not engine._scratch.exists()


class Counting(StubEngine):
    """A stand-in engine for the router's choice alone: it counts the pages in it and the aborts it
    is sent."""

    def __init__(self, name: str, gate: asyncio.Event) -> None:
        super().__init__(max_concurrency=4, dpi=144)
        self.name = name
        self.gate = gate
        self.aborted: list[str] = []

    async def _work(self, page: PageRequest) -> Recognition:
        await self.gate.wait()
        return Recognition(markdown=self.name, raw=self.name)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


async def test_the_set_sends_each_page_to_the_least_loaded_engine() -> None:
    gate = asyncio.Event()
    a, b = Counting("a", gate), Counting("b", gate)
    engines = EngineSet([a, b])
    await engines.start()
    assert engines.max_concurrency == 8 and engines.describe() == {"name": "a", "processes": 2}
    tasks = [
        asyncio.create_task(engines.recognize(PageRequest(f"p{i}", Image.new("L", (8, 8)), "")))
        for i in range(6)
    ]
    await asyncio.sleep(0)
    assert (len(a.requests.seen), len(b.requests.seen)) == (3, 3)
    await engines.abort("p1")
    assert a.aborted == b.aborted == ["p1"]
    gate.set()
    assert sorted(r.markdown for r in await asyncio.gather(*tasks)) == [
        "a",
        "a",
        "a",
        "b",
        "b",
        "b",
    ]


def test_vllm_replica_processes_are_one_engine_per_gpu_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,5,7")
    cfg = EngineConfig(
        kind="vllm", vllm=VllmConfig(replicas=2, tensor_parallel_size=2, replica_processes=True)
    )
    engine = registry.build(cfg, kind="vllm")
    assert isinstance(engine, EngineSet)
    envs = [child._env for child in engine.engines]  # type: ignore[attr-defined]
    assert envs == [{"CUDA_VISIBLE_DEVICES": "2,3"}, {"CUDA_VISIBLE_DEVICES": "5,7"}]
    for child in engine.engines:
        spec = child._spec  # type: ignore[attr-defined]
        inner = EngineConfig.model_validate(spec["engine"]).vllm
        assert (
            spec["kind"],
            inner.replicas,
            inner.replica_processes,
            inner.tensor_parallel_size,
        ) == ("vllm", 1, False, 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(ConfigError, match="need 4 GPUs, 2 visible"):
        registry.build(cfg, kind="vllm")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(registry, "gpu_count", lambda: 2)
    by_default = registry.build(EngineConfig(kind="vllm", vllm=VllmConfig(replicas=2)), kind="vllm")
    assert isinstance(by_default, EngineSet)
    assert [child._env for child in by_default.engines] == [  # type: ignore[attr-defined]
        {"CUDA_VISIBLE_DEVICES": "0"},
        {"CUDA_VISIBLE_DEVICES": "1"},
    ]
    one = registry.build(
        EngineConfig(kind="vllm", vllm=VllmConfig(replica_processes=True)), kind="vllm"
    )
    assert isinstance(one, EngineSet) and len(one.engines) == 1
    assert one.engines[0]._env == {}  # type: ignore[attr-defined]  # one replica sees the daemon's GPUs


async def test_a_vllm_replica_process_that_cannot_start_says_why() -> None:
    """The real vLLM engine in the child: without vllm installed (or without a GPU, or without the
    model), its start fails there and the daemon gets the engine's own error, retryable, with the
    child gone."""
    before = set(children())
    cfg = EngineConfig(
        kind="vllm", vllm=VllmConfig(model="/nonexistent/DeepSeek-OCR-2", enforce_eager=True)
    )
    engine = ProcessEngine("vllm", cfg, env={"CUDA_VISIBLE_DEVICES": ""})
    with pytest.raises(EngineDead, match="vLLM engine could not start") as caught:
        await engine.start()
    assert caught.value.retryable
    assert set(children()) - before == set()


@needs_tesseract
async def test_the_child_trims_its_heap_when_the_daemon_releases_a_document(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The child's front end must hand freed memory back like the daemon does (a vLLM replica
    process grew by gigabytes over a few hundred pages when only the daemon trimmed)."""
    from ocrwatch.engines import process
    from ocrwatch.infra import logging as ocw_logging

    trims: list[float] = []

    class CountingTrimmer:
        def __call__(self) -> bool:
            trims.append(time.monotonic())
            return True

    monkeypatch.setattr(process, "HeapTrimmer", CountingTrimmer)
    # the child's logging is this process's
    monkeypatch.setattr(ocw_logging, "configure", lambda config: None)
    parent, child = process.socket.socketpair()
    server = asyncio.create_task(process._serve(child))
    reader, writer = await asyncio.open_unix_connection(sock=parent)
    try:
        await process._send(writer, ("start", tesseract()._spec))
        ready = await process._receive(reader)
        assert ready is not None and ready[0] == "ready"
        await process._send(writer, ("release",))
        await process._send(writer, ("release",))
        await wait_until(lambda: len(trims) == 2, 2)
        await process._send(writer, ("close",))
        await asyncio.wait_for(server, 30)
    finally:
        writer.close()
        server.cancel()
