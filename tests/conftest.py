"""Shared fixtures: the corpus of real documents (skipped with a reason where absent)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = [
    "tests.support.s3servers",
    "tests.support.rabbitmq",
    "tests.support.users",
    "tests.support.xdist_groups",
]

REPO = Path(__file__).resolve().parent.parent


def corpus_path() -> Path | None:
    candidate = Path(os.environ.get("OCRWATCH_CORPUS", REPO.parent / "shared" / "corpus"))
    return candidate if (candidate / "manifest.json").is_file() else None


@pytest.fixture(scope="session")
def corpus_dir() -> Path:
    path = corpus_path()
    if path is None:
        pytest.skip("corpus absent: set OCRWATCH_CORPUS or place it at ../shared/corpus")
    return path


@pytest.fixture(scope="session")
def manifest(corpus_dir: Path) -> list[dict[str, Any]]:
    return json.loads((corpus_dir / "manifest.json").read_text())


SLOW_FIXTURES = {"corpus_dir", "manifest", "moto_server", "moto", "rgw"}
"""What makes a unit test slow: the corpus (Tesseract over real documents), the S3 servers."""

SLOW_MODULES = {"test_cli.py", "test_cli_pipes.py"}
"""Unit tests that run ``ocrwatch`` as a process, one engine start each."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks ``slow`` what the README's quick subset (``-m "not integration and not slow"``) leaves
    out, so it stays a few minutes on 2 cores while the whole suite runs it all."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        s3 = item.get_closest_marker("s3") is not None
        if fixtures & SLOW_FIXTURES or s3 or item.path.name in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
