"""The house style that a formatter can hold: ruff's format and its line limit, on every Python
file.

A line over 100 characters, an unused import or a formatting drift fails here, so a change is
formatted (``ruff format``) before it lands rather than squeezed by hand.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREES = ["ocrwatch", "tests", "bench"]


RUFF = [sys.executable, "-m", "ruff"]  # ruff comes with the test extra


def test_every_file_is_as_ruff_formats_it() -> None:
    run = subprocess.run(
        [*RUFF, "format", "--check", *TREES], cwd=ROOT, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_no_line_is_over_the_limit_and_no_import_is_unused() -> None:
    run = subprocess.run([*RUFF, "check", *TREES], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
