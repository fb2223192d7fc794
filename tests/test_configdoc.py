"""The configuration documents itself: the example file and docs/configuration.md's key table are
written from the keys' declarations, so a key added, changed or described anew without them fails
here."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

import ocrwatch.config.doc as configdoc
import ocrwatch.config.env as config_env
from ocrwatch import config
from ocrwatch.config.base import Model
from ocrwatch.engines.deepseek.options import VllmConfig
from ocrwatch.engines.tesseract_options import TesseractConfig


def _models(model: type[BaseModel]) -> set[type[BaseModel]]:
    found = {model}
    for field in config_env.fields(model).values():
        inner = config_env.tables(field.annotation) or field.annotation
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            found |= _models(inner)
    return found


def test_the_example_file_is_the_one_the_declarations_write() -> None:
    assert configdoc.EXAMPLE.read_text() == configdoc.example(), (
        "config.example.toml drifted: python -m ocrwatch.config.doc --write"
    )


def test_the_reference_key_table_is_the_one_the_declarations_write() -> None:
    text = configdoc.REFERENCE.read_text()
    assert text.count(configdoc.BEGIN) == 1 and text.count(configdoc.END) == 1
    assert configdoc.reference(text) == text, (
        "docs/configuration.md's key table drifted: python -m ocrwatch.config.doc --write"
    )


def test_the_readme_leaves_the_key_table_to_the_reference() -> None:
    """The README is a first page: the table of every key lives in docs/configuration.md alone."""
    readme = (configdoc.REPO / "README.md").read_text()
    assert configdoc.BEGIN not in readme and "docs/configuration.md" in readme


def test_check_says_which_file_differs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = tmp_path / "config.example.toml"
    stale.write_text(configdoc.example().replace("max_pages = 2000", "max_pages = 1999"))
    monkeypatch.setattr(configdoc, "EXAMPLE", stale)
    assert configdoc.main(["--check"]) == 1
    assert "config.example.toml differs" in capsys.readouterr().out
    assert configdoc.main(["--write"]) == 0
    assert configdoc.main(["--check"]) == 0
    assert stale.read_text() == configdoc.example()


def test_every_key_has_a_description() -> None:
    models = _models(config.Config)
    assert config.S3Config in models and VllmConfig in models and TesseractConfig in models
    missing = [
        f"{model.__name__}.{key}"
        for model in models
        for key, field in model.model_fields.items()
        if not field.exclude and not (field.description or "").strip()
    ]
    assert not missing, missing


def test_a_key_without_a_description_stops_the_generator() -> None:
    class Bare(Model):
        extra_key: int = 1

    with pytest.raises(ValueError, match="extra_key: no description"):
        list(configdoc._keys(Bare, "", off=False))


def test_the_generated_example_loads_as_the_defaults(tmp_path: Path) -> None:
    written = tmp_path / "config.toml"
    written.write_text(configdoc.example())
    loaded = config.load(written, environ={})
    relative = {"state_dir", "inbox"}  # resolved beside the file
    assert loaded.model_dump(exclude=relative) == config.Config().model_dump(exclude=relative)
    assert loaded.state_dir == tmp_path / ".ocrwatch"
    assert loaded.inbox[0].path == tmp_path / "inbox"


def test_every_key_is_in_the_reference_table() -> None:
    table = configdoc.table()
    for key in (
        "`state_dir`",
        "`[engine.vllm] ladder`",
        "`[[s3]] receive_backoff_max_seconds`",
        "`[[hook]] concurrency`",
        "`[engine.tesseract] lang`",
        "`[[inbox]] text`",
    ):
        assert f"| {key} |" in table, key
