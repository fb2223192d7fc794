"""Write the sidecars' JSON Schemas into this folder from their one source,
``ocrwatch.results.schema``.

Run after changing a sidecar's members: ``python3 docs/schema/generate.py``; a test fails while the
files here differ from what the code generates.
"""

from __future__ import annotations

from pathlib import Path

from ocrwatch.results.schema import published


def main() -> None:
    here = Path(__file__).resolve().parent
    for name, text in published().items():
        (here / name).write_text(text, encoding="utf-8")
        print(f"wrote {here / name}")


if __name__ == "__main__":
    main()
