"""The shipped unit: Type=notify with a watchdog, and hardened to an exposure score of at most 2.5."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parent.parent / "systemd" / "ocrwatch.service"


def test_unit_declares_notify_and_watchdog() -> None:
    text = UNIT.read_text()
    for line in ("Type=notify", "User=ocrwatch", "StateDirectory=ocrwatch", "ProtectSystem=strict", "PrivateTmp=yes",
                 "NoNewPrivileges=yes", "ProtectHome=yes"):
        assert line in text
    assert re.search(r"^WatchdogSec=\d+", text, re.M)
    assert re.search(r"^ReadWritePaths=", text, re.M)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_exposure_score_at_most_2_5() -> None:
    proc = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--no-pager", str(UNIT)], capture_output=True, text=True
    )
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", proc.stdout + proc.stderr)
    assert match, proc.stdout + proc.stderr
    assert float(match.group(1)) <= 2.5
