"""The oldest Python ocrwatch supports (``requires-python``, 3.10) can run every module, test and
CPU benchmark.

No 3.10 interpreter runs the suite, so the source is read instead: ``vermin`` knows the version each
standard library name, keyword and syntax needs, and two checks of our own cover what it does not
know. From 3.11 on ``asyncio.TimeoutError`` is the builtin ``TimeoutError``; before, it is a class
apart, so ``except TimeoutError`` around ``asyncio.wait_for`` silently lets the timeout through. And
the sqlite3 module names SQLite's error codes (``sqlite3.SQLITE_BUSY``, ``exc.sqlite_errorcode``)
only from 3.11 on (``ocrwatch.errors.sqlite_code`` reads them on both).
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
OLDEST = (3, 10)
# Every module, test and CPU benchmark (bench/gpu/ runs on the GPU machine's own Python, never the
# oldest).
SOURCES = [REPO / "ocrwatch", REPO / "tests", *sorted((REPO / "bench").glob("*.py"))]
# What the sqlite3 module of Python 3.10 names among its SQLITE_* constants that a result can be
# compared to.
SQLITE_310 = frozenset({"SQLITE_OK", "SQLITE_DENY", "SQLITE_IGNORE"})
# Calls whose arguments are exception classes to catch or test for.
CATCHERS = frozenset({"suppress", "isinstance", "issubclass", "raises"})


def _vermin(*paths: Path) -> subprocess.CompletedProcess[str]:
    target = ".".join(map(str, OLDEST))
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, vermin; sys.exit(vermin.main())",
            f"--target={target}-",
            "--no-tips",
            "--violations",
            "--eval-annotations",
            *map(str, paths),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@functools.cache
def _trees() -> dict[str, ast.Module]:
    """Each file of ``SOURCES``, parsed once for every check."""
    files = sorted({f for p in SOURCES for f in ([p] if p.is_file() else p.rglob("*.py"))})
    return {str(f.relative_to(REPO)): ast.parse(f.read_text(), str(f)) for f in files}


def _imports_asyncio(tree: ast.Module) -> bool:
    return any(
        (isinstance(node, ast.Import) and any(a.name == "asyncio" for a in node.names))
        or (isinstance(node, ast.ImportFrom) and node.module == "asyncio")
        for node in ast.walk(tree)
    )


def _is_asyncio_timeout(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "TimeoutError"
        and ast.unparse(node.value) == "asyncio"
    )


def builtin_timeouts_caught(tree: ast.Module) -> list[int]:
    """Lines, in a module using asyncio, that catch or test for the builtin ``TimeoutError``
    (``except``, ``suppress``, ``isinstance``, ``pytest.raises``...) without
    ``asyncio.TimeoutError`` among the same classes."""
    if not _imports_asyncio(tree):
        return []
    caught: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler) and node.type is not None:
            caught.append(node.type)
        elif isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] in CATCHERS:
            caught.extend(
                node.args[1:]
                if ast.unparse(node.func) in ("isinstance", "issubclass")
                else node.args
            )
    lines = []
    for classes in caught:
        named = classes.elts if isinstance(classes, ast.Tuple) else [classes]
        builtin = [c for c in named if isinstance(c, ast.Name) and c.id == "TimeoutError"]
        if builtin and not any(_is_asyncio_timeout(c) for c in named):
            lines.append(builtin[0].lineno)
    return sorted(lines)


def sqlite_names_310_lacks(tree: ast.Module) -> list[int]:
    """Lines that read ``sqlite3.SQLITE_<code>`` or ``.sqlite_errorcode`` / ``.sqlite_errorname``:
    3.11's."""
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and (
            node.attr in ("sqlite_errorcode", "sqlite_errorname")
            or (
                node.attr.startswith("SQLITE_")
                and node.attr not in SQLITE_310
                and ast.unparse(node.value) == "sqlite3"
            )
        )
    )


def test_the_oldest_python_is_the_one_pyproject_requires() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">={}.{}".format(*OLDEST)
    assert "Programming Language :: Python :: {}.{}".format(*OLDEST) in project["classifiers"]


def test_nothing_needs_a_python_newer_than_the_oldest_supported() -> None:
    result = _vermin(*SOURCES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_vermin_catches_what_the_oldest_python_lacks(tmp_path: Path) -> None:
    sample = tmp_path / "newer.py"
    sample.write_text(
        "import asyncio\nimport tomllib\n\nasync def f() -> None:\n    async with "
        "asyncio.timeout(1):\n        pass\n"
    )
    result = _vermin(sample)
    assert result.returncode != 0
    assert (
        "'asyncio.timeout' member requires" in result.stdout
        and "'tomllib' module requires" in result.stdout
    )


def test_an_asyncio_timeout_is_never_caught_as_the_builtin_alone() -> None:
    found = {
        name: lines for name, tree in _trees().items() if (lines := builtin_timeouts_caught(tree))
    }
    assert found == {}, "catch asyncio.TimeoutError there (a class of its own on 3.10)"


def test_no_sqlite3_error_code_names_that_the_oldest_python_lacks() -> None:
    found = {
        name: lines for name, tree in _trees().items() if (lines := sqlite_names_310_lacks(tree))
    }
    assert found == {}, "read the code through ocrwatch.errors.sqlite_code there (3.10 names none)"


def test_the_source_checks_catch_what_they_are_for() -> None:
    caught = """import asyncio
import contextlib
import sqlite3

async def f(exc: BaseException) -> bool:
    try:
        await asyncio.wait_for(asyncio.sleep(1), 0.1)
    except TimeoutError:
        pass
    with contextlib.suppress(OSError, TimeoutError):
        pass
    return exc.sqlite_errorcode == sqlite3.SQLITE_BUSY or isinstance(exc, TimeoutError)
"""
    fine = """import asyncio
import sqlite3

async def f(exc: BaseException) -> int:
    try:
        await asyncio.wait_for(asyncio.sleep(1), 0.1)
    except (TimeoutError, asyncio.TimeoutError):
        raise TimeoutError("late") from None
    errors = [TimeoutError, asyncio.TimeoutError]
    code = getattr(exc, "sqlite_errorcode", None) or 0
    return sqlite3.SQLITE_OK + code + isinstance(exc, asyncio.TimeoutError)
"""
    assert builtin_timeouts_caught(ast.parse(caught)) == [8, 10, 12]
    assert sqlite_names_310_lacks(ast.parse(caught)) == [12, 12]
    assert (
        builtin_timeouts_caught(ast.parse(fine)) == []
        and sqlite_names_310_lacks(ast.parse(fine)) == []
    )
    no_asyncio = ast.parse("try:\n    pass\nexcept TimeoutError:\n    pass\n")
    assert builtin_timeouts_caught(no_asyncio) == []  # the builtin is the one that can arrive there
