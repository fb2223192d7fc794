"""The one trust rule for every root: each place ocrwatch reads or writes from a configured path
(the inboxes, ``[output] dir``, ``archive_dir``, each ``quarantine_dir``, ``state_dir`` with its
spool), the configuration file and the files secrets are read from.

Below a root everything is reached through descriptors (``safefs``), so a root is where trust
starts: a root another user could replace, or reach through a folder on the way, would make every
check below it one made in a place of their choosing. So a root

- is never a symbolic link: its last component is opened with ``O_NOFOLLOW``;
- is owned by the user ocrwatch runs as, or by root (``state_dir``: by that user alone);
- may be written by no one else, unless it is an inbox: not by others, not by a group that is not
  private to one of those two users (``root``'s, or the user's own group of the same name with no
  other member), not by a user or group a POSIX ACL names (``state_dir``: by no group at all);
- cannot be swapped: each folder on the way (a link on the way is followed, as the kernel follows
  it, and the folders it leads through are checked too) is owned by one of those users and may be
  written by no one else, or is sticky (as ``/tmp``, mode 1777) with the next name on the way owned
  by one of them: in a sticky folder only a name's owner (or the folder's, or root) may rename or
  remove it, so a name another user cannot own stays what it is;
- has a path: an empty one is refused at load (``config_base.NonEmptyPath``), since it would mean
  the working folder.

A root that does not exist yet is made at start (``prepare``), one component at a time through
descriptors, and then checked like any other: a folder another user made first at that name is
refused, never used. The folders ocrwatch writes into are never inside an inbox that would read them
(``inside``): the inbox's own rules decide, as its scan does (hidden names, ``ignore``, depth, its
own ``quarantine_dir``). ``check`` makes nothing: a missing root is judged by the folders above it.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ocrwatch.errors import ConfigError, OcrwatchError
from ocrwatch.safefs import FILE_FLAGS, FOLDER_FLAGS, Access, describe, read_head, walk
from ocrwatch.sources.ignore import NameRules

if TYPE_CHECKING:
    from ocrwatch.config.sources import InboxConfig

RootKind = Literal["inbox", "folder", "state", "file"]
"""What a root holds: an inbox (others may write it), a folder of ocrwatch's outputs (``[output]
dir``, an archive, a quarantine), ``state_dir`` (the daemon's alone), or a file read at start (the
configuration, a secret)."""

MAX_LINKS = 40
"""Links followed on the way to a root before it is refused, as the kernel's ``ELOOP`` limit."""
FILE_LIMIT = 4 * 1024 * 1024
"""The most a configuration or secret file may hold: it is read whole, at start."""
_ACL = "system.posix_acl_access"


@dataclass(frozen=True)
class Root:
    """One root of a configuration: the key as the user set it (``[output] dir``, ``inbox[0].path``,
    ``OCRWATCH_STATE_DIR``), its path as written, what it holds, and where it was set (the file,
    ``environment`` or ``<defaults>``). ``make``: made at start where missing; ``secrets``: the
    secrets it holds, said where others may read them; ``inbox``: an inbox root's configuration."""

    key: str
    path: Path
    kind: RootKind
    where: str
    make: bool = False
    secrets: str = ""
    inbox: InboxConfig | None = None


@dataclass(frozen=True)
class Problem:
    """What is wrong with a root, and the command or change that fixes it."""

    root: Root
    text: str
    fix: str

    def line(self) -> str:
        """One line naming where the key was set, the key and its path, the problem and the fix."""
        root = self.root
        where = "" if root.where == str(root.path) else f"{root.where}: "
        return f"{where}{root.key} {root.path}: {self.text}; fix: {self.fix}"


def refused(problems: Sequence[Problem]) -> ConfigError:
    """All of ``problems`` as one start-up refusal: a line each, the fixes as the hint."""
    hint = "; ".join(dict.fromkeys(problem.fix for problem in problems))
    return ConfigError("\n".join(problem.line() for problem in problems), hint=hint)


# --- applying the rule ----------------------------------------------------------------------------


def check(found: Sequence[Root]) -> list[Problem]:
    """Every problem of ``found``, nothing made: what ``ocrwatch check`` reports. A folder that does
    not exist yet is judged by the folders above it (it is made at start)."""
    problems = [problem for root in found for problem in _problems(root, made=False)]
    return problems + inside(found)


def prepare(found: Sequence[Root]) -> None:
    """Make each missing root that is made at start, then check them all; ``ConfigError`` naming
    every problem at once (one line each), since a start refused for one would only meet the next.
    Blocking: at start, and for a reload's new configuration."""
    problems = [problem for root in found for problem in _problems(root, made=root.make)]
    problems += inside(found)
    if problems:
        raise refused(problems)


def exposed(found: Sequence[Root]) -> list[Problem]:
    """The files holding secrets that someone besides ocrwatch's users may read: a warning from
    ``run``, a ``FAIL`` line from ``check``. Only what exists is said (what is missing is
    ``check``'s)."""
    problems = []
    for root in found:
        if not root.secrets:
            continue
        try:
            info = os.lstat(root.path)
        except OSError:
            continue
        readers = _others(info, str(root.path), write=False)
        if readers is None or not stat.S_ISREG(info.st_mode):
            continue
        mode = stat.S_IMODE(info.st_mode)
        if root.kind == "file" and root.key == "config":
            fix = (
                f"chmod 0640 {root.path} (and chgrp it to the group ocrwatch runs as), or move them"
                " to files: secret_access_key_file, token_file, url_file"
            )
        else:
            fix = f"chmod 0600 {root.path}"
        text = f"holds secrets ({root.secrets}) that {readers} may read (mode {mode:04o})"
        problems.append(Problem(root, text, fix))
    return problems


def read_file(root: Root) -> bytes:
    """The whole file ``root`` (the configuration, a secret), read through the descriptor that was
    checked. ``FileNotFoundError`` when it is missing; ``ConfigError`` when it breaks the rule."""
    problems = [Problem(root, *swap)] if (swap := _swappable(root.path)) is not None else []
    fd = _open(root)
    if isinstance(fd, str):
        raise refused([*problems, Problem(root, fd, f"point {root.key} at the real file")])
    try:
        problems += [Problem(root, *fault) for fault in _own(root, fd)]
        if problems:
            raise refused(problems)
        data = read_head(fd, FILE_LIMIT + 1)
    finally:
        os.close(fd)
    if len(data) > FILE_LIMIT:
        said = f"is larger than {FILE_LIMIT} bytes, more than any configuration or secret"
        raise refused([Problem(root, said, f"point {root.key} at the file meant")])
    return data


def trusted_file(root: Root) -> str | None:
    """None when the file ``root`` may be read as it is; else why not (a line for each problem)."""
    try:
        read_file(root)
    except ConfigError as exc:
        return exc.message
    except OSError as exc:
        return f"{root.path}: cannot be read: {(exc.strerror or str(exc)).lower()}"
    return None


# --- one root -------------------------------------------------------------------------------------


def state_fault(path: Path) -> tuple[str, str] | None:
    """What makes the existing folder ``path`` unfit to hold the ledger, and the fix; None: nothing.
    ``database`` asks it wherever the ledger is opened (``status``, ``retry``, ``ocr``'s spool);
    ``OSError`` where it cannot be looked at (``FileNotFoundError``: it is missing)."""
    root = Root("state_dir", path, "state", "")
    fd = _open(root)
    if isinstance(fd, str):
        return fd, "point state_dir at the real folder"
    try:
        faults = _own(root, fd)
    finally:
        os.close(fd)
    if not faults:
        return None
    return "; ".join(text for text, _ in faults), " && ".join(fix for _, fix in faults)


def _problems(root: Root, *, made: bool) -> list[Problem]:
    """The problems of one root; with ``made``, it is made first where missing, unless it would be
    made where another user could swap it (nothing is made there)."""
    swap = _swappable(root.path)
    if made and swap is None and (why := _make(root)) is not None:
        return [Problem(root, f"cannot be created: {why}", _fix_make(root))]
    problems = [Problem(root, *swap)] if swap is not None else []
    try:
        fd = _open(root)
    except (FileNotFoundError, NotADirectoryError):  # check's folder lines say it cannot be made
        if root.kind == "file":
            problems.append(Problem(root, "does not exist", f"create {root.path}, or fix the key"))
        return problems
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EPERM):
            raise
        return problems  # the folder checks say it cannot be read, with their own fix
    if isinstance(fd, str):
        return [*problems, Problem(root, fd, f"point {root.key} at the real {_thing(root)}")]
    try:
        problems += [Problem(root, *fault) for fault in _own(root, fd)]
    finally:
        os.close(fd)
    return problems


def _open(root: Root) -> int | str:
    """The root itself, opened without following a link; what it is instead of a folder (or a
    regular file) when it cannot be one: a link, anything else."""
    info = os.lstat(root.path.expanduser())
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link, which a root never is"
    if root.kind == "file":
        if not stat.S_ISREG(info.st_mode):
            return f"is {describe(info.st_mode)}, not a regular file"
        return os.open(root.path.expanduser(), FILE_FLAGS)
    if not stat.S_ISDIR(info.st_mode):
        return f"is {describe(info.st_mode)}, not a folder"
    return os.open(root.path.expanduser(), FOLDER_FLAGS)


def _thing(root: Root) -> str:
    return "file" if root.kind == "file" else "folder"


def _own(root: Root, fd: int) -> list[tuple[str, str]]:
    """What is wrong with the open root itself: its type (it may have changed since it was looked
    at), its owner, who else may write it."""
    info = os.fstat(fd)
    if not (stat.S_ISREG if root.kind == "file" else stat.S_ISDIR)(info.st_mode):
        return [(f"is {describe(info.st_mode)}", f"point {root.key} at a {_thing(root)}")]
    faults = []
    me = _name(os.geteuid())
    if root.kind == "state" and info.st_uid != os.geteuid():
        said = f"is owned by {_name(info.st_uid)}, not by {me} (the user ocrwatch runs as)"
        faults.append((said, f"chown {me} {root.path}, or run ocrwatch as its owner"))
    elif info.st_uid not in _trusted():
        said = f"is owned by {_name(info.st_uid)}, not by {_trusted_names()}"
        fix = f"chown {me} {root.path}"
        faults.append(
            (said, fix if root.kind == "file" else f"{fix}, or remove it for ocrwatch to make")
        )
    mode = stat.S_IMODE(info.st_mode)
    if root.kind == "state":
        writers = ("others" if mode & 0o002 else "its group") if mode & 0o022 else None
    elif root.kind == "inbox":
        writers = None  # documents are dropped there: others may write it
    else:
        writers = _others(info, fd, write=True)
    if writers is not None:
        fix = {"state": "chmod 700", "file": "chmod 0640"}.get(root.kind, "chmod go-w")
        faults.append((f"is writable by {writers} (mode {mode:04o})", f"{fix} {root.path}"))
    if faults:  # what each means, said once
        text, fix = faults[-1]
        faults[-1] = (f"{text}, who could {_MEANS[root.kind]}", fix)
    return faults


_MEANS: dict[RootKind, str] = {
    "file": "change what ocrwatch reads there",
    "state": "read or replace the ledger",
    "inbox": "swap the folders ocrwatch writes sidecars into",
    "folder": "read or replace what ocrwatch writes there, or send it elsewhere",
}
"""What a root another user owns or may write lets them do."""


def _make(root: Root) -> str | None:
    """Make the missing folders of ``root`` one at a time below the nearest existing one, never
    through a link (``safefs.walk``): ``state_dir`` and its missing parents 0700 (as
    ``database.make_private_dirs``), any other 0755 less the umask; owned by the daemon's user.
    Why not, when it cannot be made."""
    path = root.path.expanduser().absolute()
    existing, missing = path, list[str]()
    while not os.path.lexists(existing) and existing != existing.parent:
        missing.insert(0, existing.name)
        existing = existing.parent
    if not missing:
        return None
    if not os.path.isdir(existing):
        return f"{existing} is not a folder"
    mode = 0o700 if root.kind == "state" else 0o777
    access = Access(mode, *_me(), of_folder=True)
    try:
        with walk(Path(os.path.realpath(existing)), missing, [access] * len(missing)):
            pass
    except OcrwatchError as exc:  # made meanwhile, by another user: refused as found
        return exc.message
    except OSError as exc:
        return (exc.strerror or str(exc)).lower()
    return None


def _fix_make(root: Root) -> str:
    return (
        f"create {root.path} and give {_name(os.geteuid())} (the user ocrwatch runs as) write"
        " access to it, or correct the path"
    )


# --- the folders on the way -----------------------------------------------------------------------


def _swappable(path: Path) -> tuple[str, str] | None:
    """Why another user could replace ``path``, or a folder on the way to it, and the fix; None when
    no one can. The path is walked as the kernel resolves it: each link on the way is followed (its
    own name judged in its folder first), ``..`` goes up from where the walk is; the last name is
    not followed (a root is never a link, which its own check says)."""
    current, pending, hops = Path("/"), list(path.expanduser().absolute().parts[1:]), 0
    while pending:
        name = pending.pop(0)
        if name == "..":
            current = current.parent
            continue
        entry_path = current / name
        try:
            above = os.lstat(current)
            entry: os.stat_result | None = os.lstat(entry_path)
        except FileNotFoundError:
            entry = None
        except OSError:
            return None  # not a folder on the way: the root's own check says it cannot be reached
        if (fault := _replaceable(current, above, entry_path, entry, last=not pending)) is not None:
            return fault
        if entry is None:
            return None  # made at start below a folder no one else can swap, then checked
        if stat.S_ISLNK(entry.st_mode) and pending:
            hops += 1
            if hops > MAX_LINKS:
                return f"has more than {MAX_LINKS} links on the way", "point it at the real path"
            target = Path(os.readlink(entry_path))
            if target.is_absolute():
                current = Path("/")
            pending = [*target.parts[1 if target.is_absolute() else 0 :], *pending]
            continue
        current = entry_path
    return None


def _replaceable(
    parent: Path, above: os.stat_result, entry_path: Path, entry: os.stat_result | None, last: bool
) -> tuple[str, str] | None:
    """Why a user other than ocrwatch's could rename, remove or make ``entry_path`` in ``parent``
    (of ``above``): they own the folder, or may write it and it is not sticky, or it is sticky and
    they own the name (the root itself: its own check names its owner)."""
    trusted = _trusted()
    if above.st_uid not in trusted:
        return (
            f"lies in {parent}, owned by {_name(above.st_uid)}, who could replace"
            f" {entry_path.name}",
            f"choose a path whose folders only {_trusted_names()} own, or chown {parent}",
        )
    writers = _others(above, str(parent), write=True)
    if writers is None:
        return None
    mode = stat.S_IMODE(above.st_mode)
    if not mode & stat.S_ISVTX:
        return (
            f"lies in {parent}, which {writers} may write and which is not sticky (mode"
            f" {mode:04o}): they could rename {entry_path.name} and put their own in its place",
            f"chmod +t {parent} (or go-w), or choose a path through folders only"
            f" {_trusted_names()} may write",
        )
    if entry is not None and not last and entry.st_uid not in trusted:
        return (
            f"lies below {entry_path}, owned by {_name(entry.st_uid)} in the sticky {parent}, who"
            " could replace it",
            f"choose a path through folders {_trusted_names()} own",
        )
    return None


# --- who may write or read ------------------------------------------------------------------------


def _others(info: os.stat_result, target: int | str, *, write: bool) -> str | None:
    """Who besides ocrwatch's users may write (or read) a file of ``info`` (``target``: its open
    descriptor or path, for its ACL): ``others``, a group, the entries of an ACL; None: no one. For
    writing, a group is trusted only where it is private to root or to the daemon's user; for
    reading, where it is private to any one user (a deliberate grant, as ``root:ocrwatch 0640``)."""
    mode = info.st_mode
    if mode & (stat.S_IWOTH if write else stat.S_IROTH):
        return "others"
    if not mode & (stat.S_IWGRP if write else stat.S_IRGRP):
        return None
    if _has_acl(target):  # the group bits are the ACL's mask: named users may have them
        return "the users and groups its ACL names"
    owner = _private_to(info.st_gid)
    if owner is None or (write and owner not in _trusted()):
        return f"the group {_group(info.st_gid)}"
    return None


def _has_acl(target: int | str) -> bool:
    try:
        os.getxattr(target, _ACL, follow_symlinks=isinstance(target, int))
    except OSError:  # none (ENODATA), or a filesystem without ACLs
        return False
    return True


def _private_to(gid: int) -> int | None:
    """The one user group ``gid`` is private to: a user's own group (named as the user, the user's
    primary group, no other member listed), ``root``'s included; None when it is none's."""
    try:
        group = grp.getgrgid(gid)
        user = pwd.getpwnam(group.gr_name)
    except KeyError:
        return None
    if user.pw_gid != gid or set(group.gr_mem) - {user.pw_name}:
        return None
    return user.pw_uid


def _trusted() -> frozenset[int]:
    """The users a root may belong to: root and the user ocrwatch runs as."""
    return frozenset({0, os.geteuid()})


def _trusted_names() -> str:
    return " or ".join(dict.fromkeys(_name(uid) for uid in sorted(_trusted(), reverse=True)))


def _me() -> tuple[int, int]:
    return os.geteuid(), os.getegid()


def _name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # no passwd entry for this uid (a container): the number says it
        return f"uid {uid}"


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return f"gid {gid}"


# --- the folders ocrwatch writes, and the inboxes -------------------------------------------------


def inside(found: Sequence[Root]) -> list[Problem]:
    """Each folder ocrwatch writes (state, outputs, archive, quarantine) that an inbox of ``found``
    would read: its documents (spool copies, archived sources, outputs) would come back as new
    ones. An inbox reads a folder as its scan does (``sources.inbox.Inbox.allows``): inside it,
    the inbox recursive for a subfolder, no deeper than ``max_depth``, no name on the way hidden or
    ignored, and not its own ``quarantine_dir`` (which it leaves out by rule)."""
    problems = []
    inboxes = [(root, _resolved(root.path)) for root in found if root.inbox is not None]
    for root in found:
        if root.kind not in ("folder", "state"):
            continue
        place = _resolved(root.path)
        for inbox, top in inboxes:
            assert inbox.inbox is not None
            if (below := _read_below(inbox.inbox, top, place)) is not None:
                problems.append(
                    Problem(
                        root,
                        f"lies inside {inbox.key} {inbox.path}, which would read it: what ocrwatch"
                        " writes there would come back as new documents",
                        f"move it out of {inbox.path}, or leave it out of that inbox"
                        f' (ignore = ["{below}/"] in its [[inbox]], or a name starting with ".")'
                        if below
                        else f"move it out of {inbox.path}",
                    )
                )
    return problems


def _read_below(inbox: InboxConfig, top: Path, place: Path) -> str | None:
    """Whether ``inbox`` (its folder ``top``) reads the folder ``place``: None when it does not;
    else the first name below ``top`` on the way ("" when ``place`` is the inbox folder)."""
    if place == top:
        return ""
    if not place.is_relative_to(top) or not inbox.recursive:
        return None
    parts = place.relative_to(top).parts
    names = NameRules(inbox.patterns, inbox.ignore, ())
    if len(parts) > inbox.max_depth or not all(names.enters(part) for part in parts):
        return None
    own = inbox.quarantine_dir
    if own is not None and place.is_relative_to(_resolved(own)):
        return None
    return parts[0]


def _resolved(path: Path) -> Path:
    return path.expanduser().resolve()
