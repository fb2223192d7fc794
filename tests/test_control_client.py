"""``ocrwatch.control`` without a daemon: the lock probe, the request's shape, and what ``status``
and ``retry`` say from the ledger alone (real files, real locks held by real processes, the CLI as a
process)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ocrwatch.control.client import daemon_holds
from ocrwatch.control.protocol import OcrRequest
from ocrwatch.sources.base import Job, LocalFile, S3Object
from ocrwatch.store.ledger import Fingerprint, Ledger


def test_the_lock_says_whether_a_daemon_holds_the_state(tmp_path: Path) -> None:
    assert not daemon_holds(tmp_path)  # no lock file: no daemon ever ran here
    lock = tmp_path / "daemon.lock"
    lock.touch()
    assert not daemon_holds(tmp_path)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import fcntl, sys
            handle = open({str(lock)!r}, "a")
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            print("held", flush=True)
            sys.stdin.read()
        """),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert daemon_holds(tmp_path)
        assert daemon_holds(tmp_path)  # the probe itself leaves nothing held
    finally:
        holder.communicate("", timeout=10)
    assert not daemon_holds(tmp_path)  # the kernel released it with the process


def test_an_ocr_request_round_trips_and_a_malformed_one_is_refused(tmp_path: Path) -> None:
    order = OcrRequest(
        [(tmp_path / "a" / "x.pdf", tmp_path)], tmp_path / "out", True, "tesseract", "deu", "layer"
    )
    assert OcrRequest.from_json(json.loads(json.dumps(order.as_json()))) == order
    for bad in (
        {"files": "x.pdf"},
        {"files": [["x.pdf"]]},
        {"files": [], "out": 3},
        {"files": [], "lang": ["deu"]},
        {"files": [], "text": "pdf"},
    ):
        with pytest.raises(ValueError):
            OcrRequest.from_json(bad)


def test_status_and_retry_without_a_daemon_use_the_ledger(tmp_path: Path) -> None:
    inboxes = [tmp_path / "in1", tmp_path / "in2"]
    config = tmp_path / "ocrwatch.toml"
    config.write_text(
        f'state_dir = "{tmp_path / "state"}"\n'
        + "".join(f'[[inbox]]\npath = "{p}"\n' for p in inboxes)
    )
    with Ledger(tmp_path / "state" / "ledger.sqlite3") as ledger:
        for inbox, name in (
            (inboxes[0], "a.pdf"),
            (inboxes[0], "sub/b.pdf"),
            (inboxes[1], "c.pdf"),
        ):
            ledger.admit(
                Job(origin=LocalFile(inbox / name, inbox), source="local"),
                Fingerprint(1, 1, "0" * 64),
            )
        ledger.admit(
            Job(origin=S3Object("bucket", "k/d.pdf"), source="s3:0"),
            Fingerprint(1, None, None, "e"),
        )
        ledger.mark_failed(
            (inboxes[1] / "c.pdf").as_uri(), {"kind": "output_conflict", "message": "x"}
        )

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ocrwatch", *args, "--config", str(config)],
            capture_output=True,
            text=True,
        )

    status = cli("status")
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith("daemon: not running\n")
    assert (
        f"queue: {inboxes[0]}: 2 waiting" in status.stdout
        and "queue: s3://bucket: 1 waiting" in status.stdout
    )
    assert re.search(r"^failed\s+1$", status.stdout, re.M) and "running: " not in status.stdout
    data = json.loads(cli("status", "--json").stdout)
    assert data["daemon"] is None and data["queue"][str(inboxes[0])] == {"running": 0, "waiting": 2}
    retry = cli("retry", str(inboxes[1]))
    assert retry.returncode == 0
    assert (
        "1 job(s) queued again; no daemon is running: the next `ocrwatch run` starts them"
        in retry.stdout
    )
    assert f"queue: {inboxes[1]}: 1 waiting" in cli("status").stdout


def test_status_loads_no_pipeline() -> None:
    """``ocrwatch status`` and ``retry`` stay light: the client's modules never import the
    pipeline."""
    code = (
        "import sys, ocrwatch.control, ocrwatch.control.client, ocrwatch.control.status; "
        "print(sorted(m for m in sys.modules if m in ('ocrwatch.jobs.pipeline', "
        "'ocrwatch.control.ocr')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
