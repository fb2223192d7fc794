"""What Tesseract knows, for judging a PDF page's own text (``pagetext.judge``): the installed
languages, each one's letters (its character set) and words (its word list, ``plaintext.wordlist``),
read from its language data once per process, with its training tools (``combine_tessdata``,
``dawg2wordlist``).
"""

from __future__ import annotations

import subprocess
import tempfile
import threading
from pathlib import Path

import structlog

from ocrwatch import plaintext
from ocrwatch.infra import children

log = structlog.get_logger()

LIST_TIMEOUT_SECONDS = 60.0


class Tessdata:
    """Tesseract's knowledge, read from its language data once per process (``binary`` finds
    it) and kept: the installed languages, each one's letters and words on first use."""

    def __init__(self, binary: str) -> None:
        self._binary = binary
        self._lock = threading.Lock()
        self._folder: Path | None = None
        self._languages: frozenset[str] = frozenset()
        self._letters: dict[str, frozenset[str]] = {}
        self._words: dict[str, frozenset[str] | None] = {}
        self._listed = False

    def languages(self) -> frozenset[str]:
        """The installed languages (none where Tesseract or its tools cannot be run)."""
        with self._lock:
            if not self._listed:
                self._listed = True
                self._folder = self._list()
            return self._languages

    def letters(self, lang: str) -> frozenset[str] | None:
        """The letters of the installed languages of ``lang`` (``ara+eng``), read once a process
        for each ``lang`` asked."""
        installed = self.languages()
        if self._folder is None:
            return None
        with self._lock:
            if lang not in self._letters:
                names = [name for name in lang.split("+") if name in installed and name != "osd"]
                self._letters[lang] = frozenset(
                    c for name in names for c in self._unicharset(name) if c.isalpha()
                )
            return self._letters[lang]

    def words(self, lang: str) -> frozenset[str] | None:
        self.languages()
        if self._folder is None:
            return None
        with self._lock:
            if lang not in self._words:
                self._words[lang] = self._read_words(lang)
            return self._words[lang]

    def _list(self) -> Path | None:
        """The folder of Tesseract's language data, its languages kept; None where Tesseract or
        its training tools cannot be run."""
        try:
            done = children.run(
                [self._binary, "--list-langs"],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                timeout=LIST_TIMEOUT_SECONDS,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("text_dictionary_missing", error=f"{self._binary} --list-langs: {exc}")
            return None
        listed = done.stdout.decode("utf-8", "replace")
        folder = plaintext.tessdata_dir(listed)
        if done.returncode != 0 or folder is None or plaintext.tools_missing():
            log.warning(
                "text_dictionary_missing",
                error="tesseract, its language data or its "
                "training tools (combine_tessdata, dawg2wordlist) not found",
            )
            return None
        self._languages = frozenset(
            name.strip() for name in listed.splitlines()[1:] if name.strip()
        )
        return folder

    def _component(self, lang: str, name: str, scratch: str) -> Path | None:
        """The component ``name`` of ``lang``'s traineddata, written into ``scratch``; None where it
        has none."""
        assert self._folder is not None
        out = Path(scratch) / f"{lang.replace('/', '_')}.{name}"
        try:
            children.run(
                ["combine_tessdata", "-e", str(self._folder / f"{lang}.traineddata"), str(out)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=LIST_TIMEOUT_SECONDS,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out if out.is_file() and out.stat().st_size else None

    def _unicharset(self, lang: str) -> set[str]:
        with tempfile.TemporaryDirectory(prefix="ocrwatch-tessdata-") as scratch:
            path = self._component(lang, "lstm-unicharset", scratch)
            path = path or self._component(lang, "unicharset", scratch)
            if path is None:
                return set()
            lines = path.read_text("utf-8", "replace").splitlines()[1:]
        return {line.split(" ", 1)[0] for line in lines if line}

    def _read_words(self, lang: str) -> frozenset[str] | None:
        assert self._folder is not None
        try:
            words = plaintext.wordlist(self._folder, lang)
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("text_dictionary_missing", lang=lang, error=str(exc))
            return None
        if not words:
            log.warning("text_dictionary_missing", lang=lang, error="no word list in its data")
        return words or None


_SHARED: dict[str, Tessdata] = {}
_SHARED_LOCK = threading.Lock()


def shared(binary: str) -> Tessdata:
    """The process's one ``Tessdata`` for ``binary``: its word lists are read once."""
    with _SHARED_LOCK:
        return _SHARED.setdefault(binary, Tessdata(binary))
