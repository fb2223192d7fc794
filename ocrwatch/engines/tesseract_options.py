"""``[engine.tesseract]``: the Tesseract engine's options, the table its spec brings (``options``);
config validates ``[engine.tesseract]`` through it without importing it."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ocrwatch.config.base import Lang, no_zero_for_auto


class TesseractConfig(BaseModel):
    """The Tesseract engine's options."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lang: Lang = Field(
        "auto",
        description=(
            'Tesseract language packs joined with "+", e.g. "eng+deu" (install tesseract-ocr-deu);'
            ' "auto": each page in the installed language of the script orientation detection'
            " finds on it, eng for Latin; a page of a script no installed language reads is read"
            " in eng, its sidecar names the package to install and, where it reads poorly, the"
            " document is partial. With [render] rotate_pages off, auto reads every page in eng."
        ),
    )
    dpi: Annotated[int, Field(ge=70, le=600)] = Field(
        300,
        description=(
            "The resolution pages are rendered at for Tesseract, which reads best at about 300 DPI."
        ),
    )
    psm: Annotated[int, Field(ge=0, le=13)] = Field(
        3, description=("Page segmentation mode; 3 = fully automatic.")
    )
    workers: Annotated[int, Field(ge=1, le=256)] | Literal["auto"] = Field(
        "auto",
        description=(
            'Pages OCRed at once; "auto" = one per CPU core (each Tesseract limited to one thread).'
            " 0, its old spelling, is refused."
        ),
    )

    _old_auto = field_validator("workers", mode="before")(no_zero_for_auto)
    binary: str = Field("tesseract", description="The Tesseract executable.")
