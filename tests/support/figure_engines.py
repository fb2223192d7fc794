"""A test engine that answers every page with a recorded DeepSeek-OCR grounding output (the
grounding parser's fixtures), parsed by the real parser for the page it is given: the figures' boxes
land on the real rendered
page, so a daemon can cut them out as it would with the model. Named as a plugin::

    [engine]
    kind = "plugin"
    plugin = "tests.support.figure_engines:RecordedEngine"
    plugin_args = { fixture = "PAPER" }
"""

from __future__ import annotations

from typing import Any

from ocrwatch.engines.base import PageRequest, Recognition
from ocrwatch.engines.deepseek import grounding
from tests import test_grounding
from tests.support.engines_base import StubEngine


class RecordedEngine(StubEngine):
    name = "recorded-deepseek"

    def __init__(self, *, fixture: str = "PAPER", dpi: int = 100, max_concurrency: int = 4) -> None:
        super().__init__(max_concurrency=max_concurrency, dpi=dpi)
        self.fixture = fixture
        self.raw: str = getattr(test_grounding, fixture)

    async def _work(self, page: PageRequest) -> Recognition:
        width, height = page.image.size
        parsed = grounding.parse(
            self.raw, width, height, images="extract", page_index=page.page_index
        )
        return Recognition(
            markdown=parsed.markdown,
            raw=self.raw,
            blocks=parsed.blocks,
            prompt_tokens=1,
            completion_tokens=len(self.raw.split()),
            finish_reason="stop",
        )

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "fixture": self.fixture}
