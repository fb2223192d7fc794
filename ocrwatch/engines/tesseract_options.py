"""``[engine.tesseract]``: the Tesseract engine's options. Pydantic only: ``config`` composes this model into
``[engine]``, so it sits at the bottom of the layers with it."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

Lang = Annotated[str, Field(pattern=r"^[A-Za-z0-9_]+(/[A-Za-z0-9_]+)?(\+[A-Za-z0-9_]+(/[A-Za-z0-9_]+)?)*$")]
"""Tesseract language data joined with ``+`` (``eng``, ``deu+eng``, ``script/Latin``): names only, so a value
can never read as one of Tesseract's options."""


class TesseractConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    lang: Lang = "eng"
    dpi: Annotated[int, Field(ge=70, le=600)] = 300
    psm: Annotated[int, Field(ge=0, le=13)] = 3
    workers: Annotated[int, Field(ge=0, le=256)] = 0
    binary: str = "tesseract"
