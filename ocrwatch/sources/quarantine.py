"""Moving a failed document aside to its inbox's ``quarantine_dir``, where others can write too.

Both sides are reached through ``safefs``, walking down from the inbox and from ``quarantine_dir``
(or from the inbox, where the quarantine lies inside it) without following any link: a folder of the
inbox swapped for a link, or a folder of the quarantine made a link in advance, can neither move a
file from outside the inbox nor put one outside the quarantine. Each folder the quarantine makes is
as readable as the inbox folder it stands for, never more (``safefs.Access``), and one already there
is used only while it is as one made so: a folder another user made first, or one made for an inbox
folder that has changed hands since, is never moved into (``untrusted_folder``). The document is
held as ``sourcefile.held`` holds it (one name, no writer), and its name is removed only while it is
still the file moved (``Folder.remove_if``). Its error sidecar goes along only where the record of
outputs holds it as ocrwatch's (``owns``, given by the daemon). Nothing is overwritten: a taken name
gets a number.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from itertools import count
from pathlib import Path

from ocrwatch.errors import SourceChanged
from ocrwatch.naming import sidecar_names
from ocrwatch.safefs import Access, Folder, Replaced, parts_below, walk
from ocrwatch.sources.sourcefile import folders_of, held

Owns = Callable[[Folder, Path, str, int], bool]
"""``owns(here, root, name, owner)``: whether ``name`` (relative to the inbox ``root``; its file
lies in the open folder ``here``) holds ocrwatch's own output for a source of the user ``owner``
(``sinks.ownership.judge``)."""


def quarantine(
    path: Path, root: Path, quarantine_dir: Path, name_template: str, owns: Owns | None = None
) -> tuple[Path, Path | None]:
    """Move a failed document, with its error sidecar where ``owns`` says it is ocrwatch's (without
    ``owns`` it stays), to the same place under ``quarantine_dir``. Blocking. Where the document
    went, and where its error sidecar went (None: it stayed).

    Raises ``OSError`` (a link in the quarantine's folders), ``SourceGone`` and ``SourceChanged``
    when the document is no longer the regular file beneath its inbox, ``SourceInUse`` when it has
    another name or a process holds it open for writing.
    """
    relative = parts_below(path.parent, root)
    prefix = "".join(f"{part}/" for part in relative)
    with folders_of(path, root) as folders:
        here = folders[-1]
        with contextlib.ExitStack() as stack:
            source = stack.enter_context(held(here, path, None))
            target = stack.enter_context(_target(root, quarantine_dir, folders, relative))
            moved = _move_exclusive(
                here, path.name, target, path.name, source.fd, source.info, source.check
            )
            error = sidecar_names(path.name, name_template)["error"]
            fd = here.open_read(error) if owns is not None else None
            carried = None
            if fd is not None:
                try:
                    if owns is not None and owns(here, root, prefix + error, source.info.st_uid):
                        new = sidecar_names(moved, name_template)["error"]
                        # Replaced meanwhile: not ocrwatch's to move.
                        with contextlib.suppress(SourceChanged):
                            carried = _move_exclusive(
                                here, error, target, new, fd, os.fstat(fd), None
                            )
                finally:
                    os.close(fd)
    folder = quarantine_dir.joinpath(*relative)
    return folder / moved, None if carried is None else folder / carried


@contextlib.contextmanager
def _target(
    root: Path, quarantine_dir: Path, inbox: Sequence[Folder], relative: Sequence[str]
) -> Iterator[Folder]:
    """The folder that mirrors the document's under ``quarantine_dir``, made where missing, each
    level given the access of the inbox folder it stands for, and checked to have it where found
    (``inbox``: the inbox's folders down to the document's)."""
    accesses = [Access.of(os.fstat(folder.fd)) for folder in inbox]
    if quarantine_dir.is_relative_to(root):  # reached from the inbox: no user can swap its way in
        above = parts_below(quarantine_dir, root)
        made_as = [accesses[0]] * len(above) + accesses[1:]
        with walk(root, (*above, *relative), make=made_as) as made:
            yield made[-1]
        return
    # Made and checked at start (``roots.prepare``), never here: one gone since is ``FolderGone``
    # (the document stays where it failed, and the log says why).
    with walk(quarantine_dir, relative, make=accesses[1:]) as made:
        yield made[-1]


def _move_exclusive(
    source: Folder,
    name: str,
    target: Folder,
    wanted: str,
    fd: int,
    info: os.stat_result,
    check: Callable[[], None] | None,
) -> str:
    """Move the file ``name`` (open as ``fd``, of ``info``) from ``source`` into ``target`` as
    ``wanted``, or ``stem.N.suffix`` when taken (``Folder.move_to``: a hard link, or across
    filesystems a copy keeping owner and mode). The name it got; ``SourceChanged`` where ``name`` no
    longer is that file."""
    plain = Path(wanted)
    for number in count():
        candidate = wanted if number == 0 else f"{plain.stem}.{number}{plain.suffix}"
        try:
            source.move_to(name, target, candidate, fd, info, check)
        except FileExistsError:
            continue
        except Replaced as exc:
            raise SourceChanged(str(exc)) from None
        return candidate
    raise AssertionError("unreachable")
