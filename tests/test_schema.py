"""The sidecars' published schemas (docs/schema/): what the code generates, valid, every member
described, and closed where ocrwatch fills the object itself. That every sidecar the suite writes
validates against them is checked where the tests read them (tests/integration/conftest.py's
``sidecars_done`` and ``error_sidecar``, and the CLI's tests)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import structlog

from ocrwatch.engines.base import Recognition
from ocrwatch.engines.tesseract import parse_tsv
from ocrwatch.errors import CorruptPdf
from ocrwatch.pages.orientation import Orientation
from ocrwatch.pages.scheduler import PageOutcome
from ocrwatch.recognize.ladder import PageResult
from ocrwatch.results import assemble, schema
from ocrwatch.sources.base import Job, LocalFile
from tests.conftest import REPO

PUBLISHED = REPO / "docs" / "schema"
TSV = "\n".join(
    [
        "level\tpage_num\tblock_num\tpar_num\tline_num\tword_num\tleft\ttop\twidth\theight\tconf\ttext",
        "5\t1\t1\t1\t1\t1\t100\t100\t200\t40\t96.5\tInvoice",
        "5\t1\t1\t1\t1\t2\t320\t100\t120\t40\t91.0\t4711",
    ]
)


def published(name: str) -> dict[str, Any]:
    return json.loads((PUBLISHED / name).read_text())


def test_the_published_files_are_what_the_code_generates() -> None:
    """Run ``python3 docs/schema/generate.py`` after changing ``ocrwatch/results/schema.py``."""
    assert sorted(path.name for path in PUBLISHED.glob("*.json")) == sorted(schema.FILES)
    for name, text in schema.published().items():
        assert (PUBLISHED / name).read_text() == text, f"docs/schema/{name}: run generate.py"


@pytest.mark.parametrize("name", sorted(schema.FILES))
def test_each_schema_is_valid_and_describes_every_member(name: str) -> None:
    document = published(name)
    jsonschema.Draft202012Validator.check_schema(document)
    members = _members(document, "")
    undescribed = [where for where, member in members if not member.get("description")]
    assert undescribed == []


def _members(node: Any, where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every member a schema names, anywhere in it, with its path."""
    if isinstance(node, dict):
        for name, member in (node.get("properties") or {}).items():
            yield f"{where}.{name}", member
        for key, value in node.items():
            yield from _members(value, f"{where}/{key}" if key != "properties" else where)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _members(value, f"{where}[{index}]")


def sidecar() -> dict[str, Any]:
    """A JSON sidecar as the assembler makes it: a Tesseract page and a failed one."""
    markdown, blocks = parse_tsv(TSV)
    recognition = Recognition(markdown=markdown, raw=markdown, blocks=blocks, finish_reason="stop")
    attempt = {
        "rung": 0,
        "request_id": "j/p0/a0",
        "sampling": {"temperature": 0.0},
        "outcome": "ok",
        "seconds": 0.2,
        "prompt_tokens": None,
        "completion_tokens": None,
        "finish_reason": "stop",
    }
    failed = {"kind": "page_failed", "message": "all rungs failed", "retryable": False, "hint": "h"}
    read, lost = PageResult("ok", recognition, [attempt]), PageResult("failed", None, [], failed)
    pages = [
        PageOutcome(0, 1728, 2244, 204.0, 0.1, read, (), "image", source_dpi=(204.0, 98.0)),
        PageOutcome(1, 1240, 1754, 171.04, 0.1, lost, (), "assumed"),
    ]
    job = Job(origin=LocalFile(Path("/in/scan.tif"), Path("/in")), source="local")
    provenance = assemble.Provenance(
        source=assemble.source_section(job, None, "0" * 64, "image/tiff"),
        engine={"name": "tesseract", "version": "5.3.0", "lang": "eng", "psm": 3, "prompt": ""},
        render={"dpi": 300.0, "max_side": 4096, "max_pixels": 40_000_000},
    )
    return assemble.document(
        provenance,
        pages,
        detected=1.0,
        started=2.0,
        finished=3.0,
        stages={"waiting": 1.0, "pages": 0.5},
    )


def test_an_assembled_sidecar_and_error_sidecar_validate() -> None:
    document = sidecar()
    jsonschema.validate(document, published("sidecar.schema.json"))
    # a fax's two resolutions beside the one its square pixels were read at; none for the other
    assert [page.get("source_dpi") for page in document["pages"]] == [[204.0, 98.0], None]
    job = Job(origin=LocalFile(Path("/in/bad.pdf"), Path("/in")), source="local")
    error = assemble.error_document(
        assemble.source_section(job, None, None, None), CorruptPdf("xref broken").as_dict(), 1, 4.0
    )
    jsonschema.validate(error, published("error.schema.json"))


def script_page(script: str, conf: float) -> PageOutcome:
    """A page OSD found in ``script``, OCR'd in eng with its letters read at ``conf``."""
    markdown, blocks = parse_tsv(TSV.replace("96.5", str(conf)))
    recognition = Recognition(markdown=markdown, raw=markdown, blocks=blocks, lang="eng")
    turned = Orientation(decided_by="osd", detected=0, confidence=3.0, script=script)
    return PageOutcome(
        0, 100, 100, 300.0, 0.1, PageResult("ok", recognition, []), orientation=turned
    )


def test_a_page_in_a_script_no_language_read_makes_its_document_partial() -> None:
    """A Hebrew page read poorly in eng says so with the package, its document is partial, and one
    warning names it; a Latin page OSD misnamed Cyrillic reads confidently and stays ok."""
    job = Job(origin=LocalFile(Path("/in/scan.png"), Path("/in")), source="local")
    provenance = assemble.Provenance(
        source=assemble.source_section(job, None, "0" * 64, "image/png"),
        engine={"name": "tesseract"},
        render={"dpi": 300.0},
    )
    times = {"detected": 1.0, "started": 2.0, "finished": 3.0, "stages": {}}
    with structlog.testing.capture_logs() as logs:
        unread = assemble.document(provenance, [script_page("Hebrew", 20.0)] * 2, **times)
        misnamed = assemble.document(provenance, [script_page("Cyrillic", 95.0)], **times)
    jsonschema.validate(unread, published("sidecar.schema.json"))
    assert (unread["status"], misnamed["status"]) == ("partial", "ok")
    page = unread["pages"][0]
    assert page["lang"] == "eng" and page["orientation"]["script"] == "Hebrew"
    assert page["script_not_installed"]["package"] == "tesseract-ocr-heb"
    assert "install tesseract-ocr-heb" in page["script_not_installed"]["hint"]
    assert "script_not_installed" not in misnamed["pages"][0]
    [warning] = [line for line in logs if line["event"] == "page_script_not_installed"]
    assert warning["packages"] == ["tesseract-ocr-heb"]


@pytest.mark.parametrize(
    "where",
    [
        (),
        ("source",),
        ("render",),
        ("timing",),
        ("ocrwatch",),
        ("pages", 0),
        ("pages", 0, "tokens"),
        ("pages", 0, "tries", 0),
        ("pages", 0, "blocks", 0, "words", 0),
        ("pages", 1, "error"),
    ],
)
def test_a_member_no_schema_describes_is_refused(where: tuple[str | int, ...]) -> None:
    """Where ocrwatch fills the object itself, a new member must come with its description."""
    document = copy.deepcopy(sidecar())
    node: Any = document
    for step in where:
        node = node[step]
    node["undescribed"] = 1
    with pytest.raises(jsonschema.ValidationError, match="undescribed"):
        jsonschema.validate(document, published("sidecar.schema.json"))


def test_what_an_engine_says_of_itself_and_of_a_block_stays_open() -> None:
    document = sidecar()
    document["engine"]["plugin_setting"] = [1, 2]
    document["pages"][0]["blocks"][0]["plugin_score"] = 0.5
    jsonschema.validate(document, published("sidecar.schema.json"))


def test_units_are_stated() -> None:
    """The questions a reader of the JSON asks first: boxes in page pixels, Tesseract's confidence
    0 to 100, the page's inches, what a try is."""
    page = published("sidecar.schema.json")["properties"]["pages"]["items"]["properties"]
    block = page["blocks"]["items"]["properties"]
    assert "page pixels" in block["bbox"]["description"]
    assert (block["conf"]["minimum"], block["conf"]["maximum"]) == (0, 100)
    assert "width / dpi" in page["dpi"]["description"]
    assert "retry ladder" in page["tries"]["items"]["description"]
