"""The package's shape: data flows one way, no import circles, no module over 600 lines.

Imports are read from the source (ast), lazy ones inside functions and ``TYPE_CHECKING`` blocks included,
because a lazy import is still a dependency: it only moves the failure to run time.
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ocrwatch"
MAX_LINES = 600

# Rank of each layer, in the order the data flows (docs/design.md, "Layers"). A module imports only modules
# of its own rank or lower. Matched by longest prefix of the dotted name below ``ocrwatch``.
RANKS: dict[str, int] = {
    "errors": 0,
    "config": 0,
    "config_env": 0,
    "config_engines": 0,
    "config_base": 0,
    "config_sections": 0,
    "config_sources": 0,
    "configdoc": 0,
    "logging": 0,
    "systemd": 0,
    "memory": 0,
    "children": 0,
    "sniff": 0,
    "naming": 0,
    "http": 0,
    "metrics": 0,
    "s3client": 0,
    "safefs": 0,
    "streams": 0,
    "plaintext": 0,
    "engines.sampling": 0,
    "sources": 1,
    "database": 2,
    "ledger": 2,
    "deliveries": 2,
    "written": 2,
    "render": 3,
    "imagepages": 3,
    "orientation": 3,
    "deskew": 3,
    "engines.base": 4,
    "scheduler": 4,
    "session": 4,
    "engines": 5,
    "ladder": 6,
    "assemble": 6,
    "schema": 6,
    "textlayer": 6,
    "pdfcontent": 6,
    "pagetext": 6,
    "figures": 6,
    "outputs": 6,
    "sinks": 7,
    "admission": 8,
    "attempts": 8,
    "reuse": 8,
    "pipeline": 8,
    "checks": 8,
    "hooks": 8,
    "supervisor": 8,
    "archive": 8,
    "control": 8,
    "daemon": 9,
    "cli": 9,
    "report": 8,
    "__main__": 9,
    "__init__": 0,
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _rank(module: str) -> int:
    best, rank = -1, None
    for prefix, value in RANKS.items():
        if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
            best, rank = len(prefix), value
    assert rank is not None, f"ocrwatch.{module} has no layer: add it to RANKS and to docs/design.md"
    return rank


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The ``ocrwatch`` modules that ``module`` imports, anywhere in its body."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(["ocrwatch", *package[: len(package) - node.level + 1]])
                stem = f"{base}.{node.module}" if node.module else base
            else:
                stem = node.module or ""
            names = [stem] + [f"{stem}.{alias.name}" for alias in node.names]
        for name in names:
            if name == "ocrwatch" or not name.startswith("ocrwatch."):
                continue
            target = name.removeprefix("ocrwatch.")
            while target and target not in known:  # "from ocrwatch.x import y": y may be a name, not a module
                target = target.rpartition(".")[0]
            if target and target != module:
                found.add(target)
    return found


GRAPH = {name: _imports(name, path, set(_modules())) for name, path in _modules().items()}


def test_every_module_has_a_layer() -> None:
    for module in GRAPH:
        _rank(module)


def test_no_import_runs_upwards() -> None:
    wrong = [
        f"ocrwatch.{module} (rank {_rank(module)}) imports ocrwatch.{target} (rank {_rank(target)})"
        for module, targets in sorted(GRAPH.items())
        for target in sorted(targets)
        if _rank(target) > _rank(module) and not _is_package_of(module, target)
    ]
    assert not wrong, "\n".join(wrong)


def _is_package_of(module: str, target: str) -> bool:
    """A package's ``__init__`` may name its own members (registration), nothing else."""
    return target.startswith(module + ".")


def test_no_import_circle() -> None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for target in sorted(GRAPH.get(module, ())):
            if state.get(target) == 1:
                cycle = stack[stack.index(target):] + [target]
                pytest.fail("import circle: " + " -> ".join(f"ocrwatch.{m}" for m in cycle))
            if target not in state:
                visit(target)
        stack.pop()
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module)


def test_no_module_over_600_lines() -> None:
    long = {
        str(path.relative_to(PACKAGE.parent)): count
        for path in PACKAGE.rglob("*.py")
        if (count := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, long


def test_no_tracked_benchmark_results() -> None:
    """Results and run logs live outside the repository; docs/performance.md keeps the one table."""
    root = PACKAGE.parent
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(
        ["git", "ls-files", "bench"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.split()
    results = [name for name in tracked if "/results" in name or name.endswith((".jsonl", ".log"))]
    assert not results, results


def test_no_comment_cites_a_benchmark_run() -> None:
    """A comment gives the reason, not the run that showed it."""
    import re

    pattern = re.compile(r"bench/README[^\n]*run|\brun [0-9]+\b|\bruns [0-9]+ and [0-9]+\b", re.IGNORECASE)
    cited = [
        f"{path.relative_to(PACKAGE.parent)}:{number}"
        for path in PACKAGE.rglob("*")
        if path.suffix in {".py", ".md"}
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not cited, cited
