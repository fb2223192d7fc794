"""Shared fixtures: the corpus of real documents (skipped with a reason where absent)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = [
    "tests.s3servers",
    "tests.rabbitmq",
    "tests.integration.users",
    "tests.xdist_groups",
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
