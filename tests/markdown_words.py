"""What a Markdown renderer makes of a text, as words: the check that escaped text reads as it was
written.

CommonMark as markdown-it-py renders it, with GFM's tables and strikethrough switched on (what
GitHub and most viewers add), then the HTML's tags stripped and its entities decoded.
"""

from __future__ import annotations

import html
import re

from markdown_it import MarkdownIt

_RENDERER = MarkdownIt("commonmark").enable(["table", "strikethrough"])
_TAG = re.compile(r"<[^>]*>")


def rendered_words(markdown: str) -> list[str]:
    """The words a reader sees in ``markdown``'s rendering."""
    return html.unescape(_TAG.sub(" ", _RENDERER.render(markdown))).split()


def words(text: str) -> list[str]:
    return text.split()
