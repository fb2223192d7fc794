"""The package's shape: data flows one way, no import circles, no module over 600 lines.

Imports are read from the source (ast), lazy ones inside functions and ``TYPE_CHECKING`` blocks
included, because a lazy import is still a dependency: it only moves the failure to run time.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ocrwatch"
MAX_LINES = 600

# Rank of each layer, in the order the data flows (docs/design.md, "Layers"): each folder below
# ``ocrwatch`` is a layer, and a module imports only modules of its own rank or lower. Matched by
# longest prefix of the dotted name below ``ocrwatch``. The few modules ranked apart from their
# folder are contracts it holds for the layers below it.
RANKS: dict[str, int] = {
    "__init__": 0,
    "errors": 0,
    "naming": 0,
    "plaintext": 0,
    "safefs": 0,
    "config": 1,
    "sources.ignore": 1,  # the name rules the trust rule of every root (config.roots) asks too
    "infra": 2,
    "sources": 3,
    "store": 4,
    "pages": 5,
    "engines.base": 5,  # the engine contract: what the page scheduler hands an engine
    "engines.sampling": 5,  # the contract's sampling defaults
    "engines": 6,
    "recognize": 7,
    "results": 8,
    "sinks": 9,
    "jobs": 10,
    "control": 11,
    "__main__": 12,
    "app": 12,
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
    assert rank is not None, (
        f"ocrwatch.{module} has no layer: add it to RANKS and to docs/design.md"
    )
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
            # "from ocrwatch.x import y": y may be a name, not a module
            while target and target not in known:
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
                cycle = stack[stack.index(target) :] + [target]
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

    pattern = re.compile(
        r"bench/README[^\n]*run|\brun [0-9]+\b|\bruns [0-9]+ and [0-9]+\b", re.IGNORECASE
    )
    cited = [
        f"{path.relative_to(PACKAGE.parent)}:{number}"
        for path in PACKAGE.rglob("*")
        if path.suffix in {".py", ".md"}
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not cited, cited


# --- no callable or object handed down -----------------------------------------------------------

# What the callable check still finds, each with the reason it stays: a library's API, which the
# package does not shape. A lower layer returns what it produces (an ``Outbox`` of jobs and
# questions, render and page asks, ``submit``'s answer) rather than calling up; no debt is listed.
HANDED_DOWN: dict[str, str] = {
    "app.daemon: HealthServer <- self._update_gauges": "gauges exact at each scrape:"
    " prometheus_client reads such a value through a callback (set_function, a collector), its API",
    "app.report: self._bar.total = ...": "tqdm's bar is set by assigning its total: its API",
}


FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _methods(trees: dict[str, ast.Module]) -> dict[str, set[int]]:
    """Each method name defined in a class of the package: the ranks of the modules defining it."""
    found: dict[str, set[int]] = {}
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, FUNCTIONS) and not _is_property(item):
                        found.setdefault(item.name, set()).add(_rank(module))
    return found


def _is_property(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A property reads as a value, not a callable."""
    return any(ast.unparse(mark).endswith("property") for mark in node.decorator_list)


def _imported(tree: ast.Module, known: set[str]) -> dict[str, str]:
    """Local name → the ``ocrwatch`` module it names or comes from."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        absolute = isinstance(node, ast.ImportFrom) and not node.level
        if absolute and (node.module or "").startswith("ocrwatch"):
            stem = (node.module or "").removeprefix("ocrwatch").lstrip(".")
            for alias in node.names:
                full = f"{stem}.{alias.name}".lstrip(".")
                names[alias.asname or alias.name] = full if full in known else stem
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("ocrwatch.") and alias.asname:
                    names[alias.asname] = alias.name.removeprefix("ocrwatch.")
    return names


class _HandedDown(ast.NodeVisitor):
    """Calls into a lower layer that pass it a lambda, a partial, a bound method or ``self`` of a
    higher one; objects finished by assigning an attribute of an attribute (``self.a.b = ...``)."""

    def __init__(
        self,
        module: str,
        rank: int,
        imported: dict[str, str],
        methods: dict[str, set[int]],
        factories: set[str],
    ) -> None:
        self.module, self.rank, self.imported, self.methods = module, rank, imported, methods
        self.factories = factories  # functions that make a callable, as ``module.name``
        self.own: set[str] = set()  # the methods of the class being read
        self.found: list[str] = []

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        outer = self.own
        self.own = {item.name for item in node.body if isinstance(item, FUNCTIONS)}
        self.generic_visit(node)
        self.own = outer

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Attribute):
                self.found.append(f"{self.module}: {ast.unparse(target)} = ...")
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:  # another object's table emptied from outside it
            subscript = isinstance(target, ast.Subscript)
            if subscript and isinstance(target.value, ast.Attribute) and not _on_self(target.value):
                self.found.append(f"{self.module}: del {ast.unparse(target)}")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        callee = self._callee_rank(node.func)
        if callee is not None and callee < self.rank:
            for arg in [*node.args, *(keyword.value for keyword in node.keywords)]:
                if (given := self._given_rank(arg)) is not None and given > callee:
                    self.found.append(f"{self.module}: {ast.unparse(node.func)} <- {_short(arg)}")
        self.generic_visit(node)

    def _callee_rank(self, func: ast.expr) -> int | None:
        if isinstance(func, ast.Name) and func.id in self.imported:
            return _rank(self.imported[func.id])
        if isinstance(func, ast.Attribute):
            if isinstance(func.value, ast.Name) and func.value.id in self.imported:
                return _rank(self.imported[func.value.id])
            if func.attr in self.methods and not _on_self(func):
                return min(self.methods[func.attr])
        return None

    def _given_rank(self, arg: ast.expr) -> int | None:
        if isinstance(arg, ast.Lambda):
            return self.rank
        if isinstance(arg, ast.Call) and ast.unparse(arg.func) in {"partial", "functools.partial"}:
            return self.rank
        made = isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute)  # made above
        if made and isinstance(arg.func.value, ast.Name) and arg.func.value.id in self.imported:
            return _rank(self.imported[arg.func.value.id])
        if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Name):  # a callable made above
            origin = self.imported.get(arg.func.id)
            if origin is not None and f"{origin}.{arg.func.id}" in self.factories:
                return _rank(origin)
        if isinstance(arg, ast.Name) and arg.id == "self" and self.own:
            return self.rank
        if isinstance(arg, ast.Attribute) and not isinstance(arg.value, ast.Call):
            if isinstance(arg.value, ast.Name) and arg.value.id == "self":
                return self.rank if arg.attr in self.own else None
            if isinstance(arg.value, ast.Name) and arg.value.id in self.imported:
                return _rank(self.imported[arg.value.id])
            if _held(arg.value) and arg.attr in self.methods:  # a bound method of an object held
                return max(self.methods[arg.attr])
        return None


def _short(arg: ast.expr) -> str:
    """What was handed down, as the entry names it: ``lambda``, ``maker(...)`` or the name."""
    if isinstance(arg, ast.Lambda):
        return "lambda"
    return f"{ast.unparse(arg.func)}(...)" if isinstance(arg, ast.Call) else ast.unparse(arg)


def _on_self(node: ast.expr) -> bool:
    """``self.name``: an attribute of the instance (calling it stays within the module's class)."""
    if not isinstance(node, ast.Attribute):
        return False
    return isinstance(node.value, ast.Name) and node.value.id == "self"


def _held(node: ast.expr) -> bool:
    """``self.a``, ``pipeline.a.b``: an object reached through attributes, however deep."""
    if not isinstance(node, ast.Attribute):
        return False
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)


def _factories(module: str, tree: ast.Module) -> set[str]:
    """The functions of ``module`` that make a callable (``module.name``): each returns a function
    it defines (a closure over what it was given), a lambda or a partial."""
    found = set()
    for node in tree.body:
        if not isinstance(node, FUNCTIONS):
            continue
        inner = {item.name for item in ast.walk(node) if isinstance(item, FUNCTIONS)} - {node.name}
        for returned in ast.walk(node):
            value = returned.value if isinstance(returned, ast.Return) else None
            made = isinstance(value, ast.Call) and ast.unparse(value.func).endswith("partial")
            if (
                made
                or isinstance(value, ast.Lambda)
                or (isinstance(value, ast.Name) and value.id in inner)
            ):
                found.add(f"{module}.{node.name}")
    return found


def _handed_down(module: str, source: str, factories: set[str] | None = None) -> list[str]:
    known = set(_modules())
    tree = ast.parse(source)
    made = FACTORIES if factories is None else factories
    visitor = _HandedDown(module, _rank(module), _imported(tree, known), METHODS, made)
    visitor.visit(tree)
    return visitor.found


TREES = {module: ast.parse(path.read_text(), str(path)) for module, path in _modules().items()}
METHODS = _methods(TREES)
FACTORIES = {name for module, tree in TREES.items() for name in _factories(module, tree)}


def test_no_callable_or_object_handed_down() -> None:
    """A lower layer never holds a callable or an object of a higher one: control flows one way."""
    found = [
        entry
        for module, path in sorted(_modules().items())
        if _rank(module) >= _rank("jobs.pipeline")
        for entry in _handed_down(module, path.read_text())
    ]
    new, gone = sorted(set(found) - HANDED_DOWN.keys()), sorted(HANDED_DOWN.keys() - set(found))
    assert not new, "\n".join(new)
    assert not gone, "gone, strike from HANDED_DOWN: " + ", ".join(gone)


@pytest.mark.parametrize(
    "planted",
    [
        "from ocrwatch.pages.scheduler import PageScheduler\n"
        "class P:\n    def go(self):\n        PageScheduler(lambda doc: self.go())\n",
        "from ocrwatch.pages import scheduler\nimport functools\n"
        "class P:\n    def go(self):\n"
        "        scheduler.PageScheduler(functools.partial(self.go))\n",
        "from ocrwatch.sources.local import LocalSource\n"
        "class P:\n    def go(self):\n        LocalSource(lapsed=self.go)\n",
        "from ocrwatch.jobs.session import DocumentSession\n"
        "class P:\n    def go(self):\n        DocumentSession(self)\n",
        "class P:\n    def go(self, source):\n        source.start(self.pipeline.submit)\n",
        "class P:\n    def go(self):\n        self.supervisor.scheduler = self.go\n",
    ],
)
def test_the_callable_check_finds_what_is_planted(planted: str) -> None:
    assert _handed_down("app.daemon", planted)


def test_the_callable_check_finds_a_rule_made_above_and_handed_down() -> None:
    """A function of a higher layer that makes a callable (a closure over the record of outputs,
    say), whose result is given to a lower layer's constructor."""
    made = "def judge_of(written):\n    def owns(name):\n        return name in written\n"
    made += "    return owns\n"
    planted = (
        "from ocrwatch.jobs.archive import judge_of\n"
        "from ocrwatch.sources.local import LocalSource\n"
        "class P:\n    def go(self, written):\n        LocalSource(owns=judge_of(written))\n"
    )
    assert _handed_down("app.daemon", planted, _factories("jobs.archive", ast.parse(made)))


def test_no_class_defines_a_method_twice() -> None:
    """A second ``def`` of a name silently replaces the first (a rename onto a name in use)."""
    twice = []
    for module, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                names = [
                    item.name
                    for item in node.body
                    if isinstance(item, FUNCTIONS)
                    and not any("setter" in ast.unparse(mark) for mark in item.decorator_list)
                    and not any("overload" in ast.unparse(mark) for mark in item.decorator_list)
                ]
                twice += [
                    f"{module}.{node.name}.{name}" for name in set(names) if names.count(name) > 1
                ]
    assert not twice, twice


def test_the_package_is_folders_with_few_loose_modules() -> None:
    """Folders are the layers: a module left loose at the top hides which layer it belongs to."""
    loose = sorted(
        path.name
        for path in PACKAGE.glob("*.py")
        if path.name not in ("__init__.py", "__main__.py")
    )
    assert len(loose) <= 10, loose


def test_the_design_is_a_map_of_every_folder_in_under_300_lines() -> None:
    """docs/design.md is read whole by a newcomer: every layer named, no history of bugs."""
    design = (PACKAGE.parent / "docs" / "design.md").read_text()
    folders = sorted(path.name for path in PACKAGE.iterdir() if (path / "__init__.py").is_file())
    assert len(design.splitlines()) < 300
    assert [f for f in folders if f"{f}/" not in design] == []


def test_only_the_engines_folder_imports_an_engine() -> None:
    """The core reaches an engine through the contract (``engines.base``, ``engines.sampling``) and
    the registry, which finds it by entry point: an engine's own modules are imported only inside
    ``ocrwatch/engines``, so what an engine says of a page (a figure block) is the contract's."""
    neutral = {"engines.base", "engines.sampling", "engines.registry"}
    reached = sorted(
        f"ocrwatch.{module} imports ocrwatch.{target}"
        for module, targets in GRAPH.items()
        if module != "engines" and not module.startswith("engines.")
        for target in targets
        if target.startswith("engines.") and target not in neutral
    )
    assert not reached, reached


# --- the ledger is left for only through its facade ----------------------------------------------

FACADE = "store.asyncledger"
STORED = re.compile(r"ledger|store|deliveries", re.IGNORECASE)


def _store_methods() -> set[str]:
    """The public methods of the blocking stores ``AsyncLedger`` and ``AsyncDeliveries`` wrap."""
    classes = {
        "store.ledger": "Ledger",
        "store.database": "Database",
        "store.deliveries": "Deliveries",
    }
    return {
        item.name
        for module, name in classes.items()
        for node in ast.walk(TREES[module])
        if isinstance(node, ast.ClassDef) and node.name == name
        for item in node.body
        if isinstance(item, FUNCTIONS) and not item.name.startswith("_")
    }


STORE_METHODS = _store_methods()


def _names_a_store(node: ast.expr) -> bool:
    """``ledger``, ``self._store``, ``self.ledger.blocking``: a chain that names a store."""
    while isinstance(node, ast.Attribute):
        if STORED.search(node.attr):
            return True
        node = node.value
    return isinstance(node, ast.Name) and bool(STORED.search(node.id))


class _OffTheFacade(ast.NodeVisitor):
    """A store's blocking method handed to another call (``to_thread``, an executor, ``_offload``)
    or to a lambda that is; one called on ``blocking`` in the body of an ``async def``."""

    def __init__(self, module: str, methods: set[str]) -> None:
        self.module, self.methods = module, methods
        self.in_async = False
        self.found: list[str] = []

    def _store_call(self, node: ast.AST) -> bool:
        func = node.func if isinstance(node, ast.Call) else None
        return isinstance(func, ast.Attribute) and self._store_method(func)

    def _store_method(self, node: ast.expr) -> bool:
        return (
            isinstance(node, ast.Attribute)
            and node.attr in self.methods
            and _names_a_store(node.value)
        )

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        outer, self.in_async = self.in_async, True
        self.generic_visit(node)
        self.in_async = outer

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        outer, self.in_async = self.in_async, False
        self.generic_visit(node)
        self.in_async = outer

    def visit_Lambda(self, node: ast.Lambda) -> None:
        outer, self.in_async = self.in_async, False
        self.generic_visit(node)
        self.in_async = outer

    def visit_Call(self, node: ast.Call) -> None:
        for arg in [*node.args, *(keyword.value for keyword in node.keywords)]:
            handed = self._store_method(arg)
            if handed or (
                isinstance(arg, ast.Lambda) and any(map(self._store_call, ast.walk(arg.body)))
            ):
                self.found.append(f"{self.module}: {ast.unparse(node.func)} <- {_short(arg)}")
        func = node.func
        if (
            self.in_async
            and self._store_call(node)
            and isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Attribute)
            and func.value.attr == "blocking"
        ):
            self.found.append(f"{self.module}: {ast.unparse(func)} on the loop")
        self.generic_visit(node)


def _off_the_facade(module: str, tree: ast.Module) -> list[str]:
    visitor = _OffTheFacade(module, STORE_METHODS)
    visitor.visit(tree)
    return visitor.found


def test_the_stores_are_left_for_only_through_their_facade() -> None:
    """Async code awaits ``AsyncLedger``/``AsyncDeliveries``, the one hop to a thread for the
    ledger's file: no store method is handed to a thread elsewhere, nor called blocking on the
    loop."""
    found = [
        entry
        for module, tree in sorted(TREES.items())
        if module != FACADE
        for entry in _off_the_facade(module, tree)
    ]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    ("planted", "found"),
    [
        ("async def f(ledger):\n    await asyncio.to_thread(ledger.admit, 1, 2)\n", True),
        ("async def f(self, e):\n    await self._offload(None, self._store.release, e)\n", True),
        ("async def f(self):\n    await asyncio.to_thread(lambda: self._ledger.known(1))\n", True),
        ("async def f(self):\n    return self.ledger.blocking.known(1)\n", True),
        ("async def f(self):\n    return await self.ledger.known(1)\n", False),
        ("def f(self):\n    return self.ledger.blocking.known(1)\n", False),
        ("async def f(inbox):\n    await asyncio.to_thread(inbox.scan, 1)\n", False),
    ],
)
def test_the_facade_check_finds_what_is_planted(planted: str, found: bool) -> None:
    assert bool(_off_the_facade("jobs.planted", ast.parse(planted))) is found
