"""Start-up errors a user causes are configuration errors: ``ocrwatch run`` as a process ends with
exit 2 (which the systemd unit does not restart on), one error line naming the file and the key with
a hint, and no traceback."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from tests.integration.conftest import REPO, DaemonProcess, PluginDaemon

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

pytestmark = pytest.mark.integration

# Root writes anywhere; without these capabilities it meets a folder's mode as any user would.
AS_A_USER = (
    ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"] if os.geteuid() == 0 else []
)


def configure(daemon: DaemonProcess, **changes: Any) -> None:
    settings = tomllib.loads(daemon.config_path.read_text())
    for key, value in changes.items():
        settings[key] = (
            {**settings[key], **value} if isinstance(value, dict) and key in settings else value
        )
    daemon.config_path.write_text(tomli_w.dumps(settings))


def start_refused(
    daemon: DaemonProcess, key: str, prefix: list[str] | None = None
) -> dict[str, Any]:
    """Run the daemon; assert exit 2, no traceback and one error line naming the file and ``key``;
    return it."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [
            *(prefix or []),
            sys.executable,
            "-m",
            "ocrwatch",
            "run",
            "--config",
            str(daemon.config_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=daemon.root,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert "Traceback" not in output, output
    events = [json.loads(line) for line in proc.stderr.splitlines()]  # every line is one JSON event
    errors = [event for event in events if event["level"] in ("error", "critical")]
    assert [error["event"] for error in errors] == ["startup_failed"], output
    [error] = errors
    assert str(daemon.config_path) in error["error"] and key in error["error"], error
    assert error["kind"] == "config_error" and error["hint"], error
    return error


@pytest.fixture
def daemon(tmp_path: Path) -> PluginDaemon:
    return PluginDaemon(tmp_path, "tests.support.fault_engines:EchoEngine")


def test_a_metrics_port_in_use(daemon: PluginDaemon) -> None:
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", daemon.port))
        taken.listen()
        error = start_refused(daemon, "[metrics] listen")
    assert f"127.0.0.1:{daemon.port}" in error["error"] and "in use" in error["error"]
    assert not (daemon.state / "ledger.sqlite3").exists(), (
        "the start went on past the refused address"
    )


def test_an_inbox_that_cannot_be_created(daemon: PluginDaemon) -> None:
    (daemon.root / "a-file").write_text("not a folder")
    configure(daemon, inbox=[{"path": str(daemon.root / "a-file" / "inbox")}])
    error = start_refused(daemon, "inbox[0].path")
    assert "cannot be created" in error["error"]


def test_an_output_dir_that_cannot_be_written(daemon: PluginDaemon) -> None:
    (daemon.root / "a-file").write_text("not a folder")
    configure(daemon, output={"dir": str(daemon.root / "a-file" / "out")})
    start_refused(daemon, "[output] dir")


@pytest.fixture
def read_only_out(daemon: PluginDaemon) -> Iterator[Path]:
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: a folder's mode cannot stop this process")
    out = daemon.root / "out"
    out.mkdir(mode=0o500)
    yield out
    out.chmod(0o700)


def test_an_output_dir_without_write_permission(daemon: PluginDaemon, read_only_out: Path) -> None:
    configure(daemon, output={"dir": str(read_only_out)})
    error = start_refused(daemon, "[output] dir", AS_A_USER)
    assert "permission denied" in error["error"] and str(read_only_out) in error["hint"]
    assert list(read_only_out.iterdir()) == []


@pytest.mark.parametrize(
    "listen", ["taken", "nowhere", "127.0.0.1:99999", "no-such-host.invalid:8787"]
)
def test_a_webhook_address_that_cannot_be_listened_on(daemon: PluginDaemon, listen: str) -> None:
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        if listen == "taken":
            listen = f"127.0.0.1:{taken.getsockname()[1]}"
        s3 = {
            "transport": "webhook",
            "token": "t",
            "listen": listen,
            "endpoint_url": "http://127.0.0.1:1",
            "access_key_id": "k",
            "secret_access_key": "s",
            "region": "us-east-1",
        }
        configure(daemon, s3=[s3])
        error = start_refused(daemon, "s3[0].listen")
    assert listen in error["error"]


def test_a_vllm_model_folder_that_is_missing(daemon: PluginDaemon) -> None:
    """Refused before vLLM is imported or a GPU looked for: the check needs neither."""
    missing = daemon.root / "models" / "DeepSeek-OCR-2"
    configure(daemon, engine={"kind": "vllm", "vllm": {"model": str(missing)}})
    error = start_refused(daemon, "[engine.vllm] model")
    assert str(missing) in error["error"] and "no such folder" in error["error"]
    (missing.parent).mkdir()
    missing.mkdir()
    (missing / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    error = start_refused(daemon, "[engine.vllm] model")
    assert "LlamaForCausalLM" in error["error"] and "DeepseekOCR2ForCausalLM" in error["hint"]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_the_vllm_engine_not_installed(daemon: PluginDaemon) -> None:
    """Refused as the user's to fix (exit 2, which systemd does not restart on), with the install
    and the key that chose vLLM: not an engine that "could not start" with the first module its
    import misses, exit 1, restarted into the same failure."""
    configure(daemon, engine={"kind": "vllm"})
    error = start_refused(daemon, "vLLM engine")
    assert f"chosen by [engine] kind = 'vllm' in {daemon.config_path}" in error["error"]
    assert "vllm is not installed" in error["error"] and "torch" not in error["error"]
    assert "pip install 'ocrwatch[vllm]'" in error["hint"]


def test_language_data_that_is_missing(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path)
    configure(daemon, inbox=[{"path": str(daemon.inbox), "lang": "eng+zzz"}])
    error = start_refused(daemon, "inbox[0].lang")
    assert "no language data for zzz" in error["error"] and "tesseract-ocr-zzz" in error["hint"]
    configure(daemon, inbox=[{"path": str(daemon.inbox)}], engine={"tesseract": {"lang": "zzz"}})
    start_refused(daemon, "[engine.tesseract] lang")


def test_a_busy_port_does_not_hide_missing_language_data(tmp_path: Path) -> None:
    """Every problem ``check`` would list, in the one refusal, not only the first met."""
    daemon = DaemonProcess(tmp_path)
    configure(daemon, inbox=[{"path": str(daemon.inbox), "lang": "eng+zzz"}])
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", daemon.port))
        taken.listen()
        error = start_refused(daemon, "[metrics] listen")
    assert "in use" in error["error"] and "inbox[0].lang" in error["error"], error
    assert "no language data for zzz" in error["error"] and "tesseract-ocr-zzz" in error["hint"]


def test_an_inbox_inside_another_stops_the_start_naming_both_keys(daemon: PluginDaemon) -> None:
    """Refused at load, before any watcher starts: no document below the inner one is done twice."""
    inner = daemon.inbox / "sub"
    inner.mkdir()
    (inner / "waiting.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    configure(daemon, inbox=[{"path": str(daemon.inbox)}, {"path": str(inner)}])
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "ocrwatch", "run", "--config", str(daemon.config_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=daemon.root,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in output, output
    assert str(daemon.config_path) in output and "processed twice" in output, output
    assert f"inbox[1].path ({inner})" in output, output
    assert f"inbox[0].path ({daemon.inbox})" in output, output
    assert sorted(path.name for path in inner.iterdir()) == ["waiting.png"]
    assert not daemon.state.exists()  # nothing started
