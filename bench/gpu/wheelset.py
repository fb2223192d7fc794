"""The device wheel set, derived from ``pyproject.toml``: what ``prepare.sh wheels`` downloads for
ocrwatch itself, and the check that nothing the package needs at run time is missing from what it
packed.

The GPU image already holds torch, NumPy, Pillow and many more (``image-packages.txt``, read off a
machine of that image); every other runtime dependency of the package (``[project] dependencies``
and the ``vllm`` extra, markers evaluated for CPython 3.12 on x86-64 Linux) must travel. A hand-kept
list missed ``pikepdf`` once and every daemon run died at import, so the list is computed here and
checked against the downloaded wheels.

    python3 bench/gpu/wheelset.py requirements
        requirement lines to download (pip -r), vLLM aside
    python3 bench/gpu/wheelset.py lock WHEEL_DIR
        the pins of what pip resolved from those lines, less what the image holds: deps-ocrwatch.txt
    python3 bench/gpu/wheelset.py check WHEEL_DIR [...]
        exit 1, naming them, if a runtime dependency of the package (and, as far as this machine's
        installed metadata shows, of those) is in none of the folders and not on the image
"""

from __future__ import annotations

import importlib.metadata as md
import re
import sys
from collections.abc import Iterable
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from packaging.markers import default_environment
from packaging.requirements import Requirement

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
IMAGE = HERE / "image-packages.txt"
EXTRAS = ("vllm",)
# The device: CPython 3.12 on x86-64 Linux, whatever machine prepares the set.
TARGET = {
    **default_environment(),
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
}


def canonical(name: str) -> str:
    """PEP 503's normal form, so ``Pillow``, ``pillow`` and a wheel file's ``pillow`` compare
    equal."""
    return re.sub(r"[-_.]+", "-", name).lower()


def applies(req: Requirement, extra: str = "") -> bool:
    """Whether ``req`` is needed on the device (its marker evaluated there, with ``extra`` asked
    for)."""
    return req.marker is None or req.marker.evaluate({**TARGET, "extra": extra})


def runtime_requirements(
    pyproject: Path = REPO / "pyproject.toml", extras: Iterable[str] = EXTRAS
) -> list[Requirement]:
    """The package's own dependencies and those of ``extras`` that apply on the device."""
    project = tomllib.loads(pyproject.read_text())["project"]
    reqs = [Requirement(line) for line in project.get("dependencies", [])]
    for extra in extras:
        reqs += [
            Requirement(line) for line in project.get("optional-dependencies", {}).get(extra, [])
        ]
    return [req for req in reqs if applies(req)]


def image_packages(path: Path = IMAGE) -> set[str]:
    """The distributions the device image holds already (one a line, ``#`` comments)."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return {canonical(line) for line in lines if line}


def to_download(reqs: Iterable[Requirement], image: set[str]) -> list[Requirement]:
    """What must travel: every requirement not on the image; vLLM itself is downloaded (and slimmed)
    apart."""
    return [
        req for req in reqs if canonical(req.name) not in image and canonical(req.name) != "vllm"
    ]


def closure(reqs: Iterable[Requirement], stop: set[str]) -> set[str]:
    """``reqs`` and, for each one installed on this machine, its own requirements, recursively,
    without descending into ``stop`` (what the image or vLLM's pinned set already brings with its
    own needs)."""
    seen: set[str] = set()
    todo = list(reqs)
    while todo:
        req = todo.pop()
        name = canonical(req.name)
        if name in seen:
            continue
        seen.add(name)
        if name in stop:
            continue
        try:
            needs = md.requires(req.name) or []
        except md.PackageNotFoundError:
            continue
        todo += [sub for sub in map(Requirement, needs) if applies(sub)]
    return seen


def wheel_names(folders: Iterable[Path]) -> set[str]:
    """The projects of the wheels in ``folders`` (``name-version-...whl``) and of pinned lists
    (``name==v``)."""
    names: set[str] = set()
    for folder in folders:
        if folder.is_file():
            lines = (line.split("#", 1)[0].strip() for line in folder.read_text().splitlines())
            names |= {canonical(Requirement(line).name) for line in lines if line}
            continue
        names |= {canonical(wheel.name.split("-", 1)[0]) for wheel in folder.glob("*.whl")}
    return names


def lock(folder: Path, image: set[str]) -> list[str]:
    """``name==version`` for every wheel in ``folder`` that the image lacks, sorted by name."""
    pins = {}
    for wheel in folder.glob("*.whl"):
        name, version = wheel.name.split("-")[:2]
        if canonical(name) not in image:
            pins[canonical(name)] = f"{name}=={version}"
    return [pins[name] for name in sorted(pins)]


LOCK_HEADER = """# ocrwatch's runtime dependencies that the GPU image lacks, as pip resolved them from pyproject.toml (its
# dependencies and the vllm extra) for CPython 3.12: written by `bash bench/gpu/prepare.sh wheels`
# (wheelset.py lock), checked by tests/test_gpu_wheelset.py. Do not edit by hand: change pyproject.toml, then
# prepare again."""  # noqa: E501 - the lock file's own header, as committed


def missing(have: set[str], image: set[str], reqs: list[Requirement] | None = None) -> list[str]:
    """Runtime dependencies of the package found neither in ``have`` (the wheel set) nor on the
    image."""
    reqs = runtime_requirements() if reqs is None else reqs
    needed = closure(reqs, stop=image | {"vllm", "torch"})
    return sorted(needed - have - image)


def main(argv: list[str]) -> int:
    if argv[:1] == ["requirements"]:
        print("\n".join(str(req) for req in to_download(runtime_requirements(), image_packages())))
        return 0
    if argv[:1] == ["lock"] and len(argv) == 2:
        print("\n".join([LOCK_HEADER, *lock(Path(argv[1]), image_packages())]))
        return 0
    if argv[:1] == ["check"] and len(argv) > 1:
        lost = missing(wheel_names(Path(arg) for arg in argv[1:]), image_packages())
        if lost:
            print(
                f"runtime dependencies missing from the device wheel set: {', '.join(lost)}",
                file=sys.stderr,
            )
            return 1
        print("device wheel set: every runtime dependency is packed or on the image")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
