"""The files a job is to get: its inbox's or its bucket's ``formats``, else ``[output]``'s; and the
key refused where it leaves out a sidecar."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ocrwatch.config import Config, S3Config, from_mapping
from ocrwatch.errors import ConfigError
from ocrwatch.jobs.steps import job_formats
from ocrwatch.sources.base import Job, LocalFile, S3Object

LAYOUTS = ["md", "json", "alto", "hocr"]


@dataclass
class Bucket:
    """An S3 source as ``job_formats`` asks it (``sources.base.Bucketed``)."""

    cfg: S3Config
    client: Any = None


def config(tmp_path: Path) -> Config:
    return from_mapping(
        {
            "output": {"formats": ["md", "json", "hocr"]},
            "inbox": [
                {"path": str(tmp_path / "plain")},
                {"path": str(tmp_path / "archive"), "formats": LAYOUTS},
            ],
        }
    )


def test_an_inbox_or_a_bucket_stands_for_output(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    plain, archive = (tmp_path / name for name in ("plain", "archive"))
    assert job_formats(cfg, None, Job(LocalFile(plain / "a.pdf", plain), "local")) == (
        "md",
        "json",
        "hocr",
    )
    assert job_formats(cfg, None, Job(LocalFile(archive / "a.pdf", archive), "local")) == tuple(
        LAYOUTS
    )
    obj = Job(S3Object("b", "a.pdf"), "s3")
    own = S3Config(transport="webhook", token="t", formats=["md", "json", "alto"])
    assert job_formats(cfg, Bucket(own), obj) == ("md", "json", "alto")
    assert job_formats(cfg, Bucket(S3Config(transport="webhook", token="t")), obj) == (
        "md",
        "json",
        "hocr",
    )


@pytest.mark.parametrize("formats", [["alto"], ["md", "alto"], ["md", "json", "md"], ["pdf"]])
def test_formats_without_a_sidecar_or_twice_are_refused(formats: list[str]) -> None:
    with pytest.raises(ConfigError, match="formats"):
        from_mapping({"output": {"formats": formats}})
