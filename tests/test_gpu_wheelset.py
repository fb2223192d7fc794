"""The device wheel set (bench/gpu/wheelset.py) against the package's runtime dependencies.

``deps-ocrwatch.txt`` is written by ``prepare.sh wheels`` from pyproject.toml; a dependency added to
pyproject.toml without preparing again, or a transitive one the image lacks, fails here on the CPU,
before a device run dies at import (``ModuleNotFoundError: No module named 'pikepdf'`` was seen
there).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent
GPU = REPO / "bench/gpu"
spec = importlib.util.spec_from_file_location("wheelset", GPU / "wheelset.py")
assert spec is not None and spec.loader is not None
wheelset = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wheelset)

LISTS = [GPU / "deps-ocrwatch.txt", GPU / "deps-vllm.txt", GPU / "deps-bench.txt"]
# deps-ocrwatch.txt as it was kept by hand before pikepdf joined pyproject.toml's dependencies.
HAND_KEPT = (
    "structlog==26.1.0\nwatchdog==7.1.0\ntenacity==9.2.1\npdf2image==1.17.0\nboto3==1.43.11\n"
    "botocore==1.43.11\ns3transfer==0.17.0\npypdfium2==5.15.2\n"
)


def packed(lists: list[Path]) -> set[str]:
    """The wheel set the lists give, with vLLM itself (prepare.sh downloads it by version,
    ``VLLM``)."""
    return wheelset.wheel_names(lists) | {"vllm"}


def test_every_runtime_dependency_is_packed_or_on_the_image() -> None:
    assert wheelset.missing(packed(LISTS), wheelset.image_packages()) == []


def test_the_hand_kept_list_misses_pikepdf(tmp_path: Path) -> None:
    old = tmp_path / "deps-ocrwatch.txt"
    old.write_text(HAND_KEPT)
    have = packed([old, GPU / "deps-vllm.txt"])
    assert "pikepdf" in wheelset.missing(have, wheelset.image_packages())


def test_a_new_dependency_in_pyproject_is_missing_until_prepared(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    text = (
        (REPO / "pyproject.toml")
        .read_text()
        .replace('"pikepdf>=10.9",', '"pikepdf>=10.9",\n    "zstandard>=0.23",')
    )
    pyproject.write_text(text)
    reqs = wheelset.runtime_requirements(pyproject)
    assert "zstandard>=0.23" in {
        str(req) for req in wheelset.to_download(reqs, wheelset.image_packages())
    }
    assert wheelset.missing(packed(LISTS), wheelset.image_packages(), reqs) == ["zstandard"]


def test_requirements_are_read_for_the_device_not_this_machine() -> None:
    reqs = {str(req).split(";")[0] for req in wheelset.runtime_requirements()}
    assert "watchdog>=7.0" in reqs and "watchdog>=6.0" not in reqs  # CPython 3.12 there
    assert not any(req.startswith("tomli") for req in reqs)
    assert {"vllm<0.33,>=0.26", "nvidia-ml-py>=12.0"} <= reqs  # the vllm extra
    download = {
        Requirement(str(req)).name
        for req in wheelset.to_download(wheelset.runtime_requirements(), wheelset.image_packages())
    }
    assert "pikepdf" in download and "vllm" not in download and "torch" not in download
    assert "pillow" not in {name.lower() for name in download}


def test_the_lock_pins_what_the_image_lacks(tmp_path: Path) -> None:
    for name in (
        "pikepdf-10.18.0-cp312-cp312-manylinux_2_28_x86_64.whl",
        "pillow-13.0.0-cp312-cp312-x.whl",
        "typing_inspection-0.4.5-py3-none-any.whl",
    ):
        (tmp_path / name).write_text("")
    assert wheelset.lock(tmp_path, wheelset.image_packages()) == [
        "pikepdf==10.18.0",
        "typing_inspection==0.4.5",
    ]
