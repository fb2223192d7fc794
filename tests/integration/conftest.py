"""Run ``ocrwatch run`` as a real subprocess on temporary folders, with the real Tesseract
engine."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import tomli_w

from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]


def children_named(pid: int, name: str) -> list[int]:
    """Live processes named ``name`` whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm, rest = (
            stat[stat.index("(") + 1 : stat.rindex(")")],
            stat[stat.rindex(")") + 2 :].split(),
        )
        if comm == name and int(rest[1]) == pid:
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: it exists and is no zombie (an orphan's parent changes, so ask for the
    pid)."""
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[0] != "Z"


def wait_until(
    predicate: Callable[[], Any],
    timeout: float,
    what: str | Callable[[], str],
    interval: float = 0.1,
) -> Any:
    """Poll ``predicate`` until it is truthy; ``what`` may be a callable, so a message that quotes
    the daemon's log quotes it as it is at the timeout, not as it was when the wait began."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(
        f"timed out after {timeout}s waiting for {what() if callable(what) else what}"
    )


class DaemonProcess:
    """One ``ocrwatch run`` subprocess with its folders, config and log."""

    def __init__(
        self, root: Path, inboxes: list[dict[str, Any]] | None = None, **overrides: Any
    ) -> None:
        self.root = root
        self.inbox = root / "inbox"
        self.inbox.mkdir(parents=True, exist_ok=True)
        self.state = root / "state"
        self.port = free_port()
        self.log_path = root / f"daemon-{int(time.time() * 1000)}.log"
        config: dict[str, Any] = {
            "state_dir": str(self.state),
            "engine": {"kind": "tesseract", "tesseract": {"dpi": 150, "workers": 2}},
            # Orientation costs each page a second of CPU on these 2-core machines; the tests of
            # turned pages (test_orientation.py) and the README's command run with it on.
            "render": {"rotate_pages": False},
            "log": {"format": "json", "level": "debug"},
            "metrics": {"listen": f"127.0.0.1:{self.port}"},
            "daemon": {
                "reconcile_seconds": 60.0,
                "shutdown_timeout": 20.0,
                "health_interval_seconds": 0.5,
            },
            "retry": {"attempts": 3, "backoff_initial_seconds": 0.2, "backoff_max_seconds": 1.0},
            "inbox": inboxes or [{"path": str(self.inbox), "settle_seconds": 0.3}],
        }
        for key, value in overrides.items():
            if isinstance(value, dict) and isinstance(config.get(key), dict):
                config[key] = {**config[key], **value}
            else:
                config[key] = value
        self.config_path = root / "ocrwatch.toml"
        self.config_path.write_text(tomli_w.dumps(config))
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_handle: Any = None

    def start(self, env: dict[str, str] | None = None, wait_ready: bool = True) -> DaemonProcess:
        self.log_path = self.root / f"daemon-{time.time_ns()}.log"
        # held for the daemon's life: its stdout and stderr
        self._log_handle = open(self.log_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ocrwatch", "run", "--config", str(self.config_path)],
            stdout=self._log_handle,
            stderr=subprocess.STDOUT,
            cwd=self.root,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        if wait_ready:
            wait_until(self.ready, 60, f"daemon ready (log {self.log_path}):\n{self.log_text()}")
        return self

    def ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log_text()}")
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.port}/readyz", timeout=1
            ) as response:
                return response.status == 200
        except OSError:
            return False

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as response:
            return response.read().decode()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 30) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            if self._log_handle is not None:
                self._log_handle.close()

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)
        if self._log_handle is not None:
            self._log_handle.close()


class PluginDaemon(DaemonProcess):
    """``DaemonProcess`` whose engine is a test engine (``tests.support.fault_engines``,
    ``tests.support.hardening_engines``), loaded through ``[engine] kind = "plugin"``: the daemon
    is the
    real one; only the engine differs."""

    def __init__(
        self,
        root: Path,
        spec: str,
        engine_args: dict[str, Any] | None = None,
        inboxes: list[dict[str, Any]] | None = None,
        **overrides: Any,
    ) -> None:
        plugin = {"kind": "plugin", "plugin": spec, "plugin_args": engine_args or {}}
        overrides["engine"] = {**plugin, **overrides.get("engine", {})}
        super().__init__(root, inboxes, **overrides)

    def start(self, env: dict[str, str] | None = None, wait_ready: bool = True) -> DaemonProcess:
        pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        return super().start({"PYTHONPATH": pythonpath, **(env or {})}, wait_ready)

    def all_events(self) -> list[dict[str, Any]]:
        """Events of every run of this daemon (each start writes a new log), oldest run first."""
        out = []
        for log in sorted(self.root.glob("daemon-*.log")):
            for line in log.read_text(errors="replace").splitlines():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out


@pytest.fixture
def spawned() -> Iterator[list[DaemonProcess]]:
    """Daemons a test made; any still running at the end is killed."""
    made: list[DaemonProcess] = []
    yield made
    for daemon in made:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.kill()


@pytest.fixture
def make_daemon(tmp_path: Path, spawned: list[DaemonProcess]) -> Callable[..., DaemonProcess]:
    def factory(**kwargs: Any) -> DaemonProcess:
        spawned.append(DaemonProcess(tmp_path, **kwargs))
        return spawned[-1]

    return factory


@pytest.fixture
def plugin_daemon(tmp_path: Path, spawned: list[DaemonProcess]) -> Callable[..., PluginDaemon]:
    def factory(
        spec: str = "tests.support.fault_engines:EchoEngine",
        engine_args: dict[str, Any] | None = None,
        root: Path | None = None,
        **kwargs: Any,
    ) -> PluginDaemon:
        daemon = PluginDaemon(root or tmp_path, spec, engine_args, **kwargs)
        spawned.append(daemon)
        return daemon

    return factory


@functools.cache
def published_schema(name: str) -> jsonschema.Draft202012Validator:
    """A schema as docs/schema publishes it: every sidecar the helpers below read must pass it."""
    schema = json.loads((REPO / "docs" / "schema" / name).read_text())
    return jsonschema.Draft202012Validator(schema)


def sidecars_done(path: Path) -> dict[str, Any] | None:
    """The parsed JSON sidecar once it exists (it is written last, so the Markdown is complete
    too)."""
    sidecar = path.with_name(path.name + ".json")
    if not sidecar.exists():
        return None
    data = json.loads(sidecar.read_text())
    published_schema("sidecar.schema.json").validate(data)
    return data


def error_sidecar(path: Path) -> dict[str, Any] | None:
    sidecar = path.with_name(path.name + ".error.json")
    if not sidecar.exists():
        return None
    data = json.loads(sidecar.read_text())
    published_schema("error.schema.json").validate(data)
    return data


@pytest.fixture
def tmpfs() -> Iterator[Callable[[Path, str], Path]]:
    """Mount a tmpfs of the given size at the given folder; skips where mounting is not
    permitted."""
    mounted: list[Path] = []

    def mount(point: Path, size: str) -> Path:
        point.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(point)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            pytest.skip(
                f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {done.stderr.strip()}"
            )
        mounted.append(point)
        return point

    yield mount
    for point in reversed(mounted):
        if subprocess.run(["umount", str(point)], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(point)], capture_output=True, check=False)
