"""What every CPU benchmark shares: the corpus, a daemon run as a real process, dropping files,
printing figures.

The daemon is the installed ``ocrwatch run`` in a subprocess (as in production and in the
integration tests), so a benchmark measures everything a user would see: watcher, ledger, scheduler,
engine and sinks together.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
# ``tests.support.docs`` makes the fallback documents when the corpus is absent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def metric_samples(text: str) -> dict[str, float]:
    """Every sample of a /metrics text as ``name{label="v",...}`` (labels sorted) → value."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


BIG_DOCUMENTS = ("GeoTopo-komprimiert.pdf",)
"""Left out of page selections: one 117-page document would be the whole sample."""


def corpus_dir() -> Path | None:
    candidate = Path(os.environ.get("OCRWATCH_CORPUS", REPO.parent / "shared" / "corpus"))
    return candidate if (candidate / "manifest.json").is_file() else None


@dataclass(frozen=True)
class Doc:
    path: Path
    pages: int


def corpus_documents(max_pages: int, scratch: Path) -> tuple[list[Doc], str]:
    """Whole documents (every page of each) up to ``max_pages`` pages, in manifest order, and where
    they came from.

    Only documents the manifest expects to succeed; without the corpus, generated text pages stand
    in.
    """
    root = corpus_dir()
    if root is None:
        return generated_documents(max_pages, scratch), "generated (corpus absent)"
    manifest = json.loads((root / "manifest.json").read_text())
    chosen: list[Doc] = []
    total = 0
    for entry in manifest:
        pages = entry.get("pages") or 0
        if entry["expected"] != "ok" or entry["file"] in BIG_DOCUMENTS or total + pages > max_pages:
            continue
        chosen.append(Doc(root / entry["file"], pages))
        total += pages
    return chosen, str(root)


def generated_documents(max_pages: int, scratch: Path) -> list[Doc]:
    from tests import docs

    scratch.mkdir(parents=True, exist_ok=True)
    made = []
    for number in range(0, max_pages, 2):
        pages = min(2, max_pages - number)
        lines = [
            [f"Document {number} page {page}", "Quarterly report", "number forty two"]
            for page in range(pages)
        ]
        made.append(Doc(docs.write_pdf(scratch / f"generated-{number:04d}.pdf", lines), pages))
    return made


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    tesseract = subprocess.run(
        ["tesseract", "--version"], capture_output=True, text=True, check=False
    ).stdout
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "tesseract": tesseract.split("\n", 1)[0],
        "loadavg_1_5_15": [
            round(load, 2) for load in os.getloadavg()
        ],  # other work on the machine, at the end
    }


def emit(figures: dict[str, Any]) -> None:
    """The one line of JSON every benchmark ends with."""
    print(json.dumps(figures, sort_keys=True), flush=True)


def median(values: Iterable[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def drop(source: Path, inbox: Path, name: str | None = None) -> Path:
    """Copy under a hidden name, then rename into place: the daemon sees a whole file moved in, as
    from a scanner."""
    target = inbox / (name or source.name)
    hidden = inbox / f".{target.name}.copying"
    shutil.copyfile(source, hidden)
    os.replace(hidden, target)
    return target


def sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def remove_with_sidecars(path: Path) -> None:
    for name in (path.name, path.name + ".md", path.name + ".json", path.name + ".error.json"):
        (path.parent / name).unlink(missing_ok=True)


def wait_for(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.02
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")


class Daemon:
    """One ``ocrwatch run`` on a private folder; ``overrides`` are merged into the config's
    tables."""

    def __init__(self, root: Path, **overrides: Any) -> None:
        self.root = root
        self.inbox = root / "inbox"
        self.inbox.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.log_path = root / "daemon.log"
        config: dict[str, Any] = {
            "state_dir": str(root / "state"),
            "engine": {"kind": "tesseract"},
            "log": {"format": "json", "level": "info"},
            "metrics": {"listen": f"127.0.0.1:{self.port}"},
            "daemon": {"shutdown_timeout": 10.0},
            "inbox": [{"path": str(self.inbox), "settle_seconds": 0.3}],
        }
        for key, value in overrides.items():
            config[key] = (
                {**config[key], **value} if isinstance(value, dict) and key in config else value
            )
        self.config_path = root / "ocrwatch.toml"
        # here, not at the top: bench/gpu/e2e.py imports this module on the device, which lacks it
        import tomli_w

        self.config_path.write_text(tomli_w.dumps(config))
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Daemon:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Daemon:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ocrwatch", "run", "--config", str(self.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        wait_for(self._ready, 120, f"daemon ready (log {self.log_path})", interval=0.1)
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"daemon exited with {self.proc.returncode}; log {self.log_path}")
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.port}/readyz", timeout=1
            ) as response:
                return response.status == 200
        except OSError:
            return False

    def stop(self, timeout: float = 60) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics as ``name{label="v",...}`` → value."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as response:
            return metric_samples(response.read().decode())

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def _status(self, field: str) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
        raise RuntimeError(f"no {field} in /proc/{self.pid}/status")

    def rss_bytes(self) -> int:
        return self._status("VmRSS") * 1024

    def threads(self) -> int:
        return self._status("Threads")

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))
