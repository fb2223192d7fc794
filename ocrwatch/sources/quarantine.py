"""Moving a failed document aside to its inbox's ``quarantine_dir``, where others can write too.

Both sides are reached through ``safefs``, walking down from the inbox and from ``quarantine_dir``
(or from the inbox, where the quarantine lies inside it) without following any link: a folder of the
inbox swapped for a link, or a folder of the quarantine made a link in advance, can neither move a
file from outside the inbox nor put one outside the quarantine. Each folder the quarantine makes is
as readable as the inbox folder it stands for, never more (``safefs.Access``), and one already there
is used only while it is as one made so: a folder another user made first, or one made for an inbox
folder that has changed hands since, is never moved into (``untrusted_folder``). The document is
held as ``sourcefile.held`` holds it (one name, no writer), and its name is removed only while it is
still the file moved (``Folder.remove_if``). While the folders are held open its error sidecar may
follow (``Aside.carry``): the layer above, which holds the record of outputs, decides whether the
file there is ocrwatch's own to take along. Nothing is overwritten: a taken name gets a number.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import count
from pathlib import Path

from ocrwatch.errors import SourceChanged
from ocrwatch.naming import sidecar_names
from ocrwatch.safefs import Access, Folder, Replaced, parts_below, walk
from ocrwatch.sources.base import Quarantine
from ocrwatch.sources.sourcefile import folders_of, held


@dataclass
class Aside:
    """A document just moved aside, the folders on both sides still open: ``moved``, where it went;
    its error sidecar ``error`` in the inbox folder ``here`` it left (``below``: that name relative
    to the inbox, as the record of outputs keys it), for a source of the user ``owner``;
    ``carried``, where the error sidecar went, once ``carry`` took it along."""

    here: Folder
    error: str
    below: str
    owner: int
    moved: Path
    target: Folder
    name_template: str
    carried: Path | None = None

    def carry(self, fd: int) -> None:
        """Move the error sidecar, open as ``fd``, beside the document under its new name; it stays
        where its name no longer holds that file (replaced meanwhile: not ocrwatch's to move)."""
        wanted = sidecar_names(self.moved.name, self.name_template)["error"]
        info = os.fstat(fd)
        with contextlib.suppress(SourceChanged):
            name = _move_exclusive(self.here, self.error, self.target, wanted, fd, info, None)
            self.carried = self.moved.with_name(name)


@contextlib.contextmanager
def set_aside(request: Quarantine) -> Iterator[Aside]:
    """Move a failed document to the same place under ``request.to``; within the context its
    folders stay open and the document held, so its error sidecar may follow (``Aside.carry``).
    Blocking.

    Raises ``OSError`` (a link in the quarantine's folders), ``SourceGone`` and ``SourceChanged``
    when the document is no longer the regular file beneath its inbox, ``SourceInUse`` when it has
    another name or a process holds it open for writing.
    """
    path, root = request.path, request.root
    relative = parts_below(path.parent, root)
    error = sidecar_names(path.name, request.name_template)["error"]
    with folders_of(path, root) as folders:
        here = folders[-1]
        with contextlib.ExitStack() as stack:
            source = stack.enter_context(held(here, path, None))
            target = stack.enter_context(_target(root, request.to, folders, relative))
            moved = _move_exclusive(
                here, path.name, target, path.name, source.fd, source.info, source.check
            )
            yield Aside(
                here=here,
                error=error,
                below="".join(f"{part}/" for part in relative) + error,
                owner=source.info.st_uid,
                moved=request.to.joinpath(*relative, moved),
                target=target,
                name_template=request.name_template,
            )


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
