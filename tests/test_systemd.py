"""The shipped unit (Type=notify with a watchdog, hardened to an exposure score of at most 2.5), and the
daemon's side of the protocol: notifications and the watchdog's interval."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from ocrwatch.cli import EXIT_USAGE
from ocrwatch.daemon import USAGE_EXIT_CODE
from ocrwatch.systemd import sd_notify, watchdog_interval

UNIT = Path(__file__).resolve().parent.parent / "systemd" / "ocrwatch.service"


def test_unit_declares_notify_and_watchdog() -> None:
    text = UNIT.read_text()
    for line in ("Type=notify", "User=ocrwatch", "StateDirectory=ocrwatch", "ProtectSystem=strict", "PrivateTmp=yes",
                 "NoNewPrivileges=yes", "ProtectHome=yes"):
        assert line in text
    assert re.search(r"^WatchdogSec=\d+", text, re.M)
    assert re.search(r"^ReadWritePaths=", text, re.M)


def test_the_unit_restarts_on_failure_but_not_into_an_error_only_the_user_can_fix() -> None:
    """Exit 2 (configuration, state_dir, ledger) would fail the same way every RestartSec; exit 1 (a crash, a
    fault that may pass) and a death by signal (the watchdog's SIGABRT, the OOM killer) are restarted."""
    settings = dict(re.findall(r"^(Restart\w*)=(.*)$", UNIT.read_text(), re.M))
    assert settings["Restart"] == "on-failure"
    assert settings["RestartPreventExitStatus"].split() == [str(USAGE_EXIT_CODE)]
    assert USAGE_EXIT_CODE == EXIT_USAGE == 2


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_exposure_score_at_most_2_5() -> None:
    proc = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--no-pager", str(UNIT)], capture_output=True, text=True
    )
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", proc.stdout + proc.stderr)
    assert match, proc.stdout + proc.stderr
    assert float(match.group(1)) <= 2.5


def notify_socket(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(2)
    return sock


def test_sd_notify_sends_one_datagram_and_is_a_no_op_outside_systemd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert sd_notify("READY=1") is False
    with notify_socket(tmp_path / "notify.sock") as sock:
        monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify.sock"))
        assert sd_notify("READY=1") is True
        assert sock.recv(4096) == b"READY=1"
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone.sock"))
    assert sd_notify("WATCHDOG=1") is False  # logged, never raised: systemd going away must not stop the daemon


def test_the_watchdog_is_fed_at_half_its_timeout_or_the_health_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    assert watchdog_interval(5.0) == 5.0
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    assert watchdog_interval(5.0) == 0.5
    assert watchdog_interval(0.2) == 0.2
