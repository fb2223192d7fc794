"""Budgets before work, through the real daemon process (issue 34, item 5): files built to be
expensive (sparse terabytes, sparse images that fill a spool) cost a ``stat`` or their data, never
their holes, and never hold up another document, ``ocrwatch status``, the health endpoints or a
SIGTERM."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import DaemonProcess, error_sidecar, sidecars_done, wait_until
from tests.support import docs
from tests.support.sparse import TIB, sparse_file

pytestmark = pytest.mark.integration

ECHO = "tests.support.fault_engines:EchoEngine"
MAX_BYTES = 256 << 20
"""[limits] max_bytes: the sparse 120 MB images are within it, the sparse 2 TiB PDFs far over it."""
IMAGE_BYTES = 120_000_000
STALL_SECONDS = 5.0
"""[daemon] admission_stall_seconds: /readyz says not ready while the allowed 2 TiB file is hashed
alone this long (the images' hashes take a fraction of a second each)."""
SPOOL = "32m"
"""``state_dir/tmp``, where each document's private copy goes: less than one image's length."""
IEND = b"\0\0\0\0IEND\xaeB`\x82"


def sparse_png(path: Path, text: str) -> Path:
    """A valid PNG followed by a hole and a second IEND: 120 MB long, a few kB on disk. Read as
    the PNG it begins with; whole to the readiness probe, which looks for IEND at the end."""
    image = docs.write_png(path.with_name(".image.png"), docs.text_image([text], size=(600, 200)))
    data = image.read_bytes()
    image.unlink()
    return sparse_file(path, IMAGE_BYTES, data, IEND)


def read_so_far(daemon: DaemonProcess) -> int:
    """Bytes the daemon has read through read system calls (``rchar``): holes count too."""
    assert daemon.proc is not None
    for line in (Path("/proc") / str(daemon.proc.pid) / "io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/PID/io")


def on_disk(folder: Path) -> int:
    return sum(
        os.lstat(Path(where) / name).st_blocks * 512
        for where, _, names in os.walk(folder)
        for name in names
    )


def status(daemon: DaemonProcess) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "ocrwatch", "status", "--config", str(daemon.config_path)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=daemon.root)


def get(daemon: DaemonProcess, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{daemon.port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


def started(daemon: DaemonProcess, paths: list[Path]) -> list[dict[str, Any]]:
    uris = {path.absolute().as_uri() for path in paths}
    return [e for e in daemon.events() if e.get("event") == "job_started" and e.get("uri") in uris]


def test_sparse_files_cost_their_data_and_hold_up_nothing(
    plugin_daemon, tmpfs, tmp_path: Path
) -> None:
    """Sparse 2 TiB PDFs over [limits] max_bytes fail ``file_too_large`` from their size, unread,
    and stay failed across a restart; sparse 120 MB images within it are done through a spool
    smaller than one of them; a good image beside them is done; while a 2 TiB file an inbox allows
    is hashed alone, ``/readyz`` says admission is stuck, and ``status``, ``/healthz`` and SIGTERM
    still answer."""
    vault = tmp_path / "vault"
    vault.mkdir()
    daemon = plugin_daemon(
        ECHO,
        inboxes=[
            {"path": str(tmp_path / "inbox"), "settle_seconds": 0.2},
            {"path": str(vault), "settle_seconds": 0.2, "max_bytes": 4 * TIB},
        ],
        limits={"max_bytes": MAX_BYTES},
        daemon={"admission_stall_seconds": STALL_SECONDS},
    )
    tmpfs(daemon.state / "tmp", SPOOL)
    inbox = daemon.inbox
    pdfs = [sparse_file(inbox / f"huge-{n}.pdf", 2 * TIB) for n in range(4)]
    images = [sparse_png(inbox / f"sparse-{n}.png", f"SPARSE {n}") for n in range(3)]
    allowed = sparse_file(vault / "allowed.pdf", 2 * TIB)
    daemon.start()
    good = docs.write_png(inbox / "good.png", docs.text_image(["GOOD"], size=(600, 200)))

    for document in (good, *images):
        done = wait_until(
            partial(sidecars_done, document),
            60,
            lambda document=document: (
                f"the sidecars of {document.name}:\n{daemon.log_text()[-3000:]}"
            ),
        )
        assert done["status"] == "ok", done
    for pdf in pdfs:
        error = wait_until(partial(error_sidecar, pdf), 30, f"the error sidecar of {pdf.name}")
        assert error["error"]["kind"] == "file_too_large", error
    assert "disk_full" not in daemon.log_text()
    assert on_disk(daemon.state) < 16 << 20, f"{on_disk(daemon.state)} bytes in state_dir"

    baseline = read_so_far(daemon)  # the allowed 2 TiB is being hashed: the holes are read
    wait_until(lambda: read_so_far(daemon) > baseline + (1 << 30), 60, "the allowed file hashed")
    _, why = wait_until(
        lambda: (answer := get(daemon, "/readyz"))[0] == 503 and answer, 60, "/readyz to say 503"
    )
    assert "no file fingerprinted" in why and "while 1 wait" in why, why
    assert get(daemon, "/healthz")[0] == 200
    assert status(daemon).returncode == 0
    assert daemon.stop(timeout=30) == 0
    assert error_sidecar(allowed) is None and sidecars_done(allowed) is None

    daemon.start()  # the PDFs failed for their size, unchanged: not run again
    wait_until(
        lambda: [
            e
            for e in daemon.events()
            if e.get("event") == "local_unchanged" and e.get("inbox") == str(inbox)
        ],
        60,
        lambda: f"the restart's scan of the inbox:\n{daemon.log_text()[-3000:]}",
    )
    assert started(daemon, pdfs) == []
    assert daemon.stop(timeout=30) == 0
