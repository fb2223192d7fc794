"""A third engine needs no edit outside its own package: a toy engine, installed only by a
``dist-info`` folder on the daemon's PYTHONPATH, brings its options, its check and its languages
through the ``ocrwatch.engines`` entry-point group, and a real daemon reads a real PNG with it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

from tests.integration.conftest import REPO, DaemonProcess, sidecars_done, wait_until

TOY = '''
from __future__ import annotations
from collections.abc import Iterator
from pydantic import BaseModel, ConfigDict, Field
from ocrwatch.engines.base import Check, EngineSpec, Recognition
from ocrwatch.pages.render import Geometry


class ToyOptions(BaseModel):
    """The toy engine's options."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    greeting: str = Field("hello", description="Written after the marker on every page.")


class ToyEngine:
    name = "toy"
    geometry = Geometry(dpi=150)
    max_concurrency = 1

    def __init__(self, options: ToyOptions) -> None:
        self.options = options

    async def start(self) -> None: ...
    async def recognize(self, page):
        text = f"TOY-MARKER {self.options.greeting}"
        return Recognition(markdown=text, raw=text)
    async def abort(self, request_id: str) -> None: ...
    def release(self) -> None: ...
    async def close(self) -> None: ...
    def describe(self):
        return {"name": "toy", "greeting": self.options.greeting}


def checks(cfg, probe, wanted=None) -> Iterator[Check]:
    yield Check(True, "[engine.toy] greeting", f"says {cfg.engine.toy.greeting!r}")


SPEC = EngineSpec(
    "toy", lambda cfg, images, log: ToyEngine(cfg.toy), options=ToyOptions,
    checks=checks, languages=lambda options: frozenset({"toy"}),
)
'''


def _install_toy(root: Path) -> Path:
    """The toy package and its dist-info, which is all an installed distribution is."""
    site = root / "site"
    (site / "toy_engine").mkdir(parents=True)
    (site / "toy_engine" / "__init__.py").write_text(TOY)
    info = site / "toy_engine-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-engine\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[ocrwatch.engines]\ntoy = toy_engine:SPEC\n")
    return site


def _env(site: Path) -> dict[str, str]:
    return {
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(site), str(REPO), os.environ.get("PYTHONPATH")])
        )
    }


def _page(path: Path) -> None:
    image = Image.new("RGB", (600, 300), "white")
    ImageDraw.Draw(image).text((40, 120), "a page for the toy engine", fill="black")
    image.save(path)


def test_a_third_engine_runs_through_the_daemon_with_its_own_options(
    tmp_path: Path, make_daemon: Callable[..., DaemonProcess]
) -> None:
    site = _install_toy(tmp_path)
    daemon = make_daemon(engine={"kind": "toy", "toy": {"greeting": "grüezi"}})
    daemon.start(env=_env(site))
    document = daemon.inbox / "page.png"
    _page(document)
    data: Any = wait_until(lambda: sidecars_done(document), 60, "the toy's sidecars")
    markdown = document.with_name(document.name + ".md").read_text()
    assert "TOY-MARKER grüezi" in markdown
    assert "TOY-MARKER grüezi" in str(data)
    assert daemon.stop() == 0


def test_check_runs_the_toy_check_and_an_unknown_key_is_a_config_error(tmp_path: Path) -> None:
    site = _install_toy(tmp_path)
    config = tmp_path / "ocrwatch.toml"
    config.write_text(
        f'state_dir = "{tmp_path / "state"}"\n[engine]\nkind = "toy"\n'
        '[engine.toy]\ngreeting = "servus"\n'
        f'[[inbox]]\npath = "{tmp_path / "inbox"}"\n'
    )
    command = [sys.executable, "-m", "ocrwatch", "check", "--config", str(config)]
    env = {**os.environ, **_env(site)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    said = done.stdout + done.stderr
    assert "ok   [engine.toy] greeting says 'servus'" in said, said
    config.write_text(config.read_text().replace("greeting =", "greting ="))
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    said = f"{config}: engine.toy.greting: no such key (did you mean `greeting`?)"
    assert said in done.stderr, done.stderr


def test_ocr_engine_names_the_third_engine_and_reads_with_it(tmp_path: Path) -> None:
    """``ocrwatch ocr --engine toy`` with no daemon running: the CLI's own engine is the one the
    entry point registers, with its table's options, and its one rung's output is final."""
    site = _install_toy(tmp_path)
    config = tmp_path / "ocrwatch.toml"
    config.write_text(
        f'state_dir = "{tmp_path / "state"}"\n[engine.toy]\ngreeting = "moin"\n'
        f'[[inbox]]\npath = "{tmp_path / "inbox"}"\n'
    )
    document = tmp_path / "page.png"
    _page(document)
    command = [sys.executable, "-m", "ocrwatch", "--config", str(config), "ocr", "--engine", "toy"]
    env = {**os.environ, **_env(site)}
    done = subprocess.run(
        [*command, str(document)], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    data: Any = sidecars_done(document)
    assert data["status"] == "ok" and "TOY-MARKER moin" in str(data)
    assert [len(page["tries"]) for page in data["pages"]] == [1]
    with_lang = subprocess.run(
        [*command, "--lang", "eng", str(document)], capture_output=True, text=True, env=env
    )
    assert with_lang.returncode == 2 and "cannot go with --engine toy" in with_lang.stderr
