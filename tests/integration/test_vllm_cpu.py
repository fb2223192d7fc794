"""The vLLM lane: ocrwatch's own vLLM engine end to end on vLLM's CPU build, through the real daemon
and ``ocrwatch ocr``, with a random-weight DeepSeek-OCR-2 replica shrunk in its language model,
made at test time by the project's model maker (``bench/gpu/make_model.py --tiny``) and loaded with
``load_format = "dummy"``.

``tests/run.sh`` runs these in a venv of their own (``tests/vllm_cpu/setup.sh``); elsewhere, where
vLLM does not import, they are skipped. One daemon serves the module (an engine start costs a
minute or two on 2 cores), so the tests run in file order (``-p no:randomly``), SIGTERM last."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageDraw

from tests.integration.conftest import REPO, DaemonProcess, alive, sidecars_done, wait_until

pytestmark = [
    pytest.mark.vllm_cpu,
    pytest.mark.integration,
    pytest.mark.timeout(900),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"),
]

ENGINE_START_S = 600
"""Generous: the lane's machine is shared with the rest of the suite."""
PAGE_S = 300
LONG_PROMPT = "word " * 3000
"""Longer than ``max_model_len``: vLLM refuses every request of the inbox that uses it."""


def page(path: Path, label: str) -> Path:
    """A page within DeepSeek-OCR-2's tile size (768 px), so only its global view is encoded."""
    image = Image.new("RGB", (600, 760), "white")
    draw = ImageDraw.Draw(image)
    for line in range(12):
        draw.text((30, 30 + 50 * line), f"{label}: the quick brown fox, line {line}", fill="black")
    image.save(path)
    return path


def descendants(pid: int) -> dict[int, str]:
    """Live descendants of ``pid`` and their command names."""
    parents: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            comm = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2 :].split()
            if fields[0] != "Z":
                parents[int(entry.name)] = (int(fields[1]), comm)
    found: dict[int, str] = {}
    frontier = {pid}
    while frontier:
        frontier = {child for child, (ppid, _) in parents.items() if ppid in frontier}
        found.update({child: parents[child][1] for child in frontier})
    return found


def peak_rss_bytes(pids: list[int]) -> int:
    """The sum of each process's peak resident memory (VmHWM)."""
    total = 0
    for pid in pids:
        try:
            status = (Path("/proc") / str(pid) / "status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                total += int(line.split()[1]) * 1024
    return total


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("model") / "dsocr2-tiny"
    subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu" / "make_model.py"), str(out), "--tiny"],
        check=True,
    )
    return out


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[DaemonProcess]:
    root = tmp_path_factory.mktemp("lane")
    refused = root / "refused"
    refused.mkdir()
    process = DaemonProcess(
        root,
        inboxes=[
            {"path": str(root / "inbox"), "settle_seconds": 0.3},
            {"path": str(refused), "settle_seconds": 0.3, "prompt": "long"},
        ],
        engine={
            "kind": "vllm",
            "vllm": {
                "model": str(tiny_model),
                "load_format": "dummy",
                "max_model_len": 2048,
                "max_tokens": 16,
                # random weights never end a page: every output is final, as in benchmarks
                "ignore_eos": True,
                "prompts": {"long": LONG_PROMPT},
            },
        },
        daemon={"shutdown_timeout": 60.0, "health_interval_seconds": 0.5},
    )
    started = time.monotonic()
    process.start(wait_ready=False)
    wait_until(
        process.ready, ENGINE_START_S, lambda: f"engine ready:\n{process.log_text()[-4000:]}"
    )
    ready = next(e for e in process.events() if e.get("event") == "vllm_engine_ready")
    print(
        f"LANE engine start: {time.monotonic() - started:.1f} s to ready "
        f"(engine {ready['seconds']} s: import {ready['seconds_import']}, build "
        f"{ready['seconds_engine']}, warm-up {ready['seconds_warmup']})"
    )
    yield process
    if process.proc is not None and process.proc.poll() is None:
        process.kill()


def done(path: Path) -> dict[str, Any]:
    data = wait_until(lambda: sidecars_done(path), PAGE_S, f"sidecars of {path.name}")
    assert isinstance(data, dict)
    return data


def test_pages_through_the_daemon_and_ocr_get_valid_sidecars(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """The daemon's inbox and ``ocrwatch ocr`` (handed to the running daemon): sidecars valid
    against the published schema, read by the vLLM engine on the CPU."""
    started = time.monotonic()
    data = done(page(daemon.inbox / "first.png", "first"))
    print(f"LANE first page through the inbox: {time.monotonic() - started:.1f} s")
    assert data["status"] == "ok", data
    assert data["engine"]["name"] == "vllm" and data["engine"]["load_format"] == "dummy"
    assert data["pages"][0]["status"] == "ok" and data["pages"][0]["attempts"] == 1
    assert (daemon.inbox / "first.png.md").read_text().strip()
    platform = [e for e in daemon.events() if e.get("event") == "vllm_platform"]
    assert (
        platform[0]["settings"].startswith("cpu (the host's CPU")
        and "eager" in platform[0]["settings"]
    )

    source = page(tmp_path / "cli.png", "cli")
    out = tmp_path / "out"
    started = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ocrwatch",
            "ocr",
            "--config",
            str(daemon.config_path),
            "--out",
            str(out),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=PAGE_S,
        cwd=daemon.root,
    )
    print(f"LANE ocrwatch ocr of one page: {time.monotonic() - started:.1f} s")
    assert result.returncode == 0, result.stdout + result.stderr
    written = sidecars_done(out / "cli.png")
    assert written is not None and written["status"] == "ok"


def test_a_page_whose_engine_request_fails_is_retried_by_the_ladder(daemon: DaemonProcess) -> None:
    """vLLM refuses a prompt longer than ``max_model_len``: each rung's request fails in the
    engine, the ladder tries the next, the page ends failed and its document partial; the engine
    lives on."""
    refused = daemon.root / "refused"
    data = done(page(refused / "long.png", "long"))
    attempts = data["pages"][0]["attempts"]
    assert data["status"] == "partial" and data["pages"][0]["status"] == "failed", data
    assert attempts == 3
    failed = [e for e in daemon.events() if e.get("event") == "page_attempt_failed"]
    assert [e["rung"] for e in failed] == [0, 1, 2]
    assert {e["kind"] for e in failed} == {"engine_failed"}
    assert not [e for e in daemon.events() if e.get("event") == "engine_dead"]
    assert daemon.ready()


def gauge(daemon: DaemonProcess, name: str) -> float:
    """The sum of a gauge's series, whatever their labels."""
    found = re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", daemon.metrics(), re.MULTILINE)
    assert found, f"{name} is not among the daemon's metrics"
    return sum(float(value) for value in found)


def test_a_done_documents_memory_is_released(daemon: DaemonProcess) -> None:
    """Once their sidecars are written (the inbox's page, ``ocr``'s and the ladder's failed one),
    nothing of the documents stays: no page held by the scheduler or inside the engine, no spool
    folder of their sessions."""
    assert gauge(daemon, "ocrwatch_documents_total") >= 3, "the earlier tests' documents are done"
    spools = daemon.state / "tmp"

    def released() -> bool:
        return (
            gauge(daemon, "ocrwatch_active_documents") == 0
            and gauge(daemon, "ocrwatch_inflight_pages") == 0
            and not list(spools.glob("job-*"))
        )

    wait_until(
        released,
        PAGE_S,
        lambda: (
            f"documents released: {sorted(p.name for p in spools.iterdir())}\n"
            + "\n".join(
                line
                for line in daemon.metrics().splitlines()
                if "active_doc" in line or "inflight" in line
            )
        ),
    )


def test_a_killed_engine_core_is_rebuilt_and_its_documents_finish(daemon: DaemonProcess) -> None:
    assert daemon.proc is not None
    cores = [pid for pid, name in descendants(daemon.proc.pid).items() if "EngineCor" in name]
    assert len(cores) == 1, descendants(daemon.proc.pid)
    paths = [page(daemon.inbox / f"killed{i}.png", f"killed {i}") for i in range(2)]
    wait_until(
        lambda: any(
            e.get("event") == "job_started" and "killed" in e.get("uri", "")
            for e in daemon.events()
        ),
        PAGE_S,
        "a document of the killed engine to start",
    )
    os.kill(cores[0], signal.SIGKILL)
    started = time.monotonic()
    for path in paths:
        assert done(path)["status"] == "ok"
    events = [e.get("event") for e in daemon.events()]
    assert "engine_dead" in events and "engine_rebuilt" in events
    print(f"LANE engine rebuilt and both documents done: {time.monotonic() - started:.1f} s")


def test_sigterm_drains_and_stops_the_engine(daemon: DaemonProcess) -> None:
    assert daemon.proc is not None
    names = descendants(daemon.proc.pid)
    family = [daemon.proc.pid, *names]
    print(f"LANE peak RSS, daemon and vLLM's processes: {peak_rss_bytes(family) / 2**30:.2f} GiB")
    path = page(daemon.inbox / "last.png", "last")
    wait_until(
        lambda: any(
            e.get("event") == "job_started" and "last.png" in e.get("uri", "")
            for e in daemon.events()
        ),
        PAGE_S,
        "the last document to start",
    )
    daemon.signal(signal.SIGTERM)
    assert daemon.proc.wait(120) == 0, daemon.log_text()[-4000:]
    wait_until(
        lambda: not [pid for pid in family[1:] if alive(pid)],
        30,
        lambda: f"vLLM's processes to end with the daemon: {names}",
    )
    with sqlite3.connect(daemon.state / "ledger.sqlite3") as db:
        assert db.execute("pragma integrity_check").fetchone()[0] == "ok"
        state = dict(db.execute("select key, state from jobs").fetchall()).get(path.as_uri())
    sidecar = sidecars_done(path)
    assert (sidecar is not None and state == "done") or state in ("queued", "recognizing"), (
        state,
        json.dumps(sidecar)[:500],
    )
