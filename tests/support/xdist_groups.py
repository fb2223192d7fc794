"""``xdist_group`` marks kept under pytest-xdist's ``--dist loadgroup``, whatever pytest's version.

xdist 3.8 groups a test by renaming it (``item._nodeid`` gets ``@group``); from pytest 9.2 a node's
id is no longer read from that attribute, so the rename does nothing and a group's tests are spread
over the workers as if unmarked. Here each worker writes the group of every test it collected into a
folder the controller made, and the controller's scheduler reads them: one group, one worker.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

_FOLDER = pytest.StashKey[Path]()
_WORKER_INPUT = "ocrwatch_xdist_groups"


def group_of(item: pytest.Item) -> str | None:
    """The item's group as xdist names it: its ``xdist_group`` names, sorted and joined by ``_``."""
    names = {
        str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
        for mark in item.iter_markers("xdist_group")
    }
    return "_".join(sorted(names)) or None


@pytest.hookimpl(trylast=True)  # after xdist's, which registers its controller ("dsession")
def pytest_configure(config: pytest.Config) -> None:
    """The controller of a ``--dist loadgroup`` run makes the folder the workers write to."""
    if config.pluginmanager.hasplugin("dsession") and config.getvalue("dist") == "loadgroup":
        config.stash[_FOLDER] = Path(tempfile.mkdtemp(prefix="ocrwatch-xdist-groups-"))


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_FOLDER, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Tell a starting worker where to write its groups."""
    folder = node.config.stash.get(_FOLDER, None)
    if folder is not None:
        node.workerinput[_WORKER_INPUT] = str(folder)


@pytest.hookimpl(
    trylast=True
)  # after every hook that adds a mark (tests/support/s3servers.py adds rgw's)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A worker writes ``{nodeid: group}`` before it reports its collection, so the file is complete
    before the controller schedules."""
    workerinput = getattr(config, "workerinput", {})
    folder = workerinput.get(_WORKER_INPUT)
    if folder is None:
        return
    groups = {item.nodeid: group for item in items if (group := group_of(item))}
    path = Path(folder) / f"{workerinput['workerid']}.json"
    path.with_suffix(".tmp").write_text(json.dumps(groups))
    os.replace(path.with_suffix(".tmp"), path)


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # before xdist's own: the first answer wins
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's group scheduling, with the groups the workers wrote."""
    folder = config.stash.get(_FOLDER, None)
    if folder is None:
        return None
    from xdist.scheduler import LoadGroupScheduling  # only xdist calls this hook

    class MarkedGroups(LoadGroupScheduling):  # type: ignore[misc]
        """A group's tests in one work unit, named after the group; the others as xdist has them."""

        def __init__(self, config: pytest.Config, log: Any) -> None:
            super().__init__(config, log)
            self.groups: dict[str, str] = {}

        def schedule(self) -> None:
            for path in folder.glob("*.json"):
                self.groups.update(json.loads(path.read_text()))
            super().schedule()

        def _split_scope(self, nodeid: str) -> str:
            return self.groups.get(nodeid) or str(super()._split_scope(nodeid))

    return MarkedGroups(config, log)
