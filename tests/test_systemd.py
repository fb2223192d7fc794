"""The shipped unit (Type=notify with a watchdog, hardened to an exposure score of at most 2.5), and
the daemon's side of the protocol: notifications and the watchdog's interval."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tomli_w

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

from ocrwatch.app.cli import EXIT_USAGE
from ocrwatch.app.daemon import USAGE_EXIT_CODE
from ocrwatch.infra.systemd import sd_notify, watchdog_interval
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parent.parent
UNIT = REPO / "systemd" / "ocrwatch.service"
# Root writes anywhere; without these capabilities it meets a folder's mode as any user would.
AS_A_USER = (
    ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"] if os.geteuid() == 0 else []
)


def test_unit_declares_notify_and_watchdog() -> None:
    text = UNIT.read_text()
    for line in (
        "Type=notify",
        "User=ocrwatch",
        "StateDirectory=ocrwatch",
        "ProtectSystem=strict",
        "PrivateTmp=yes",
        "NoNewPrivileges=yes",
        "ProtectHome=yes",
    ):
        assert line in text
    assert re.search(r"^WatchdogSec=\d+", text, re.M)
    assert re.search(r"^ReadWritePaths=", text, re.M)


def test_the_unit_restarts_on_failure_but_not_into_an_error_only_the_user_can_fix() -> None:
    """Exit 2 (configuration, state_dir, ledger) would fail the same way every RestartSec; exit 1 (a
    crash, a fault that may pass) and a death by signal (the watchdog's SIGABRT, the OOM killer) are
    restarted."""
    settings = dict(re.findall(r"^(Restart\w*)=(.*)$", UNIT.read_text(), re.M))
    assert settings["Restart"] == "on-failure"
    assert settings["RestartPreventExitStatus"].split() == [str(USAGE_EXIT_CODE)]
    assert USAGE_EXIT_CODE == EXIT_USAGE == 2


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_exposure_score_at_most_2_5() -> None:
    proc = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--no-pager", str(UNIT)],
        capture_output=True,
        text=True,
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
    # logged, never raised: systemd going away must not stop the daemon
    assert sd_notify("WATCHDOG=1") is False


def test_the_watchdog_is_fed_at_half_its_timeout_or_the_health_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    assert watchdog_interval(5.0) == 5.0
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    assert watchdog_interval(5.0) == 0.5
    assert watchdog_interval(0.2) == 0.2


# --- the configuration shipped with the unit (systemd/config.toml) --------------------------------

SHIPPED = UNIT.with_name("config.toml")
WRITTEN_PATHS = {
    ("state_dir",),
    ("output", "dir"),
    ("output", "archive_dir"),
    ("inbox", "path"),
    ("inbox", "quarantine_dir"),
    ("engine", "vllm", "compile_cache_dir"),
}
"""Every key naming a folder the daemon writes to."""


def unit_settings() -> dict[str, list[str]]:
    """The [Service] section's settings, each key's values in order."""
    settings: dict[str, list[str]] = {}
    section = ""
    for line in UNIT.read_text().splitlines():
        if line.startswith("["):
            section = line.strip()
        elif section == "[Service]" and "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            settings.setdefault(key, []).extend(value.split())
    return settings


def writable_by_the_unit() -> list[Path]:
    """What the unit lets the service write under ProtectSystem=strict."""
    settings = unit_settings()
    places = [Path("/var/lib") / name for name in settings["StateDirectory"]]
    places += [Path("/var/cache") / name for name in settings["CacheDirectory"]]
    return places + [Path(path.lstrip("-")) for path in settings["ReadWritePaths"]]


def written_paths(data: dict[str, Any]) -> dict[str, str]:
    """Each folder the configuration names for writing, by its key."""
    found: dict[str, str] = {}

    def walk(value: Any, key: tuple[str, ...], name: str) -> None:
        if isinstance(value, dict):
            for child, inner in value.items():
                walk(inner, (*key, child), f"{name}.{child}" if name else child)
        elif isinstance(value, list):
            for index, inner in enumerate(value):
                walk(inner, key, f"{name}[{index}]")
        elif key in WRITTEN_PATHS:
            found[name] = value

    walk(data, (), "")
    return found


def test_the_shipped_configuration_writes_only_where_the_unit_lets_it() -> None:
    """Absolute paths only (a relative one would resolve beside the file, in /etc, read-only under
    ProtectSystem=strict), each inside the unit's StateDirectory=, CacheDirectory= or
    ReadWritePaths=; the unit reads this very file."""
    settings = unit_settings()
    assert settings["ExecStart"][-2:] == ["--config", "/etc/ocrwatch/config.toml"]
    assert settings["WorkingDirectory"] == ["/var/lib/ocrwatch"] == [str(writable_by_the_unit()[0])]
    paths = written_paths(tomllib.loads(SHIPPED.read_text()))
    assert {"state_dir", "inbox[0].path"} <= paths.keys(), paths
    places = writable_by_the_unit()
    for key, value in paths.items():
        assert Path(value).is_absolute(), f"{key} = {value!r} is relative"
        assert any(Path(value).is_relative_to(place) for place in places), (
            f"{key} = {value!r}: not in {places}"
        )
    # the StateDirectory= systemd makes 0700 for the user
    assert Path(paths["state_dir"]) == places[0]


def install(root: Path, config: str) -> Path:
    """The unit's folders under ``root``, as systemd and the install steps leave them: the state and
    the cache made 0700, the inboxes made (a ReadWritePaths= that does not exist fails the unit's
    start), and ``config`` (a TOML text) as etc/ocrwatch/config.toml, its folder read-only."""
    for place in writable_by_the_unit():
        (root / place.relative_to("/")).mkdir(mode=0o700, parents=True)
    etc = root / "etc" / "ocrwatch"
    etc.mkdir(parents=True)
    path = etc / "config.toml"
    path.write_text(config)
    etc.chmod(0o555)
    return path


def under(root: Path, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with every absolute path moved under ``root``, and a free metrics port."""

    def moved(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: moved(inner) for key, inner in value.items()}
        if isinstance(value, list):
            return [moved(inner) for inner in value]
        return f"{root}{value}" if isinstance(value, str) and value.startswith("/") else value

    data = moved(data)
    data.setdefault("metrics", {})["listen"] = f"127.0.0.1:{free_port()}"
    data["engine"] = {**data.get("engine", {}), "kind": "tesseract", "tesseract": {"workers": 1}}
    return data


def check_as_the_unit(root: Path, config: Path) -> tuple[int, str]:
    """``ocrwatch check`` in the unit's WorkingDirectory=, without root's power to write
    anywhere."""
    proc = subprocess.run(
        [*AS_A_USER, sys.executable, "-m", "ocrwatch", "check", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root / "var" / "lib" / "ocrwatch",
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_the_shipped_configuration_passes_check_under_the_units_folders(tmp_path: Path) -> None:
    root = tmp_path / "root"
    shipped = under(root, tomllib.loads(SHIPPED.read_text()))
    code, said = check_as_the_unit(root, install(root, tomli_w.dumps(shipped)))
    assert code == 0, said
    assert f"ok   state_dir {root}/var/lib/ocrwatch is writable" in said, said
    assert f"ok   inbox[0].path {root}/srv/ocr/inbox is writable" in said, said


def test_the_example_configuration_copied_to_etc_fails_check_there(tmp_path: Path) -> None:
    """What the shipped file is for: config.example.toml's relative state_dir, copied into /etc as
    it stands, points into the read-only folder beside it."""
    root = tmp_path / "root"
    example = tomllib.loads((REPO / "config.example.toml").read_text())
    code, said = check_as_the_unit(root, install(root, tomli_w.dumps(under(root, example))))
    assert code == 1, said
    assert (
        f"FAIL state_dir {root}/etc/ocrwatch/.ocrwatch: cannot be created in {root}/etc/ocrwatch"
        in said
    ), said


def test_the_units_documentation_is_nothing_an_installation_lacks() -> None:
    """Nothing installs files under /usr/share/doc (pip does not): a ``file:`` link there is dead in
    ``systemctl status``; only a web address or a manual page may be named."""
    named = re.findall(r"^Documentation=(.*)$", UNIT.read_text(), re.M)
    assert all(uri.startswith(("https://", "man:")) for line in named for uri in line.split())
