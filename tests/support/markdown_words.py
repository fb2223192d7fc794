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
    """The words a reader sees in ``markdown``'s rendering: a numbered list's numbers as a browser
    shows them (its start, counted up, each with a ``.``), a bullet as no word."""
    lists: list[int | None] = []  # the next number of each open list, None for a bulleted one

    def shown(tag: re.Match[str]) -> str:
        text = tag.group()
        if text.startswith(("<ol", "<ul")):
            start = re.search(r'start="([0-9]+)"', text)
            lists.append(None if text.startswith("<ul") else int(start.group(1)) if start else 1)
        elif text in ("</ol>", "</ul>"):
            lists.pop()
        elif text.startswith("<li") and lists and lists[-1] is not None:
            number = lists[-1]
            lists[-1] = number + 1
            return f" {number}. "
        return " "

    return html.unescape(_TAG.sub(shown, _RENDERER.render(markdown))).split()


def words(text: str) -> list[str]:
    return text.split()
