"""Which names an inbox never takes, in one place: the watcher and the scan ask it, and so does
``ocrwatch ocr DIR``'s walk, so both take the same documents.

A name is refused when it is hidden (begins with ``.``), when it matches a built-in pattern (what
scanners, file shares and downloads leave beside documents) or one of the inbox's ``ignore``
patterns, or, for a file, when it ends like a sidecar or names an output ocrwatch writes. Patterns
are shell globs (``*``, ``?``, ``[...]``), matched without regard to case against one name, never a
path: a pattern ending in ``/`` names a folder, which is neither watched nor scanned, nor anything
below it; any other pattern names a file.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from pathlib import PurePath

from ocrwatch.naming import is_output, sidecar_names

BUILTIN_IGNORE: tuple[str, ...] = (
    ".DS_Store",
    "._*",
    "Thumbs.db",
    "desktop.ini",
    "@eaDir/",
    ".stfolder/",
    "__MACOSX/",
    "*.part",
    "*.crdownload",
    "*.tmp",
    "~$*",
)
"""macOS Finder and its resource forks, Windows Explorer, Synology's thumbnails, Syncthing, a zip's
macOS folder, downloads and copies under way (browsers, rsync, Samba), Office's lock files."""


def sidecar_suffixes(name_template: str) -> tuple[str, ...]:
    """How every sidecar's name ends, whatever the template: a sidecar is never taken for a
    document."""
    return tuple(
        "." + name.rsplit(".", 1)[-1] for name in sidecar_names("x", name_template).values()
    )


def _expression(patterns: Iterable[str]) -> re.Pattern[str]:
    return re.compile(
        "|".join(fnmatch.translate(pattern.lower()) for pattern in patterns) or "(?!)"
    )


class NameRules:
    """What an inbox takes by name: ``patterns`` (its documents), less what ``ignore`` names (the
    built-ins and the inbox's own), hidden names and sidecars (``sidecars``: their endings). One
    compiled expression each, since every event asks."""

    def __init__(
        self, patterns: Iterable[str], ignore: Iterable[str], sidecars: tuple[str, ...]
    ) -> None:
        ignored = (*BUILTIN_IGNORE, *ignore)
        self._documents = _expression(patterns)
        self._files = _expression(pattern for pattern in ignored if not pattern.endswith("/"))
        self._folders = _expression(pattern[:-1] for pattern in ignored if pattern.endswith("/"))
        self._sidecars = tuple(suffix.lower() for suffix in sidecars)

    def enters(self, name: str) -> bool:
        """Whether a folder called ``name`` may hold documents: neither hidden nor ignored."""
        return not name.startswith(".") and self._folders.match(name.lower()) is None

    def ignores(self, name: str) -> bool:
        """Whether a file called ``name`` is refused whatever the patterns: hidden, ignored, a
        sidecar."""
        lower = name.lower()
        return (
            lower.startswith(".")
            or lower.endswith(self._sidecars)
            or self._files.match(lower) is not None
        )

    def takes(self, path: PurePath) -> bool:
        """Whether the file ``path`` is a document by its name (its folders are ``enters``'s
        business)."""
        return (
            not self.ignores(path.name)
            and self._documents.match(path.name.lower()) is not None
            and not is_output(path.as_posix())
        )
