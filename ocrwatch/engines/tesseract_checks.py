"""What the Tesseract engine needs, checked for ``ocrwatch check`` and the start: its binary, and
the language data of every language the configuration names (for ``auto``: the fallback's and
OSD's, and orientation detection on, which finds each page's script)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

from ocrwatch.config import Config
from ocrwatch.engines.base import Check, Wanted, command_output
from ocrwatch.engines.tesseract_options import TesseractConfig
from ocrwatch.pages import osd


def languages(options: TesseractConfig) -> frozenset[str]:
    """The language data installed for ``options.binary`` (``--list-langs``); none where it
    cannot run."""
    path = shutil.which(options.binary)
    listed = command_output([path, "--list-langs"]) if path else None
    return frozenset(line.strip() for line in (listed or "").splitlines()[1:] if line.strip())


def checks(cfg: Config, probe: bool, wanted: Wanted | None = None) -> Iterator[Check]:
    """The binary, and language data for each (key, lang) of ``wanted``; by default
    ``[engine.tesseract] lang`` and every inbox's ``lang``."""
    options = cfg.engine.tesseract
    path = shutil.which(options.binary)
    if path is None:
        yield Check(
            False,
            f"[engine.tesseract] binary {options.binary}",
            "not found",
            "install tesseract-ocr (apt-get install tesseract-ocr), or set the binary's path",
        )
        return
    if command_output([path, "--list-langs"]) is None:
        yield Check(
            False,
            f"[engine.tesseract] binary {path}",
            "`--list-langs` failed",
            "reinstall tesseract-ocr, or set [engine.tesseract] binary to a working one",
        )
        return
    version = (command_output([path, "--version"]) or "").split()
    found = version[1] if len(version) > 1 else "(version unknown)"
    yield Check(True, "tesseract", f"{found} at {path}")
    installed = languages(options)
    if wanted is None:
        wanted = [("[engine.tesseract] lang", options.lang)]
        wanted += [
            (f"inbox[{index}].lang", inbox.lang)
            for index, inbox in enumerate(cfg.inbox)
            if inbox.lang
        ]
    for key, lang in wanted:
        yield (
            _auto(key, installed, cfg.render.rotate_pages)
            if lang == osd.AUTO
            else _installed(key, lang, installed)
        )


def _auto(key: str, installed: frozenset[str], rotate: bool) -> Check:
    """``auto``: the fallback's data installed, and OSD's where orientation detection runs to
    find each page's script; the languages it can pick are those installed (only the fallback
    with rotation off)."""
    if not rotate:
        if osd.FALLBACK not in installed:
            return _installed(key, osd.FALLBACK, installed)
        return Check(
            True,
            f"{key} {osd.AUTO}",
            f"reads every page in {osd.FALLBACK}: orientation detection, which finds each"
            " page's script, is off ([render] rotate_pages)",
        )
    missing = {osd.FALLBACK, "osd"} - installed
    if missing:
        return _installed(key, "+".join(sorted(missing)), installed)
    picked = sorted(installed - {"osd"})
    return Check(
        True, f"{key} {osd.AUTO}", f"picks by each page's script among {', '.join(picked)}"
    )


def _installed(key: str, lang: str, installed: frozenset[str]) -> Check:
    """One (key, lang): every language of it installed, or the packages that would install it."""
    missing = [name for name in lang.split("+") if name not in installed]
    if not missing:
        return Check(True, f"{key} {lang}", "is installed")
    packages = " ".join(f"tesseract-ocr-{name.lower().replace('_', '-')}" for name in missing)
    fix = f"install {packages}" if all(missing) else "name languages as eng or eng+deu"
    return Check(
        False,
        f"{key} {lang}",
        f"tesseract has no language data for {', '.join(missing)} (installed: "
        f"{', '.join(sorted(installed))})",
        f"{fix}, or change {key.split()[0]}",
    )
