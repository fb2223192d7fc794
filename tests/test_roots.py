"""The trust rule for every root (``ocrwatch.config.roots``): a root is never a link, belongs to
root or the daemon's user, is written by no one else unless it is an inbox, cannot be swapped
through a folder on the way, is made at start where missing and then checked, and is never a folder
an inbox would read. Other users are stood for by uid 65534 (``nobody``), which only root can give a
file."""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path

import pytest

import ocrwatch.config.roots as roots
from ocrwatch.config.sources import InboxConfig
from ocrwatch.errors import ConfigError

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to nobody")

NOBODY = 65534


def folder(path: Path, mode: int = 0o755, uid: int = 0, gid: int = 0) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, uid, gid)
    path.chmod(mode)
    return path


def root(path: Path, kind: roots.RootKind = "folder", **more: object) -> roots.Root:
    """A root keyed after its name, made at start unless it is a file."""
    more.setdefault("make", kind != "file")
    return roots.Root(f"key-{path.name}", path, kind, "/etc/test.toml", **more)  # type: ignore[arg-type]


def texts(*found: roots.Root) -> list[str]:
    return [problem.text for problem in roots.check(found)]


@pytest.fixture
def base(tmp_path: Path) -> Path:
    """A folder only root may write, as /srv is."""
    return folder(tmp_path / "srv")


def test_a_folder_of_root_or_the_daemon_writable_by_no_one_else_passes(base: Path) -> None:
    for made in (
        folder(base / "out"),
        folder(base / "group", 0o775),
        folder(base / "private", 0o700),
    ):
        assert texts(root(made)) == [], made  # group root: private to root


@pytest.mark.parametrize("kind", ["folder", "inbox", "state", "file"])
def test_a_link_is_never_a_root(base: Path, kind: roots.RootKind) -> None:
    real = folder(base / "real", 0o700)
    if kind == "file":
        real = real / "file"
        real.write_text("x")
    (base / "link").symlink_to(real)
    [problem] = roots.check([root(base / "link", kind)])
    assert "symbolic link" in problem.text and "point key-link at the real" in problem.fix


@pytest.mark.parametrize("kind", ["folder", "inbox", "state", "file"])
def test_a_root_another_user_owns_is_refused(base: Path, kind: roots.RootKind) -> None:
    path = base / "theirs"
    if kind == "file":
        path.write_text("x")
        os.chown(path, NOBODY, NOBODY)
        path.chmod(0o600)
    else:
        folder(path, 0o700, NOBODY, NOBODY)
    [said] = texts(root(path, kind))
    assert said.startswith("is owned by nobody, not by root"), said


@pytest.mark.parametrize(
    ("mode", "gid", "writers"),
    [
        (0o777, 0, "others"),
        (0o1777, 0, "others"),  # sticky: still anyone's to fill with their own folders
        (0o775, NOBODY, "the group nogroup"),  # a group that is no one user's own
    ],
)
def test_a_folder_others_or_a_shared_group_may_write_is_refused(
    base: Path, mode: int, gid: int, writers: str
) -> None:
    path = folder(base / "out", mode, 0, gid)
    [problem] = roots.check([root(path)])
    assert problem.text.startswith(f"is writable by {writers} (mode {mode:04o})"), problem.text
    assert problem.fix == f"chmod go-w {path}"


def test_an_inbox_may_be_written_by_others_but_state_dir_not_even_by_its_group(base: Path) -> None:
    assert texts(root(folder(base / "inbox", 0o1777), "inbox")) == []
    [said] = texts(root(folder(base / "state", 0o770), "state"))
    assert said.startswith("is writable by its group (mode 0770)"), said


def test_a_group_write_an_acl_grants_another_user_is_refused(base: Path) -> None:
    """The group bits of a folder with an ACL are its mask: a named user may write, whatever the
    group."""
    path = folder(base / "out", 0o755)
    entries = [(0x01, 7, -1), (0x02, 7, NOBODY), (0x04, 5, -1), (0x10, 7, -1), (0x20, 5, -1)]
    data = struct.pack("<I", 2) + b"".join(
        struct.pack("<HHI", tag, perm, ident & 0xFFFFFFFF) for tag, perm, ident in entries
    )
    try:
        os.setxattr(path, "system.posix_acl_access", data)
    except OSError as exc:
        pytest.skip(f"no POSIX ACLs here: {exc}")
    assert stat.S_IMODE(path.stat().st_mode) == 0o775
    [said] = texts(root(path))
    assert "the users and groups its ACL names" in said, said


@pytest.mark.parametrize("kind", ["folder", "inbox", "file"])
def test_a_root_below_a_folder_others_may_write_that_is_not_sticky_is_refused(
    base: Path, kind: roots.RootKind
) -> None:
    shared = folder(base / "shared", 0o777)
    path = shared / "root"
    if kind == "file":
        path.write_text("x")
    else:
        folder(path)
    [problem] = roots.check([root(path, kind)])
    assert f"lies in {shared}, which others may write and which is not sticky" in problem.text
    assert f"chmod +t {shared}" in problem.fix


def test_a_root_further_below_a_non_sticky_shared_folder_is_refused_too(base: Path) -> None:
    shared = folder(base / "shared", 0o777)
    path = folder(shared / "a" / "b" / "out")
    [said] = texts(root(path))
    assert f"lies in {shared}, which others may write" in said and "rename a" in said, said


def test_below_a_sticky_folder_the_names_on_the_way_must_be_trusted(base: Path) -> None:
    """In a sticky folder only a name's owner may rename it: a root-owned name is safe, one another
    user owns is theirs to swap."""
    sticky = folder(base / "tmp", 0o1777)
    assert texts(root(folder(sticky / "mine" / "out"))) == []
    theirs = folder(sticky / "theirs", 0o755, NOBODY, NOBODY)
    [said] = texts(root(folder(theirs / "out")))
    assert f"lies below {theirs}, owned by nobody in the sticky {sticky}" in said, said


def test_a_folder_on_the_way_that_another_user_owns_is_refused(base: Path) -> None:
    home = folder(base / "home", 0o755, NOBODY, NOBODY)
    [said] = texts(root(folder(home / "out")))
    assert said.startswith(f"lies in {home}, owned by nobody"), said


def test_a_link_on_the_way_is_followed_and_where_it_leads_is_judged(base: Path) -> None:
    """A link owned by root in a safe folder is fine, but the folders it leads through are walked
    as the kernel walks them: a link into a shared, non-sticky folder is refused there."""
    shared = folder(base / "shared", 0o777)
    target = folder(shared / "data")
    (base / "data").symlink_to(target)
    folder(target / "out")
    [said] = texts(root(base / "data" / "out"))
    assert f"lies in {shared}, which others may write" in said, said
    safe = folder(base / "safe")
    (base / "elsewhere").symlink_to(safe)
    assert texts(root(folder(base / "elsewhere" / "out"))) == []


def test_a_link_on_the_way_that_another_user_owns_in_a_sticky_folder_is_refused(
    base: Path,
) -> None:
    sticky = folder(base / "tmp", 0o1777)
    (sticky / "link").symlink_to(folder(base / "safe"))
    os.lchown(sticky / "link", NOBODY, NOBODY)
    folder(base / "safe" / "out")
    [said] = texts(root(sticky / "link" / "out"))
    assert f"lies below {sticky / 'link'}, owned by nobody" in said, said


def test_a_missing_root_is_judged_by_the_folders_above_and_made_at_start(base: Path) -> None:
    sticky = folder(base / "tmp", 0o1777)
    path = sticky / "archive" / "2024"
    found = [root(path)]
    assert roots.check(found) == [] and not path.exists()  # check makes nothing
    roots.prepare(found)
    for made in (path, path.parent):
        info = made.stat()
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o755 & ~_umask()), made


def test_state_dir_and_its_missing_parents_are_made_private(base: Path) -> None:
    path = base / "var" / "state"
    roots.prepare([root(path, "state")])
    assert [stat.S_IMODE(p.stat().st_mode) for p in (path, path.parent)] == [0o700, 0o700]


def test_a_missing_root_below_a_non_sticky_shared_folder_is_refused_before_and_after(
    base: Path,
) -> None:
    shared = folder(base / "shared", 0o777)
    found = [root(shared / "archive")]
    [problem] = roots.check(found)
    assert "not sticky" in problem.text
    with pytest.raises(ConfigError, match="not sticky"):
        roots.prepare(found)


def test_a_folder_another_user_made_first_where_ocrwatch_would_make_it_is_refused(
    base: Path,
) -> None:
    sticky = folder(base / "tmp", 0o1777)
    folder(sticky / "quarantine", 0o700, NOBODY, NOBODY)
    with pytest.raises(ConfigError, match="is owned by nobody") as caught:
        roots.prepare([root(sticky / "quarantine")])
    assert caught.value.hint.startswith(f"chown root {sticky / 'quarantine'}")


def test_every_problem_is_said_at_once_one_line_each(base: Path) -> None:
    first = folder(base / "first", 0o777)
    second = folder(base / "second", 0o755, NOBODY, NOBODY)
    (base / "third").symlink_to(base / "first")
    with pytest.raises(ConfigError) as caught:
        roots.prepare([root(first), root(second), root(base / "third", "state")])
    lines = caught.value.message.splitlines()
    assert [line.split(" ", 2)[1] for line in lines] == ["key-first", "key-second", "key-third"]
    assert all(line.startswith("/etc/test.toml: key-") and "; fix: " in line for line in lines)


def test_a_root_that_cannot_be_made_says_so(base: Path) -> None:
    (base / "a-file").write_text("not a folder")
    with pytest.raises(ConfigError, match="cannot be created: .*a-file is not a folder"):
        roots.prepare([root(base / "a-file" / "out")])


def test_a_file_must_be_a_regular_file_of_a_trusted_user_writable_by_no_one_else(
    base: Path,
) -> None:
    path = base / "config.toml"
    path.write_text("x = 1\n")
    path.chmod(0o640)
    assert roots.read_file(root(path, "file")) == b"x = 1\n"
    path.chmod(0o666)
    with pytest.raises(ConfigError, match=r"writable by others \(mode 0666\)") as caught:
        roots.read_file(root(path, "file"))
    assert caught.value.hint == f"chmod 0640 {path}"
    with pytest.raises(FileNotFoundError):
        roots.read_file(root(base / "missing", "file"))
    os.mkfifo(base / "fifo")
    [said] = texts(root(base / "fifo", "file"))
    assert said == "is a FIFO, not a regular file"


def test_secrets_others_may_read_are_exposed(base: Path) -> None:
    path = base / "config.toml"
    path.write_text("token = 'x'\n")
    held = root(path, "file", secrets="hook[0].token")
    for mode, gid, exposed in ((0o644, 0, True), (0o640, 0, False), (0o640, NOBODY, True)):
        os.chown(path, 0, gid)
        path.chmod(mode)
        found = roots.exposed([held])
        assert bool(found) == exposed, (mode, gid)
    [problem] = found
    assert (
        problem.text == "holds secrets (hook[0].token) that the group nogroup may read (mode 0640)"
    )
    assert roots.exposed([root(path, "file")]) == []  # nothing secret in it


def inbox(path: Path, **settings: object) -> roots.Root:
    config = InboxConfig(path=path, **settings)  # type: ignore[arg-type]
    return roots.Root("inbox[0].path", path, "inbox", "/etc/test.toml", inbox=config)


@pytest.mark.parametrize(
    ("inside", "settings", "read"),
    [
        ("state", {}, True),
        ("a/b/state", {}, True),
        (".state", {}, False),  # hidden: never taken
        ("state", {"ignore": ["state/"]}, False),
        ("@eaDir/state", {}, False),  # a built-in ignored folder
        ("state", {"recursive": False}, False),
        ("a/b/state", {"max_depth": 2}, False),  # files there lie deeper than the inbox looks
        ("a/state", {"max_depth": 2}, True),
        ("", {"recursive": False}, True),  # the inbox folder itself
    ],
)
def test_a_folder_ocrwatch_writes_is_never_one_an_inbox_reads(
    base: Path, inside: str, settings: dict[str, object], read: bool
) -> None:
    top = folder(base / "inbox", 0o1777)
    place = folder(top / inside) if inside else top
    problems = roots.inside([inbox(top, **settings), root(place, "state")])
    assert bool(problems) == read, problems
    if read and inside:
        [problem] = problems
        assert f"lies inside inbox[0].path {top}, which would read it" in problem.text
        assert f'ignore = ["{Path(inside).parts[0]}/"]' in problem.fix


def test_an_inbox_leaves_its_own_quarantine_out_but_reads_another_inboxs(base: Path) -> None:
    top = folder(base / "inbox", 0o1777)
    quarantine = folder(top / "quarantine")
    assert roots.inside([inbox(top, quarantine_dir=quarantine), root(quarantine)]) == []
    assert len(roots.inside([inbox(top), root(quarantine)])) == 1


def test_state_fault_is_the_rule_for_the_ledgers_folder(base: Path) -> None:
    real = folder(base / "real", 0o700)
    (base / "link").symlink_to(real)
    assert roots.state_fault(real) is None
    assert roots.state_fault(base / "link") == (
        "is a symbolic link, which a root never is",
        "point state_dir at the real folder",
    )
    real.chmod(0o777)
    said, fix = roots.state_fault(real) or ("", "")
    assert said.startswith("is writable by others (mode 0777)") and fix == f"chmod 700 {real}"


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
